"""A submodule's variables read from outside it, and a submodule applied with given params.

HF's heads with tied embeddings (BART's `...ForConditionalGeneration`, GPT-2's LM head, ALBERT's
pretraining head, ...) read the base model's embedding table and apply the output layer with its
transpose as the kernel::

  shared = self.model.variables["params"]["shared"]["embedding"]
  logits = self.lm_head.apply({"params": {"kernel": shared.T}}, hidden_states)

An NNX module holds its variables as attributes, so the read is the attribute path's value
(`self.model.shared.embedding[...]`), and a `nn.Dense` applied with a given kernel (and bias)
is what that layer computes with them, written as NNX code writes a tied head:
`jnp.dot(hidden_states, shared.T)`. Linen never creates the variables of a layer it only applies
with given params, so the port does not build that layer either where the trace saw it made no
variables (its construction is guarded by the condition the call is under, or dropped).

Hooks: `Rewriter.leave_Subscript` (the read) and `Rewriter.leave_Call` (the apply).
"""

from __future__ import annotations

import typing as tp

from flax import linen as nn

from ..literals import string_literal
from ..source import dotted, libcst
from .bool_settings import explain_bool

VARIABLES_WHY = (
  "a submodule's Linen variable dict read: the NNX submodule holds the variable as an attribute"
)
APPLY_WHY = (
  "Linen applies the layer with given params: the NNX code computes the layer with them "
  "(a Dense is a matrix product)"
)


def _chain(node: tp.Any) -> tuple[str, list[str | None]] | None:
  """`self.a.b.variables["params"]["x"]["y"]` -> ("self.a.b", ["params", "x", "y"])."""
  c = libcst()
  keys: list[str | None] = []
  while isinstance(node, c.Subscript):
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, c.Index):
      return None
    keys.append(string_literal(node.slice[0].slice.value))
    node = node.value
  name = dotted(node)
  if name is None or not name.endswith(".variables") or not name.startswith("self."):
    return None
  owner = name[: -len(".variables")]
  return (owner, keys[::-1]) if owner != "self" else None


def variables_read(rewriter: tp.Any, original: tp.Any) -> tp.Any | None:
  """The NNX form of `self.<sub>.variables[col][...][name]` (None: not this idiom).

  Only the outermost subscript of the chain is rewritten; a read the trace does not confirm
  (a key that is not a literal, a dict rather than one variable) is a TODO naming the line.
  """
  c = libcst()
  p = rewriter.p
  parent = p.parents.get(original)
  if isinstance(parent, c.Subscript) and parent.value is original:
    return None
  chain = _chain(original)
  if chain is None:
    return None
  owner, keys = chain
  names = [k for k in keys if k is not None]
  path = owner.split(".")[1:] + names[1:-1]
  if len(names) != len(keys) or len(names) < 2 or not _traced_variable(p, path, names):
    rewriter._mark(
      f"{owner}.variables read with keys that do not name one variable the trace saw "
      "(an NNX module holds its variables as attributes: read that attribute)"
    )
    return None
  attr = ".".join([*path, names[-1]])
  new = p.value_access(attr)
  p.change(p.positions[original].start.line, p.code(original), new, VARIABLES_WHY)
  return c.parse_expression(new)


def _traced_variable(p: tp.Any, path: list[str], names: list[str]) -> bool:
  """Whether, below every traced instance of the class, `path` holds the variable."""
  col, var = names[0], names[-1]
  if not p.instances:
    return False
  for inst in p.instances:
    child = p.trace.instances.get((*inst.path, *path))
    if child is None or (col, var) not in child.variables:
      return False
  return True


def apply_with_params(rewriter: tp.Any, original: tp.Any, updated: tp.Any) -> tp.Any | None:
  """`self.<layer>.apply({"params": {...}}, x)` of a `nn.Dense` made in setup -> its product
  (None: not this idiom; an apply this cannot write is a TODO naming the line)."""
  c = libcst()
  p = rewriter.p
  func = original.func
  if not (isinstance(func, c.Attribute) and func.attr.value == "apply"):
    return None
  owner = dotted(func.value)
  if owner is None or not owner.startswith("self.") or owner.count(".") != 1:
    return None
  made = {s.target for s in p.sites if s.kind == "construct" and s.setup_attr == owner[5:]}
  if not made:
    return None
  layer = made.pop() if len(made) == 1 else None
  code = None
  if layer is nn.Dense:
    code = _dense(p, owner[5:], updated)
  if code is None:
    rewriter._mark(
      f"{owner}.apply with given params ({getattr(layer, '__name__', 'a submodule')}): the "
      "draft writes this only for a nn.Dense given its kernel (and bias) and one input"
    )
    return None
  p.change(p.positions[original].start.line, p.code(original), code, APPLY_WHY)
  return c.parse_expression(code)


def _given_params(node: tp.Any) -> dict[str, tp.Any] | None:
  """`{"params": {"kernel": K, "bias": b}}` -> {"kernel": K, "bias": b} (None otherwise)."""
  c = libcst()
  if not isinstance(node, c.Dict) or len(node.elements) != 1:
    return None
  outer = node.elements[0]
  if not isinstance(outer, c.DictElement) or string_literal(outer.key) != "params":
    return None
  inner = outer.value
  if not isinstance(inner, c.Dict):
    return None
  out: dict[str, tp.Any] = {}
  for el in inner.elements:
    key = string_literal(el.key) if isinstance(el, c.DictElement) else None
    if key is None:
      return None
    out[key] = el.value
  return out


def _dense(p: tp.Any, attr: str, call: tp.Any) -> str | None:
  """A Dense's `dot_general` of the input's last axis with the kernel's first, plus the bias,
  after promoting both to the layer's `dtype` (as `nn.Dense` does)."""
  args = list(call.args)
  if len(args) != 2 or any(a.keyword is not None or a.star for a in args):
    return None
  params = _given_params(args[0].value)
  if params is None or "kernel" not in params or not set(params) <= {"kernel", "bias"}:
    return None
  site = next(s for s in p.sites if s.kind == "construct" and s.setup_attr == attr)
  options = {a.keyword.value: p.code(a.value) for a in site.node.args if a.keyword is not None}
  if set(options) & {"dot_general", "dot_general_cls"}:
    return None
  x, kernel = p.code(args[1].value), p.code(params["kernel"])
  dtype = options.get("dtype")
  if dtype is not None and dtype != "None":
    x, kernel = f"jnp.asarray({x}, {dtype})", f"jnp.asarray({kernel}, {dtype})"
  precision = options.get("precision")
  out = f"jnp.dot({x}, {kernel}" + (f", precision={precision})" if precision else ")")
  if "bias" in params:
    bias = p.code(params["bias"])
    out += f" + (jnp.asarray({bias}, {dtype})" if dtype and dtype != "None" else f" + ({bias}"
    out += ")"
  return out


ONLY_WHERE_CALLED_WHY = (
  "Linen makes no variables for a layer it only applies with given params: the port builds "
  "it only where the class calls it itself"
)


def built_where_called(rewriter: tp.Any, original: tp.Any, updated: tp.Any) -> tp.Any:
  """setup's `self.X = nn.Dense(...)` of a layer the class applies with given params, and that
  made no variables in a traced instance: `self.X = nnx.Linear(...) if COND else None`, COND the
  negation of the `if` around that apply where `__init__` can read it (HF's
  `not self.config.tie_word_embeddings`), else what the traces say (an added bool argument)."""
  c = libcst()
  p = rewriter.p
  if rewriter.method != "setup" or len(original.targets) != 1:
    return updated
  owner = dotted(original.targets[0].target)
  if owner is None or not owner.startswith("self.") or owner.count(".") != 1:
    return updated
  applies = [node for node in p.parents if _applies(node, owner)]
  if not applies or not isinstance(original.value, c.Call):
    return updated
  attr = owner[5:]
  present = {i.path: _made_variables(p.trace, (*i.path, attr)) for i in p.instances}
  if all(present.values()):
    return updated
  tests = {_branch(p, node) for node in applies}
  cond = None
  branch = next(iter(tests)) if len(tests) == 1 else None
  if branch is not None:
    test, in_body = branch
    method = _method_of(p, applies[0])
    cond = p.written_guard([(test, in_body)], method) if method else None
  if cond is None:
    cond = _setting_of_presence(p, attr)
  if cond is None:
    alts = [
      {
        i.path: _made_variables(t, (*i.path, attr))
        for i in t.instances.values()
        if i.cls is p.src.cls
      }
      for t in p.ctx.alt_traces
    ]
    cond = p.resolver.expr(present, f"has_{attr}", [a for a in alts if a])
  code = f"{p.code(updated.value)} if {cond} else None"
  p.change(
    p.positions[original].start.line, p.code(original), f"{owner} = {code}", ONLY_WHERE_CALLED_WHY
  )
  return updated.with_changes(value=c.parse_expression(code))


def _applies(node: tp.Any, owner: str) -> bool:
  c = libcst()
  return (
    isinstance(node, c.Call)
    and isinstance(node.func, c.Attribute)
    and node.func.attr.value == "apply"
    and dotted(node.func.value) == owner
  )


def _made_variables(trace: tp.Any, path: tuple[str, ...]) -> bool:
  child = trace.instances.get(path)
  return child is not None and bool(child.variables)


def _branch(p: tp.Any, node: tp.Any) -> tuple[tp.Any, bool] | None:
  """The innermost `if` holding `node`, and whether `node` is in its body (not its else)."""
  c = libcst()
  child, parent = node, p.parents.get(node)
  while parent is not None and not isinstance(parent, c.FunctionDef):
    if isinstance(parent, c.If):
      return (parent.test, child is parent.body)
    child, parent = parent, p.parents.get(parent)
  return None


def _method_of(p: tp.Any, node: tp.Any) -> str | None:
  c = libcst()
  parent = p.parents.get(node)
  while parent is not None and not isinstance(parent, c.FunctionDef):
    parent = p.parents.get(parent)
  return None if parent is None else parent.name.value


def _setting_of_presence(p: tp.Any, attr: str) -> str | None:
  """The bool setting that says, in every traced configuration, whether the layer made
  variables (`bool_settings.explain_bool`); None where none does, or nothing varied."""
  samples: list[tuple[object, object]] = []
  for t in [p.trace, *p.ctx.alt_traces]:
    for inst in t.instances.values():
      if inst.cls is p.src.cls:
        samples.append((inst.module, _made_variables(t, (*inst.path, attr))))
  found = explain_bool(samples)
  return None if found is None else p.rewrite_expr(found)
