"""Rewrite a planned class: its methods (sites replaced) and its new `__init__`.

One libcst transformer applies the plan of `rewrite_class.Planner`: a construction becomes the
attribute `__init__` builds, `self.param`/`self.variable` the NNX Variable, a Linen idiom the NNX
one, and anything the plan marked untranslatable turns its whole statement into a TODO block
that keeps the original lines and raises, so a port with a TODO can never pass its check.
"""

from __future__ import annotations

import dataclasses
import functools
import typing as tp

from flax.core import meta

from . import lazy_variables, standard_layers
from .cell_carry import carry_call
from .chosen_class import guard
from .emit import construction
from .factory_fields import signature_and_init
from .hoist import Hoist
from .layer_subclass import (
  abstract_counterpart,
  flax_layer_base,
  inherited_default,
  subclassable,
)
from .linen_api import VARIABLE_TYPES
from .literals import string_literal
from .module_handed_out import linen_api_used
from .names import available, inline_aliases, loop_targets, names_in
from .records import Todo
from .removed_lines import removed_line
from .rewrite_class import ClassPort, Context, Planner
from .scanned_method import lifted_method, linen_lift
from .source import ClassSource, dotted, libcst, resolve, self_target
from .todo_blocks import todo_block
from .transforms import call_time_args
from .transforms.field_defaults import default_text
from .transforms.none_before_a_layer import data_placeholder
from .transforms.tied_embeddings import apply_with_params, built_where_called, variables_read

if tp.TYPE_CHECKING:
  import libcst as cst


def _loop_index(planner: Planner, loop: tp.Any) -> tuple[str, str | None]:
  """The loop's index name, and its new `enumerate` header target (None: header unchanged)."""
  c = libcst()
  it: tp.Any = loop.iter
  if (
    isinstance(loop.target, c.Name)
    and isinstance(it, c.Call)
    and dotted(it.func) == "range"
    and len(it.args) == 1
  ):
    return loop.target.value, None
  taken = set(planner.src.namespace) | loop_targets(loop) | set(planner.counter_names)
  name = "layer"
  while name in taken:
    name += "_"
  planner.counter_names.append(name)  # a running counter of the same loop must not take it
  target = planner.code(loop.target)
  if isinstance(loop.target, c.Tuple) and not loop.target.lpar:
    target = f"({target})"  # `for i, f in ...` -> `for layer, (i, f) in enumerate(...)`
  return name, f"{name}, {target}"


class Rewriter:
  """Applies the plan to the class's methods (and to `setup`, whose body moves to `__init__`).

  The methods of a libcst `CSTTransformer`, joined to that base only when drafting runs
  (`_transformer`): a base named here would import libcst with the package.
  """

  def __init__(self, planner: Planner, loops: dict[int, tuple[str, str | None]]):
    super().__init__()
    self.p = planner
    self.loops = loops
    self.stack: list[cst.CSTNode] = []
    self.marks: dict[int, list[str]] = {}
    self.param_attrs: dict[str, str] = {}  # setup attribute -> param name (read as a value)
    self.var_attrs: dict[str, str] = {}  # setup attribute -> variable name (a Variable)
    self.method = ""
    self.original_fn: tp.Any = None  # the method being finished (its reads before the rewrite)
    self.local_vars: set[str] = set()  # locals holding a variable (`v = self.variable(...)`)
    self.declared = lazy_variables.declared(planner.sites)
    # Variables a method makes on first use (sized by the call), and the statements creating
    # them, by id of the statement they go before.
    self.late = lazy_variables.made_on_first_use(planner.sites, planner.init_namespace)
    self.before: dict[int, list[tp.Any]] = {}
    self.reads = lazy_variables.variable_reads(planner.sites, planner.parents, self.declared)
    self.read_of = {id(outer): name for outer, name in self.reads.values()}

  # --- statements: a TODO replaces the innermost statement holding an untranslated site ---

  def _push(self, node) -> bool:
    self.stack.append(node)
    return True

  def _pop(self, original, updated):
    c = libcst()
    self.stack.pop()
    reasons = self.marks.pop(id(original), None)
    before = self.before.pop(id(original), [])
    if reasons:
      return self._todo_block(original, reasons)
    if before:
      # The statement's comments stay above the lines that now open it.
      before[0] = before[0].with_changes(leading_lines=updated.leading_lines)
      updated = updated.with_changes(leading_lines=[])
    counter = self.p.increments.get(id(original))
    after = [c.parse_statement(f"{counter} += 1\n")] if counter is not None else []
    if before or after:
      return c.FlattenSentinel([*before, updated, *after])
    return updated

  def _todo_block(self, original, reasons: list[str]):
    pos = self.p.positions[original]
    code = self.p.code(original).strip("\n")
    line = self.p.src.line(pos.start.line)
    reason = "; ".join(dict.fromkeys(reasons))
    self.p.port.todos.append(Todo(self.p.src.file, line, reason, code))
    return todo_block(reason, code, self.p.src.file, line)

  def _mark(self, reason: str) -> None:
    self.marks.setdefault(id(self.stack[-1]), []).append(reason)

  visit_SimpleStatementLine = _push
  leave_SimpleStatementLine = _pop
  visit_For = _push
  visit_If = _push
  leave_If = _pop
  visit_While = _push
  leave_While = _pop
  visit_With = _push
  leave_With = _pop

  def leave_For(self, original, updated):
    counters = self.p.counter_inits.get(id(original))
    if counters:
      done = self._leave_for(original, updated)
      if isinstance(done, libcst().For):
        starts = [libcst().parse_statement(f"{counter} = 0\n") for counter in counters]
        return libcst().FlattenSentinel([*starts, done])
      return done
    return self._leave_for(original, updated)

  def _leave_for(self, original, updated):
    loop = self.loops.get(id(original))
    if loop is not None and loop[1] is not None:
      c = libcst()
      updated = updated.with_changes(
        target=c.parse_expression(loop[1]),
        iter=c.parse_expression(f"enumerate({self.p.code(original.iter)})"),
      )
    return self._pop(original, updated)

  def visit_FunctionDef(self, node) -> bool:
    self.method = node.name.value
    return True

  def leave_FunctionDef(self, original, updated):
    self.original_fn = original
    kept = []
    for orig, d in zip(original.decorators, updated.decorators):
      name = dotted(orig.decorator) or ""
      if name.split(".")[0] in self.p.ctx.linen_names and name.endswith((".compact", ".nowrap")):
        pos = self.p.positions[orig]
        self.p.change(
          pos.start.line,
          f"@{name}",
          "(removed)",
          "NNX builds submodules in __init__; methods are plain methods",
        )
        continue
      lift = linen_lift(orig, self.p.src.namespace)
      if lift is not None:
        lifted = lifted_method(self.p, updated, orig, lift)
        if isinstance(lifted, str):
          # The method as Linen wrote it, kept in a TODO block: no Linen transform runs on
          # an NNX module.
          todo = self._todo_block(original, [lifted])
          return updated.with_changes(decorators=[], body=libcst().IndentedBlock(body=[todo]))
        updated = lifted
        continue
      kept.append(d)
    updated = updated.with_changes(decorators=kept)
    added = self.p.port.threaded.get(original.name.value, {})
    if added:
      c = libcst()
      params = updated.params
      new = [
        c.Param(c.Name(n), default=c.Name("None"), equal=c.AssignEqual())
        for n in added
        if n not in {p.name.value for p in [*params.params, *params.kwonly_params]}
      ]
      star = (
        params.star_arg if isinstance(params.star_arg, (c.Param, c.ParamStar)) else c.ParamStar()
      )
      updated = updated.with_changes(
        params=params.with_changes(star_arg=star, kwonly_params=[*params.kwonly_params, *new])
      )
      for n, field in added.items():
        self.p.change(
          self.p.positions[original].start.line,
          f"self.{field}(...)",
          f"{n}= call argument",
          f"Linen bound {n} through the factory field {field}; NNX takes it at the call",
        )
    return self._drop_moved_aliases(updated)

  def _drop_moved_aliases(self, fn):
    """Remove lines only the moved constructions read, then mark loop targets left unread.

    `init = nn.with_...(...)`, `conv = partial(nn.Conv, ...)` and the loop's `strides = ...`
    now run in `__init__`; a line with a comment above it is kept (the comment with it). A
    loop target no longer read becomes `_name` (what linters expect of an unused target).
    """
    c = libcst()
    method = fn.name.value
    moved = {n for n in self.p.aliases.get(method, {}) if n in self.p.used_aliases}
    moved |= {local for m, local in self.p.partials if m == method}
    moved |= set().union(
      *[
        self.p.scope_names[id(h.site.node)] - loop_names(h.site.loops)
        for h in self.p.counter_plans.values()
        if h.site.method == method
      ]
    )

    def reads(node) -> dict[str, int]:
      counts: dict[str, int] = {}

      class Reads(c.CSTVisitor):
        def visit_Attribute(self, attribute) -> bool:
          attribute.value.visit(self)  # `self.conv` reads `self`, not a name `conv`
          return False

        def visit_Arg(self, arg) -> bool:
          arg.value.visit(self)  # `max_pool(x, strides=s)` reads `s`, not a name `strides`
          return False

        def visit_Name(self, name) -> None:
          counts[name.value] = counts.get(name.value, 0) + 1

      node.visit(Reads())
      return counts

    outer = self

    class Drop(c.CSTTransformer):
      def leave_SimpleStatementLine(self, original, updated):
        body = updated.body[0]
        if isinstance(body, c.Assign) and isinstance(body.targets[0].target, c.Name):
          name = body.targets[0].target.value
          if (
            name in moved
            and counts.get(name, 0) == 1
            and not any(line.comment for line in updated.leading_lines)
          ):
            removed_line(outer, name)
            return c.RemoveFromParent()
        return updated

    counts = reads(fn)
    before = reads(self.original_fn) if self.original_fn is not None else {}
    # A line whose value only the moved constructions read (`d = x.shape[-1]` for a Dense
    # now built in __init__) goes too.
    moved |= {n for n, k in counts.items() if k == 1 and before.get(n, 0) > 1}
    fn = fn.visit(Drop())
    return mark_unread_targets(fn)

  # --- expressions ------------------------------------------------------------------------

  def _setup_layer_call(self, original, updated):
    """`self.dropout_layer(x, deterministic)`, a flax layer made in setup and called in a
    method: the positional arguments NNX takes by keyword get their keyword (None: no such
    call)."""
    name = dotted(original.func)
    if name is None or not name.startswith("self.") or name.count(".") != 1:
      return None
    made = {
      s.target
      for s in self.p.sites
      if s.kind == "construct" and s.setup_attr == name[5:] and not s.setup_list
    }
    if len(made) != 1:
      return None
    args = _keyworded(list(updated.args), tp.cast(type, made.pop()))
    return updated.with_changes(args=args) if args != list(updated.args) else None

  def leave_Call(self, original, updated):
    c = libcst()
    key = id(original)
    if key in self.p.todo_nodes:
      self._mark(self.p.todo_nodes[key])
      return updated
    carry = carry_call(self.p, original, updated)
    if carry is not None:
      return c.parse_expression(carry)
    hoist = self.p.hoists.get(key)
    if hoist is not None:
      site = hoist.site
      if site.lift is not None and site.outer_call is None and hoist.lifted is None:
        self._mark("a module made through a lifted transform and called later")
        return updated
      return self._hoisted(hoist, original, updated)
    if key in self.p.lift_rewrites:
      code = self.p.lift_rewrites[key]
      self.p.change(
        self.p.site_of[key].lines,
        self.p.code(original),
        code,
        "rematerialization moves from the class to the call (nnx.remat)",
      )
      return c.parse_expression(code)
    func = original.func
    lifted_local = (
      self.p.lifted_locals.get((self.method, func.value)) if isinstance(func, c.Name) else None
    )
    for h in self.p.hoists.values():
      if (h.site.outer_call is original or h is lifted_local) and h.lifted is not None:
        if any(a.keyword is not None or a.star for a in updated.args) or not updated.args:
          self._mark(f"a call of an nn.{h.lifted.lift} module with keyword or star arguments")
          return updated
        module = self.p.code(updated.func) if h is not lifted_local else func.value
        args = [self.p.code(a.value) for a in updated.args]
        code = h.lifted.call(module, args)
        self.p.change(
          self.p.positions[original].start.line, self.p.code(original), code, h.lifted.why
        )
        return c.parse_expression(code)
      if h.site.outer_call is original and h.site.lift is not None:
        # `block(config, name=...)(y, mask)` -> `block(self.layers[i], y, mask)`; written
        # inline, `nn.remat(Block)(config)(y)` -> `nnx.remat(...)(self.CheckpointBlock_0, y)`.
        lift = h.site.node.func
        lift_code = self.p.lift_rewrites.get(id(lift)) or self.p.code(lift)
        extra = [c.parse_expression(f"f({kw})").args[0] for kw in h.call_kwargs]
        return updated.with_changes(
          func=c.parse_expression(lift_code),
          args=[c.Arg(updated.func), *updated.args, *extra],
        )
      child = self.p.ctx.ported.get(tp.cast(type, h.site.target))
      if h.site.outer_call is original and child is not None and child.threaded.get("__call__"):
        extra_args = []
        for n, field in child.threaded["__call__"].items():
          value = self._threaded_value(h, field, n)
          if value is None:
            self._mark(
              f"{n} reaches {child.cls.__name__} through its factory field {field}, "
              "bound by an expression the draft cannot read"
            )
            return updated
          extra_args.append(c.parse_expression(f"f({n}={value})").args[0])
        return updated.with_changes(args=[*updated.args, *extra_args])
      if h.site.outer_call is original:
        args = _keyworded(list(updated.args), tp.cast(type, h.site.target))
        extra = [c.parse_expression(f"f({kw})").args[0] for kw in h.call_kwargs]
        return updated.with_changes(args=[*args, *extra])
    layer_call = self._setup_layer_call(original, updated) or apply_with_params(
      self, original, updated
    )
    if layer_call is not None:
      return layer_call
    handed_out = linen_api_used(self.p.src.namespace, original)
    if handed_out is not None:
      self._mark(handed_out)
      return updated
    site = self.p.site_of.get(key)
    if site is None:
      return updated
    if site.kind == "param":
      return self._param(site, original, updated)
    if site.kind == "variable":
      return self._variable(site, original, updated)
    if site.kind == "self_api":
      return self._self_api(site, original, updated)
    return updated

  def _threaded_value(self, hoist: Hoist, field: str, name: str) -> str | None:
    """The expression the parent bound `name` to, in the partial it passes as `field`."""
    c = libcst()
    arg = next((a for a in hoist.site.node.args if a.keyword and a.keyword.value == field), None)
    if arg is None or not isinstance(arg.value, c.Name):
      return None
    partial = self.p.partials.get((hoist.site.method, arg.value.value))
    if partial is None:
      return None
    bound = next((a for a in partial.args[1:] if a.keyword and a.keyword.value == name), None)
    return None if bound is None else self.p.code(bound.value)

  def _hoisted(self, hoist: Hoist, original, updated):
    c = libcst()
    site = hoist.site
    # A construction in setup's own line that no attribute names (HF T5's `self.layer +=
    # (X(..., name=str(k)),)`) stays where it is, as setup's lines do.
    in_place = site.method == "setup" and not hoist.attr.isidentifier()
    if site.setup_attr is not None or site.list_attr is not None or in_place:
      index = site.list_index
      if site.comp is not None:
        target = site.comp.for_in.target
        if (
          isinstance(target, c.Name)
          and dotted(
            site.comp.for_in.iter.func
            if isinstance(site.comp.for_in.iter, c.Call)
            else site.comp.for_in.iter
          )
          == "range"
        ):
          index = target.value
        else:
          self._mark("a list comprehension of layers not over range(...)")
          return updated
      code, why = construction(self.p, hoist, index)
      if code is None:
        self._mark(why)
        return updated
      self.p.change(
        site.lines,
        self.p.code(original),
        code,
        "standard layer -> NNX, input width from the trace"
        if "nnx." in code.split("(")[0]
        else "submodule built with rngs",
      )
      return c.parse_expression(code)
    if hoist.counter:
      local = self.p.counter_nest[id(site.node)][0]
      code, why = construction(self.p, hoist, f"len({local})")
      index = hoist.index
    elif id(site.comp) in self.p.comp_index:
      index = self.p.comp_index[id(site.comp)][0]
      code, why = construction(self.p, hoist, index)
    else:
      index = self.loops[id(site.loop)][0] if hoist.is_list else None
      code, why = construction(self.p, hoist, index)
    if code is None:
      self._mark(why)
      return updated
    ref = f"self.{hoist.attr}[{index}]" if hoist.is_list else f"self.{hoist.attr}"
    if hoist.call_settings:
      lines = call_time_args.statements(ref, hoist.call_settings)
      self.before.setdefault(id(self.stack[-1]), []).extend(map(c.parse_statement, lines))
    self.p.hoisted_code[id(original)] = code
    self.p.change(
      site.lines,
      self.p.code(original),
      f"{ref}  (built in __init__: {code})",
      "a construction in a compact method moves to __init__",
    )
    return c.parse_expression(ref)

  def _through_aliases(self, node, method: str) -> str | None:
    """`node`'s code for `__init__` with the method's aliases inlined (None: it reads the
    call otherwise)."""
    aliases = self.p.aliases.get(method, {})
    if not available(node, self.p.init_namespace, set(aliases)):
      return None
    inlined = inline_aliases(node, aliases)
    # The added arguments (an input width no field explains) are `__init__`'s too.
    if not available(inlined, self.p.init_namespace, set(self.p.resolver.extras)):
      return None
    return self.p.rewrite_expr(self.p.code(inlined))

  def _param(self, site, original, updated):
    c = libcst()
    args = original.args
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
    if not isinstance(args[1].value, (c.Name, c.Attribute, c.Call, c.Subscript)):
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

  def _computed_attribute(self, original) -> str | None:
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

  def _setup_assign(self, original) -> bool:
    return self.method == "setup"

  def _variable(self, site, original, updated):
    c = libcst()
    args = original.args
    col = string_literal(args[0].value) if args else None
    name = string_literal(args[1].value) if len(args) > 1 else None
    if col is None or name is None or len(args) < 3:
      self._mark("self.variable without a literal collection, name and init function")
      return updated
    kind = VARIABLE_TYPES.get(col)
    if kind is None:
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
    decl = f"nnx.{kind}({value})"
    if late:
      return self._made_on_first_use(site, original, name, decl, col, kind)
    self.p.declare(site, name, decl)
    self.p.change(
      site.lines,
      self.p.code(original),
      f"self.{name} = {decl}",
      f"a Linen {col} variable becomes an nnx.{kind} built in __init__",
    )
    if self.method == "setup":
      return c.parse_expression(decl)
    assign: tp.Any = self.p.parents.get(original)
    if isinstance(assign, c.Assign) and isinstance(assign.targets[0].target, c.Name):
      self.local_vars.add(assign.targets[0].target.value)
    return c.parse_expression(f"self.{name}")

  def _made_on_first_use(self, site, original, name: str, decl: str, col: str, kind: str):
    c = libcst()
    unit = self.p.module.default_indent
    self.before.setdefault(id(self.stack[-1]), []).append(lazy_variables.creation(name, decl, unit))
    self.p.port.attributes[name] = self.p.src.line(site.lines[0])
    self.p.change(
      site.lines,
      self.p.code(original),
      f'if not hasattr(self, "{name}"): self.{name} = {decl}',
      f"Linen makes this {col} variable in the call, sized by the call or beside one that "
      f"is: an nnx.{kind} attribute the method makes on first use",
    )
    assign: tp.Any = self.p.parents.get(original)
    if isinstance(assign, c.Assign) and isinstance(assign.targets[0].target, c.Name):
      self.local_vars.add(assign.targets[0].target.value)
    return c.parse_expression(f"self.{name}")

  def _self_api(self, site, original, updated):
    c = libcst()
    api = site.target
    if api == "is_initializing":
      self.p.change(
        site.lines,
        "self.is_initializing()",
        "False",
        "an NNX module is built in __init__: its calls never initialize",
      )
      return c.parse_expression("False")
    if api == "make_rng":
      stream = string_literal(original.args[0].value) if original.args else "params"
      if stream is None or not stream.isidentifier():
        self._mark("self.make_rng with a stream name that is not a literal identifier")
        return updated
      self.p.port.uses_rngs_attr = True
      self.p.change(
        site.lines,
        self.p.code(original),
        f"self.rngs.{stream}()",
        "Linen rng streams become the module's nnx.Rngs stream",
      )
      return c.parse_expression(f"self.rngs.{stream}()")
    if api == "sow":
      col = string_literal(original.args[0].value) if original.args else None
      if col != "intermediates":
        self._mark(f"self.sow into the collection {col!r} (NNX sows nnx.Intermediate here)")
        return updated
      new = updated.with_changes(
        args=[
          updated.args[0].with_changes(value=c.parse_expression("nnx.Intermediate")),
          *updated.args[1:],
        ]
      )
      self.p.change(
        site.lines,
        self.p.code(original),
        "self.sow(nnx.Intermediate, ...)",
        "Linen's 'intermediates' collection is nnx.Intermediate",
      )
      return new
    if api == "has_variable":
      args = original.args
      pair = (
        (string_literal(args[0].value), string_literal(args[1].value))
        if len(args) == 2 and not any(a.keyword or a.star for a in args)
        else (None, None)
      )
      if pair[1] in self.late and pair in self.declared:
        name = tp.cast(str, pair[1])
        self.p.change(
          site.lines,
          self.p.code(original),
          lazy_variables.presence(name),
          "the variable is an attribute made on first use: present once made",
        )
        return c.parse_expression(lazy_variables.presence(name))
      if pair not in self.declared:
        self._mark(
          "self.has_variable of a variable this class does not declare with a literal "
          "collection and name"
        )
        return updated
      self.p.change(
        site.lines,
        self.p.code(original),
        "True",
        "an NNX module's variables exist once __init__ ran (Linen: not during init)",
      )
      return c.parse_expression("True")
    self._mark(f"self.{api} (Linen module machinery with no drafted NNX idiom)")
    return updated

  def leave_ListComp(self, original, updated):
    """`[nn.Dense(w)(x) for w in ws]` -> `[self.Dense[layer](x) for layer, w in enumerate(ws)]`."""
    header = self.p.comp_index.get(id(original), (None, None))[1]
    if header is None:
      return updated
    c = libcst()
    for_in = updated.for_in.with_changes(
      target=c.parse_expression(header),
      iter=c.parse_expression(f"enumerate({self.p.code(original.for_in.iter)})"),
    )
    return updated.with_changes(for_in=for_in)

  def leave_UnaryOperation(self, original, updated):
    c = libcst()
    expr = updated.expression
    if isinstance(updated.operator, c.Not) and isinstance(expr, c.Name):  # noqa: SIM102
      # Only `not False` left by the is_initializing rewrite is folded (`not True` too).
      if expr.value in ("False", "True"):
        return c.Name("True" if updated.expression.value == "False" else "False")
    return updated

  def leave_BooleanOperation(self, original, updated):
    c = libcst()
    if isinstance(updated.operator, c.And):
      for keep, other in ((updated.left, updated.right), (updated.right, updated.left)):
        if isinstance(other, c.Name) and other.value == "True":
          return keep
    return updated

  def leave_Attribute(self, original, updated):
    c = libcst()
    site = self.p.site_of.get(id(original))
    if id(original) in self.reads:
      return updated  # `self.variables[col][name]`: the subscript around it is rewritten
    if site is not None and site.kind == "self_api":  # `self.variables[...]`, `self.scope`
      self._mark(
        f"self.{site.target} (Linen's variable dict and scope; an NNX module holds its "
        "Variables as attributes: read those)"
      )
      return updated
    name = dotted(original)
    if name is None:
      return updated
    head, _, rest = name.partition(".")
    if head in self.local_vars and rest == "value" and self.p.ctx.modern:
      return c.parse_expression(f"{head}[...]")
    if head == "self" and rest.startswith("config."):
      new = self.p.rewrite_expr(name)  # a field the model's config mixin mirrors
      if new != name:
        return c.parse_expression(new)
    if head == "self" and self.method != "setup":
      if rest in self.p.param_attrs:
        return c.parse_expression(self.p.value_access(self.p.param_attrs[rest]))
      attr, _, tail = rest.partition(".")
      if attr in self.p.var_attrs and tail == "value":
        return c.parse_expression(self.p.value_access(self.p.var_attrs[attr]))
      if rest in self.p.var_attrs:
        return c.parse_expression(f"self.{self.p.var_attrs[rest]}")
      return updated
    if head in self.p.ctx.linen_names and rest:
      new = self.p.rewrite_expr(name)
      if new != name:
        return c.parse_expression(new)
    return updated

  def leave_Subscript(self, original, updated):
    name = self.read_of.get(id(original))
    if name is None:
      return variables_read(self, original) or updated
    new = self.p.value_access(name)
    self.p.change(
      self.p.positions[original].start.line,
      self.p.code(original),
      new,
      "Linen's variable dict read: the NNX module holds the variable as an attribute",
    )
    return libcst().parse_expression(new)

  def leave_Assign(self, original, updated):
    c = libcst()
    value = original.value
    placeholder = data_placeholder(self, original, updated)
    if placeholder is not None:
      return placeholder
    if self.p.ctx.modern and isinstance(value, (c.ListComp, c.List)):
      elements = [value.elt] if isinstance(value, c.ListComp) else [e.value for e in value.elements]
      local = isinstance(updated.targets[0].target, c.Name)
      if not local and any(
        id(e) in self.p.hoists and self.p.hoists[id(e)].is_list for e in elements
      ):
        # A Python list of layers is an nnx.List on flax versions that have one.
        updated = updated.with_changes(
          value=c.parse_expression(f"nnx.List({self.p.code(value)})").with_changes(
            args=[c.Arg(updated.value)]
          )
        )
    if (
      self.p.ctx.modern
      and isinstance(value, c.Tuple)
      and self.method == "setup"
      and not isinstance(updated.targets[0].target, c.Name)
      and any(id(e.value) in self.p.hoists for e in value.elements)
    ):
      # HF T5's `self.layer = (X(..., name=str(0)),)`, grown by `+=` after: a tuple of layers
      # is static data to flax 0.12's NNX (refused); an nnx.List holds them, and `+=` a tuple
      # extends it.
      items = ", ".join(self.p.code(e.value) for e in tp.cast(tp.Any, updated.value).elements)
      updated = updated.with_changes(value=c.parse_expression(f"nnx.List([{items}])"))
    if self.p.ctx.modern and isinstance(value, c.Name) and self.method == "setup":
      target: tp.Any = original.targets[0].target if len(original.targets) == 1 else None
      attr = target.attr.value if isinstance(target, c.Attribute) else None
      if attr is not None and any(
        h.site.list_attr == attr and h.site.setup_attr is None for h in self.p.hoists.values()
      ):
        # `self.layers = layers`, a list setup filled with layers: an nnx.List.
        updated = updated.with_changes(value=c.parse_expression(f"nnx.List({value.value})"))
    choice = self.p.choices.get(id(value))
    if choice is not None:
      # `layer = A if c else B`: the port of the class the trace saw, behind a guard.
      updated = updated.with_changes(value=c.Name(choice.drafted.__name__))
      if choice.other is not choice.drafted:
        test = self.p.code(tp.cast(tp.Any, original.value).test)
        statement = c.parse_statement(guard(choice, test))
        self.before.setdefault(id(self.stack[-1]), []).append(statement)
    name = self.p.renames.get(id(original))
    if name is not None:
      target = updated.targets[0].with_changes(target=c.parse_expression(f"self.{name}"))
      updated = updated.with_changes(targets=[target])
    return built_where_called(self, original, updated)


def _reads(node) -> dict[str, int]:
  """How often each name occurs in `node` (reads and writes alike)."""
  c = libcst()
  counts: dict[str, int] = {}

  class Reads(c.CSTVisitor):
    def visit_Name(self, name) -> None:
      counts[name.value] = counts.get(name.value, 0) + 1

  node.visit(Reads())
  return counts


def mark_unread_targets(fn):
  """`for width in ...` whose body no longer reads `width` -> `for _width in ...`."""
  c = libcst()

  class Unread(c.CSTTransformer):
    def leave_For(self, original, updated):
      used = _reads(updated.body)
      names = [
        n
        for n in _target_names(updated.target)
        if used.get(n.value, 0) == 0 and not n.value.startswith("_")
      ]
      if not names:
        return updated
      renamed = {id(n) for n in names}

      class Rename(c.CSTTransformer):
        def leave_Name(self, orig, upd):
          return upd.with_changes(value=f"_{upd.value}") if id(orig) in renamed else upd

      return updated.with_changes(target=updated.target.visit(Rename()))

  return fn.visit(Unread())


def _target_names(target) -> list[tp.Any]:
  """The Name nodes a for-loop target binds (`i`, `(i, x)`)."""
  c = libcst()
  if isinstance(target, c.Name):
    return [target]
  if isinstance(target, (c.Tuple, c.List)):
    return [n for e in target.elements for n in _target_names(e.value)]
  return []


def loop_names(loops) -> set[str]:
  return set().union(*[loop_targets(loop) for loop in loops]) if loops else set()


def _is_field(stmt, fields: set[str]) -> bool:
  c = libcst()
  if not isinstance(stmt, c.SimpleStatementLine) or len(stmt.body) != 1:
    return False
  node = stmt.body[0]
  return (
    isinstance(node, c.AnnAssign)
    and isinstance(node.target, c.Name)
    and (node.target.value in fields)
  )


def _hoisted_lines(planner: Planner, loops: dict[int, tuple[str, str | None]]) -> list[str]:
  """`__init__` lines of the call methods' constructions (loops rebuilt around lists)."""
  # Setup's own locals are not repeated: its body runs in `__init__` as written, in order
  # (HF CLIP's `num_positions = self.num_patches + 1` reads an attribute set just before).
  lines: list[str] = [
    f"{name} = {planner.rewrite_expr(code)}"
    for method, aliases in planner.aliases.items()
    if method != "setup"
    for name, code in aliases.items()
    if name in planner.used_aliases
  ]
  seen_loops: set[int] = set()
  unit = planner.module.default_indent
  for hoist in planner.hoists.values():
    site = hoist.site
    if site.setup_attr is not None or id(site.node) not in planner.hoisted_code:
      continue
    if hoist.counter:
      local, nest, depth = planner.counter_nest[id(site.node)]
      code = planner.hoisted_code[id(site.node)]
      lines.append(f"{local} = []")
      lines.append("\n".join([*nest, f"{unit * depth}{local}.append({code})"]) + "\n")
      lines.append(f"self.{hoist.attr} = {planner.list_of(local)}")
      planner.port.attributes[hoist.attr] = planner.src.line(site.lines[0])
      continue
    if id(site.comp) in planner.comp_index:
      # A list comprehension that built and called layers: `__init__` builds the list.
      code = planner.hoisted_code[id(site.node)]
      comp: tp.Any = site.comp
      header = planner.comp_index[id(comp)][1]
      target = header or planner.code(comp.for_in.target)
      it = planner.code(comp.for_in.iter)
      it = f"enumerate({it})" if header is not None else it
      lines.append(f"self.{hoist.attr} = {planner.list_of(f'[{code} for {target} in {it}]')}")
      planner.port.attributes[hoist.attr] = planner.src.line(site.lines[0])
      continue
    if not hoist.is_list:
      code = planner.hoisted_code[id(site.node)]
      if hoist.lifted is not None:
        block = hoist.lifted.init_lines(hoist.attr, code, unit)
      else:
        block = [f"self.{hoist.attr} = {code}", *hoist.post]
      present = {p: bool(kids) for p, kids in hoist.children.items()}
      cond = planner.guard(site, present, hoist.attr)
      if cond is not None:
        # Every line of every statement under the guard (a lifted stack's builder is several).
        inner = [ln for statement in block for ln in statement.splitlines()]
        block = [f"if {cond}:\n" + "\n".join(f"{unit}{ln}" for ln in inner)]
      lines += block
      planner.port.attributes[hoist.attr] = planner.src.line(site.lines[0])
      continue
    loop = site.loop
    if id(loop) in seen_loops:
      continue
    seen_loops.add(id(loop))
    members = [
      h
      for h in planner.hoists.values()
      if h.site.loop is loop
      and id(h.site.node) in planner.hoisted_code
      and h.is_list
      and not h.counter  # a list under an `if` in this loop has its own replay
    ]
    header = loops[id(loop)][1]
    target = header or planner.code(loop.target)
    it = planner.code(loop.iter)
    if header is not None:
      it = f"enumerate({it})"
    locals_ = {id(h): _list_local(planner, h) for h in members}
    block = [f"{locals_[id(h)]} = []" for h in members]
    body = "".join(
      f"{unit}{locals_[id(h)]}.append({planner.hoisted_code[id(h.site.node)]})\n" for h in members
    )
    block.append(f"for {target} in {it}:\n{body}")
    for h in members:
      block.append(f"self.{h.attr} = {planner.list_of(locals_[id(h)])}")
      planner.port.attributes[h.attr] = planner.src.line(h.site.lines[0])
    # A loop under an `if` `__init__` can evaluate (big_vision's `else:` of `if self.scan:`):
    # its layers exist where Linen makes them, not in a configuration taking the other branch.
    conds = {planner.written_guard(h.site.loop_guards, h.site.method) for h in members}
    cond = conds.pop() if len(conds) == 1 else None
    if cond is not None:
      inner = [ln for statement in block for ln in statement.rstrip("\n").splitlines()]
      block = [f"if {cond}:\n" + "\n".join(f"{unit}{ln}" for ln in inner)]
    lines += block
  return lines


def _list_local(planner: Planner, hoist: Hoist) -> str:
  """The local `__init__` fills with a loop's layers: the list's attribute name, unless that
  name means something there (the layers' own class, `Encoder1DBlock_0, ...` making the list
  `Encoder1DBlock`; a global; a local of the method)."""
  clash = hoist.attr in planner.init_namespace or hoist.attr in planner.aliases.get(
    hoist.site.method, {}
  )
  return f"{hoist.attr}_layers" if clash else hoist.attr


def _unique(name: str, taken: set[str]) -> str:
  while name in taken:
    name += "_"
  return name


def _plan_counter(planner: Planner, hoist: Hoist) -> None:
  """Layers made in nested loops, or under an `if` in a loop: `__init__` replays the loops and
  the `if`s, the call counts the layers.

  `__init__` runs the same loop headers, `if` tests and the plain assignments before the
  construction (`strides = (2, 2) if i > 0 else (1, 1)`) when they read fields, globals and
  loop targets only; a per-layer traced value is indexed by the layers built so far
  (`len(...)`). A test `__init__` cannot evaluate (it reads the call) is a TODO.
  """
  c = libcst()
  site = hoist.site
  ns = planner.init_namespace
  aliases = planner.aliases.get(site.method, {})
  outer_first = list(reversed(site.loops))
  known = set(aliases)
  lines: list[str] = []
  unit = planner.module.default_indent
  local = _list_local(planner, hoist)
  # The nodes from the outermost loop down to the site's statement.
  path: list[tp.Any] = []
  node: tp.Any = site.node
  while node in planner.parents and node is not outer_first[0]:
    path.append(node)
    node = planner.parents[node]
  path.append(outer_first[0])
  path.reverse()
  depth = 0
  for i, step in enumerate(path):
    after = path[i + 1] if i + 1 < len(path) else None
    if isinstance(step, c.For):
      if not available(step.iter, ns, known):
        planner.todo(site, call_time_args.LOOP_OVER_CALL)
        return
      planner.used_aliases.update(n for n in names_in(step.iter) if n in aliases)
      known |= loop_targets(step)
      lines.append(f"{unit * depth}for {planner.code(step.target)} in {planner.code(step.iter)}:")
      depth += 1
    elif isinstance(step, c.If) and after is not None and after is not step.test:
      if not available(step.test, ns, known):
        planner.todo(site, "a layer built under an `if` whose test reads the call, in a loop")
        return
      planner.used_aliases.update(n for n in names_in(step.test) if n in aliases)
      test = planner.code(step.test)
      lines.append(f"{unit * depth}if {test if after is step.body else f'not ({test})'}:")
      depth += 1
    elif isinstance(step, c.IndentedBlock) and after is not None:
      for stmt in step.body:  # the plain assignments before the statement holding the site
        if stmt is after:
          break
        if (
          isinstance(stmt, c.SimpleStatementLine)
          and isinstance(stmt.body[0], c.Assign)
          and isinstance(stmt.body[0].targets[0].target, c.Name)
          and available(stmt.body[0].value, ns, known)
        ):
          lines.append(f"{unit * depth}{planner.code(stmt.body[0])}")
          planner.used_aliases.update(n for n in names_in(stmt.body[0].value) if n in aliases)
          known.add(stmt.body[0].targets[0].target.value)
    elif isinstance(step, (c.While, c.Try, c.IfExp)) or (
      isinstance(step, c.If) and after is step.test
    ):
      planner.todo(site, f"a layer built in a loop under a {type(step).__name__.lower()}")
      return
  statement: tp.Any = site.node
  while not isinstance(statement, c.SimpleStatementLine):
    statement = planner.parents[statement]
  taken = set(planner.src.namespace) | known | set(planner.counter_names)
  counter = _unique("layer", taken)
  planner.counter_names.append(counter)
  planner.scope_names[id(site.node)] = known
  planner.counter_plans[id(site.node)] = hoist
  hoist.index = counter
  planner.counter_nest[id(site.node)] = (local, lines, depth)
  planner.counter_inits.setdefault(id(outer_first[0]), []).append(counter)
  planner.increments[id(statement)] = counter


@functools.cache
def _transformer_class() -> type:
  return type("Rewriter", (Rewriter, libcst().CSTTransformer), {})


def _transformer(planner: Planner, loops: dict[int, tuple[str, str | None]]) -> tp.Any:
  """A `Rewriter` that is a libcst transformer (libcst is imported here, when drafting)."""
  return _transformer_class()(planner, loops)


def port_class(src: ClassSource, ctx: Context) -> ClassPort:
  """The NNX port of one Linen class (its code, TODOs, changes and added arguments)."""
  c = libcst()
  port = ClassPort(src.cls, src)
  wrapper = c.MetadataWrapper(src.tree())
  planner = Planner(port, ctx, wrapper)
  planner.plan()
  loops: dict[int, tuple[str, str | None]] = {}
  for hoist in planner.hoists.values():
    loop = hoist.site.loop
    if hoist.counter:
      _plan_counter(planner, hoist)
      continue
    if hoist.is_list and loop is not None and hoist.site.setup_attr is None:
      aliases = planner.aliases.get(hoist.site.method, {})
      if not available(loop.iter, planner.init_namespace, set(aliases)):
        planner.todo(hoist.site, call_time_args.LOOP_OVER_CALL)
        continue
      planner.used_aliases.update(n for n in names_in(loop.iter) if n in aliases)
      loops.setdefault(id(loop), _loop_index(planner, loop))
    elif hoist.is_list and hoist.site.comp is not None and hoist.site.setup_attr is None:
      comp: tp.Any = hoist.site.comp
      if id(comp) not in planner.comp_index:
        planner.comp_index[id(comp)] = _loop_index(planner, comp.for_in)
  rewriter = _transformer(planner, loops)
  module = planner.module.visit(rewriter)
  classdef: tp.Any = module.body[0]
  fields = port.field_names()
  unit = module.default_indent
  body: list[tp.Any] = list(classdef.body.body)
  doc: list[tp.Any] = []
  if (
    body
    and isinstance(body[0], c.SimpleStatementLine)
    and isinstance(body[0].body[0], c.Expr)
    and isinstance(body[0].body[0].value, (c.SimpleString, c.ConcatenatedString))
  ):
    doc = [body.pop(0)]
  field_stmts = [s for s in body if _is_field(s, set(fields))]
  setup = [s for s in body if isinstance(s, c.FunctionDef) and s.name.value == "setup"]
  rest = [s for s in body if s not in field_stmts and s not in setup]
  # The signature: the dataclass fields in order, then the added arguments and rngs.
  params: list[str] = []
  field_inits: dict[str, str] = {}  # `dataclasses.field(...)` fields: their __init__ line

  def rewritten(node: tp.Any) -> str:
    return planner.rewrite_expr(planner.code(node))

  by_name = {s.body[0].target.value: s.body[0] for s in field_stmts}
  for f in dataclasses.fields(src.cls):
    if f.name in ("parent", "name") or f.name in port.dropped:
      continue
    node = by_name.get(f.name)
    if node is not None:
      annotation = planner.code(node.annotation.annotation)
      if annotation in {f"{n}.Module" for n in planner.ctx.linen_names}:
        annotation = "nnx.Module"  # a submodule handed in is the NNX port of one
      text = f"{f.name}: {annotation}"
      as_field = (
        None
        if node.value is None
        else signature_and_init(f.name, annotation, node.value, src.namespace, rewritten)
      )
      if as_field is not None:
        text, field_inits[f.name] = as_field
      elif node.value is not None:
        text += f" = {default_text(planner, f, node.value)}"
    elif (inherited := inherited_default(flax_layer_base(src.cls), f.name)) is not None:
      text = f"{f.name}={inherited}"  # a field of the flax layer the class subclasses
    else:
      text = f.name if f.default is dataclasses.MISSING else f"{f.name}={f.default!r}"
    params.append(text)
  extras = tp.cast(tp.Any, port.resolver).extras
  hoisted = _hoisted_lines(planner, loops)
  init_lines = [field_inits.get(f, f"self.{f} = {f}") for f in fields if f not in port.dropped]
  if port.uses_rngs_attr:
    init_lines.append("self.rngs = rngs")

  def build_init() -> tp.Any:
    kw = [e.parameter() for e in extras.values()] + ["rngs: nnx.Rngs"]
    signature = ", ".join(["self", *params, "*", *kw])
    init_src = (
      f"def __init__({signature}):\n"
      + "".join(
        f"{unit}{ln}\n" for block in init_lines + planner.declarations for ln in block.splitlines()
      )
      + "".join("".join(f"{unit}{ln}\n" for ln in block.splitlines()) for block in hoisted)
      + f"{unit}pass\n"
    )
    config = c.PartialParserConfig(default_indent=unit)
    init: tp.Any = c.parse_statement(init_src, config=config)
    init_body = list(init.body.body)[:-1]
    for s in setup:
      init_body += list(s.body.body)
    return init.with_changes(
      body=init.body.with_changes(body=init_body or [c.parse_statement("pass")])
    )

  init = build_init()
  # An added argument whose line stayed in the call method (lm1b's `length = inputs.shape[1]`
  # is read by the call only) is read by nothing in the port: left in, the parent would pass
  # the sample's number for it. Dropped before any parent builds this class.
  read = set().union(*(names_in(n) for n in [*init.body.body, *rest]))
  unread = [name for name in extras if name not in read]
  if unread:
    for name in unread:
      del extras[name]
    init = build_init()
  init = mark_unread_targets(init)
  orig_class: tp.Any = planner.module.body[0]
  orig_body: list[tp.Any] = list(orig_class.body.body)
  orig_setup = [s for s in orig_body if isinstance(s, c.FunctionDef) and s.name.value == "setup"]
  orig_fields = [s for s in orig_body if _is_field(s, set(fields))]
  if setup:
    planner.change(
      planner.positions[orig_setup[0]].start.line,
      "def setup(self):",
      "def __init__(..., *, rngs: nnx.Rngs):",
      "setup's body runs in __init__",
    )
  if field_stmts:
    planner.change(
      planner.positions[orig_fields[0]].start.line,
      f"{len(fields)} dataclass fields",
      "__init__ arguments",
      "NNX modules take their configuration in __init__",
    )
  from .linen_machinery import (
    DROPPED_BASE,
    DROPPED_DECORATOR,
    DROPPED_INIT_METHOD,
    calls_linen_init,
    is_mixin_base,
  )

  for fn in orig_body:
    if isinstance(fn, c.FunctionDef) and fn.name.value != "setup" and calls_linen_init(fn):
      first, last = planner.positions[fn].start.line, planner.positions[fn].end.line
      lines = range(src.line(first), src.line(last) + 1)
      port.todos = [t for t in port.todos if not (t.file == src.file and t.line in lines)]
      rest = [s for s in rest if getattr(s, "name", None) is None or s.name.value != fn.name.value]
      planner.change(first, f"def {fn.name.value}(...)", "removed", DROPPED_INIT_METHOD)
  new_body = [
    *doc,
    *[s for s in rest if not isinstance(s, c.FunctionDef)],
    init,
    *[s for s in rest if isinstance(s, c.FunctionDef)],
  ]
  for decorator in orig_class.decorators:
    code = planner.code(decorator.decorator)
    planner.change(
      planner.positions[decorator].start.line, f"@{code}", "removed", DROPPED_DECORATOR
    )
  classdef = classdef.with_changes(decorators=[])
  bases = []
  for base in classdef.bases:
    name = dotted(base.value) or ""
    if is_mixin_base(resolve(name, src.namespace)):
      planner.change(planner.positions[orig_class].start.line, name, "removed", DROPPED_BASE)
      continue
    if name.split(".")[0] in ctx.linen_names and name.endswith(".Module"):
      bases.append(base.with_changes(value=c.parse_expression("nnx.Module")))
      planner.change(
        planner.positions[orig_class].start.line,
        f"class ...({name})",
        "nnx.Module",
        "the base class",
      )
    elif (spec := subclassable(tp.cast(tp.Any, resolve(name, src.namespace)))) is not None:
      layer = spec.nnx_name
      bases.append(base.with_changes(value=c.parse_expression(f"nnx.{layer}")))
      planner.change(
        planner.positions[orig_class].start.line,
        f"class ...({name})",
        f"nnx.{layer}",
        f"the base class: the methods the class inherits are nnx.{layer}'s, reading the "
        "attributes its fields become; its own setup makes the variables",
      )
    elif (abstract := abstract_counterpart(resolve(name, src.namespace))) is not None:
      bases.append(base.with_changes(value=c.parse_expression(abstract)))
      planner.change(
        planner.positions[orig_class].start.line,
        f"class ...({name})",
        abstract,
        f"the base class: {abstract} is NNX's counterpart of Linen's",
      )
    else:
      bases.append(base)
  classdef = classdef.with_changes(bases=bases, body=classdef.body.with_changes(body=new_body))
  port.code = module.with_changes(body=[classdef]).code
  return port


def _keyworded(args: list[tp.Any], cls: type) -> list[tp.Any]:
  """A flax layer's call arguments, those Linen passes by position and NNX takes by keyword
  (`nn.Dropout(r)(x, True)` -> `deterministic=True`) given their keyword."""
  layer = standard_layers.lookup(cls)
  if layer is None:
    return args
  c = libcst()
  positional = [a for a in args if a.keyword is None and not a.star]
  names = standard_layers.call_keywords(cls, layer, len(positional))
  return [
    a.with_changes(keyword=c.Name(n), equal=_tight_equal())
    if a.keyword is None and not a.star and i < len(names) and (n := names[i])
    else a
    for i, a in enumerate(args)
  ]


def _tight_equal() -> tp.Any:
  """`=` of a keyword argument as black and ruff write it (`f(x=1)`): the draft has the same
  formatting whether or not ruff is installed to format it."""
  c = libcst()
  return c.AssignEqual(
    whitespace_before=c.SimpleWhitespace(""), whitespace_after=c.SimpleWhitespace("")
  )
