"""A line of a call method that reads the input's shape, kept in `__init__` as an expression.

flax's lm1b `MlpBlock` computes `actual_out_dim = inputs.shape[-1] if self.out_dim is None else
self.out_dim` and builds a Dense with it. The construction moves to `__init__`, so the line must
too, or `out_dim` is stored and does nothing. `__init__` has no `inputs`: each
`inputs.shape[k]` becomes what the traces say it is, a field expression when the configurations
agree on one (`self.config.emb_dim`), otherwise a constructor argument (`in_features`, as NNX's
own layers take it). The rest of the line is kept as the user wrote it.
"""

from __future__ import annotations

import typing as tp

from ..trace.trace import size
from .names import assignment_counts, available
from .source import libcst

if tp.TYPE_CHECKING:
  import libcst as cst


def _index(node: tp.Any) -> int | None:
  c = libcst()
  if len(node.slice) != 1 or not isinstance(node.slice[0].slice, c.Index):
    return None
  value = node.slice[0].slice.value
  sign = 1
  if isinstance(value, c.UnaryOperation) and isinstance(value.operator, c.Minus):
    sign, value = -1, value.expression
  return sign * int(value.value) if isinstance(value, c.Integer) else None


def _shape_read(node: tp.Any, params: list[str]) -> tuple[str, int] | None:
  """`(param, k)` for `param.shape[k]`, else None."""
  c = libcst()
  if not isinstance(node, c.Subscript) or not isinstance(node.value, c.Attribute):
    return None
  owner = node.value
  if owner.attr.value != "shape" or not isinstance(owner.value, c.Name):
    return None
  k = _index(node)
  return (owner.value.value, k) if owner.value.value in params and k is not None else None


def _hint(param: str, k: int, first: bool) -> str:
  if first and k == -1:
    return "in_features"
  return f"{param}_dim{k}" if k >= 0 else f"{param}_dim_last{-k}"


def in_init(
  planner: tp.Any, fn: cst.FunctionDef, value: cst.BaseExpression, known: set[str]
) -> str | None:
  """The code of `value` for `__init__` with its input-shape reads replaced, or None when it
  reads the call otherwise (or a parameter it reads was reassigned in the method)."""
  c = libcst()

  method = fn.name.value
  params = [p.name.value for p in fn.params.params][1:]
  counts = assignment_counts(fn)
  params = [p for p in params if counts.get(p, 0) == 0]
  reads: dict[tuple[str, int], str] = {}

  def expression(param: str, k: int) -> str | None:
    position = params.index(param)

    def get(inst: tp.Any) -> int:
      args, kwargs = inst.inputs[method]
      arg = args[position] if position < len(args) else kwargs[param]
      return size(arg.shape[k])

    try:
      values = {i.path: get(i) for i in planner.instances if method in i.inputs}
    except (KeyError, IndexError, TypeError, AttributeError):
      return None
    if not values:
      return None
    hint = _hint(param, k, position == 0)
    return planner.resolver.expr(values, hint, planner.alt_own(get), from_input=True)

  class Replace(c.CSTTransformer):
    def leave_Subscript(self, original, updated):
      read = _shape_read(original, params)
      if read is None:
        return updated
      if read not in reads:
        code = expression(*read)
        if code is None:
          return updated
        reads[read] = code
      return c.parse_expression(reads[read])

  if not any(_shape_read(n, params) for n in _subscripts(value)):
    return None
  before = dict(planner.resolver.extras)
  new = tp.cast(tp.Any, value.visit(Replace()))
  if not available(new, planner.init_namespace, known | set(planner.resolver.extras)):
    planner.resolver.extras = before  # no argument for a line that stays in the method
    return None
  return planner.code(new)


def _subscripts(node: tp.Any) -> list[tp.Any]:
  c = libcst()
  found: list[tp.Any] = []

  class Find(c.CSTVisitor):
    def visit_Subscript(self, sub) -> None:
      found.append(sub)

  node.visit(Find())
  return found
