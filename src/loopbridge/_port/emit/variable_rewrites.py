"""`self.param` and `self.variable` as the NNX Variables the port holds (each function a
`Rewriter` method, bound in its class body): built in `__init__` or made on first use,
read as values where setup computed with them."""

from __future__ import annotations

import typing as tp

from flax.core import meta

from ..plan.linen_api import VARIABLE_TYPES
from ..plan.names import available
from ..plan.source import libcst, self_target
from ..transforms import axes_params, custom_collections, lazy_variables, partitioned_inits
from .literals import string_literal

# `rewrite_methods.Rewriter`, whose methods these are; typed loosely so this module stays below it.
Rewriter = tp.Any


def _param(self: Rewriter, site, original, updated):
  c = libcst()
  args = original.args
  if site.target == axes_params.KIND:
    args, why = axes_params.positional(args)
    if why is not None:
      self._mark(why)
      return updated
  name = string_literal(args[0].value) if args else None
  if name is None or len(args) < 2:
    self._mark("self.param without a literal name and an initializer")
    return updated
  computed = None
  if self.method == "setup" and not isinstance(
    self.p.parents.get(original), (c.Assign, c.AnnAssign)
  ):
    # Dinov2's `self.lambda1 = c * self.param("lambda1", ...)`: Linen stores the Param and
    # setup's attribute is an array computed from it; written in place, the port's
    # attribute would hold the array and no Param (its checkpoint has nowhere to go). At
    # the top of setup, the Param is kept and the arithmetic becomes a property
    # (`computed_params.py`); anywhere else, a TODO.
    computed = self._computed_attribute(original)
    if computed is None:
      self._mark(
        f"self.param({name!r}, ...) inside an expression in setup: keep the Param as "
        f"self.{name} = nnx.Param(...) and compute the expression where it is read"
      )
      return updated
  init = self.p.rewrite_expr(self.p.code(args[1].value))
  every = [*self.p.instances, *(i for a in self.p.resolver.alts for i in a.values())]
  if partitioned_inits.boxed(every, "params", name):
    init = partitioned_inits.unboxed_init(self.p, init, site.lines, site.method)
  elif not isinstance(args[1].value, (c.Name, c.Attribute, c.Call, c.Subscript)):
    # `lambda _, shape: jnp.ones(shape)` (HF's RMSNorm) is called, not made the Param.
    init = f"({init})"
  rest = [a.value for a in args[2:]]
  ns = self.p.init_namespace
  # Arguments that read the call (`x.shape[-1]`, `x.dtype`) take the traced value instead:
  # the shape and dtype of the variable Linen created, per instance.
  made = {
    i.path: meta.unbox(i.variables[("params", name)])
    for i in self.p.instances
    if ("params", name) in i.variables
  }
  # Made only in other configurations (a branch the user's does not take, as big_vision's
  # `cls` token under `pool_type == "tok"`): their values are the evidence.
  made_elsewhere = any(
    ("params", name) in i.variables for a in self.p.resolver.alts for i in a.values()
  )
  traced = [
    lambda v: tuple(v.shape),  # init(key, shape, ...)
    lambda v: v.dtype,  # init(key, shape, dtype)
  ]
  init_args = []
  for i, a in enumerate(rest):
    if available(a, ns, set()):
      init_args.append(self.p.rewrite_expr(self.p.code(a)))
    elif (inlined := self._through_aliases(a, site.method)) is not None:
      # The user's own expression, its locals inlined (ViT's `(1, num_patches + 1, hidden)`):
      # right at every configuration, where a traced shape is one instance's.
      init_args.append(inlined)
    elif i < len(traced) and (made or made_elsewhere):
      values = {p: traced[i](v) for p, v in made.items()}
      alt = self.p.alt_own(
        lambda inst, f=traced[i]: f(meta.unbox(inst.variables[("params", name)]))
      )
      # A shape read from the call is the input's: one no field explains is an argument.
      hint = f"{name}_{('shape', 'dtype')[i]}"
      init_args.append(self.p.resolver.expr(values, hint, alt, from_input=i == 0))
    else:
      self._mark(f"self.param({name!r}, ...) has arguments that depend on the call")
      return updated
  decl = f"nnx.Param({init}(rngs.params(), {', '.join(init_args)}))"
  if computed is not None:
    self.p.port.computed[computed] = name
    self.p.port.attributes[name] = self.p.src.line(site.lines[0])
    self.p.change(
      site.lines,
      self.p.code(original),
      f"self.{name} = {decl}",
      f"a Linen param setup computes self.{computed} from: the Param is kept, the "
      "arithmetic is a property",
    )
    return c.parse_expression(decl)
  self.p.declare(site, name, decl)
  self.p.change(
    site.lines,
    self.p.code(original),
    f"self.{name} = {decl}",
    "a Linen param becomes an nnx.Param built in __init__",
  )
  if site.setup_attr is not None or self._setup_assign(original):
    return c.parse_expression(decl)
  return c.parse_expression(self.p.value_access(name))


def _computed_attribute(self: Rewriter, original) -> str | None:
  """`A` when `original` is inside the value of `self.A = ...`, a line of setup's own body
  (not under an `if` or a loop); else None."""
  c = libcst()
  node: tp.Any = original
  while node is not None and not isinstance(node, c.SimpleStatementLine):
    node = self.p.parents.get(node)
  if node is None:
    return None
  block: tp.Any = self.p.parents.get(node)
  fn: tp.Any = self.p.parents.get(block) if block is not None else None  # its owner
  if not (isinstance(fn, c.FunctionDef) and fn.name.value == "setup"):
    return None
  return self_target(node)


def _setup_assign(self: Rewriter, original) -> bool:
  return self.method == "setup"


def _variable(self: Rewriter, site, original, updated):
  c = libcst()
  args = original.args
  col = string_literal(args[0].value) if args else None
  name = string_literal(args[1].value) if len(args) > 1 else None
  if col is None or name is None or len(args) < 3:
    self._mark("self.variable without a literal collection, name and init function")
    return updated
  kind = VARIABLE_TYPES.get(col)
  own = custom_collections.type_name(col) if kind is None else None
  if kind is None and own is None:
    self._mark(f"a variable of the collection {col!r} (no NNX Variable type is drafted for it)")
    return updated
  ns = self.p.init_namespace
  rest = [a.value for a in args[3:]]
  late = name in self.late and self.method != "setup"
  if not late and not all(available(a, ns, set()) for a in [args[2].value, *rest]):
    self._mark(f"self.variable({col!r}, {name!r}, ...) has arguments that depend on the call")
    return updated
  fn_node = args[2].value
  if isinstance(fn_node, c.Lambda) and not fn_node.params.params and not rest:
    value = self.p.rewrite_expr(self.p.code(fn_node.body))  # `lambda: zeros(...)`: the value
  else:
    fn = self.p.rewrite_expr(self.p.code(fn_node))
    fn = f"({fn})" if isinstance(fn_node, c.Lambda) else fn
    value = f"{fn}({', '.join(self.p.rewrite_expr(self.p.code(a)) for a in rest)})"
  if own is not None:
    self.p.ctx.collections.add(col)  # declared once, before the classes (`draft.py`)
  qualified = f"nnx.{kind}" if own is None else own
  decl = f"{qualified}({value})"
  if late:
    return self._made_on_first_use(site, original, name, decl, col, qualified)
  self.p.declare(site, name, decl)
  self.p.change(
    site.lines,
    self.p.code(original),
    f"self.{name} = {decl}",
    f"a Linen {col} variable becomes {'an' if own is None else 'a'} {qualified} built in __init__",
  )
  if self.method == "setup":
    return c.parse_expression(decl)
  assign: tp.Any = self.p.parents.get(original)
  if isinstance(assign, c.Assign) and isinstance(assign.targets[0].target, c.Name):
    self.local_vars.add(assign.targets[0].target.value)
  return c.parse_expression(f"self.{name}")


def _made_on_first_use(self: Rewriter, site, original, name: str, decl: str, col: str, kind: str):
  c = libcst()
  unit = self.p.module.default_indent
  self.before.setdefault(id(self.stack[-1]), []).append(lazy_variables.creation(name, decl, unit))
  self.p.port.attributes[name] = self.p.src.line(site.lines[0])
  self.p.change(
    site.lines,
    self.p.code(original),
    f'if not hasattr(self, "{name}"): self.{name} = {decl}',
    f"Linen makes this {col} variable in the call, sized by the call or beside one that "
    f"is: an {kind} attribute the method makes on first use",
  )
  assign: tp.Any = self.p.parents.get(original)
  if isinstance(assign, c.Assign) and isinstance(assign.targets[0].target, c.Name):
    self.local_vars.add(assign.targets[0].target.value)
  return c.parse_expression(f"self.{name}")
