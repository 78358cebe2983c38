"""An attribute setup binds to a plain value first and to an array after (magvit's `BlurPool2D`:
`self.filter = [1., 3., 3., 1.]` in a branch of the filter size, then
`self.filter = jnp.array(self.filter, ...)`, reshaped and normalized in place).

flax 0.12's NNX modules are pytrees that fix an attribute's kind where it is first bound: the
list makes `filter` static, and binding an array to it afterwards raises ("Cannot assign data
value ... to static attribute"). The port says the array is data where it binds it, as that
error says to: each later, computed binding of such an attribute is wrapped in `nnx.data(...)`
(the array, a constant of the module, is what Linen's setup kept). Only where the installed
flax keeps array attributes and has `nnx.data`; flax 0.10 makes such an attribute a property
(`constant_arrays.py`). Hook: `draft.py` (after the class is written).
"""

from __future__ import annotations

import ast
import typing as tp

from flax import nnx

from ... import _compat
from ..plan.class_port import ClassPort, Context
from ..plan.source import dotted, libcst
from ..records import Change
from .constant_array_properties import Evidence, all_statements

WHY = (
  "flax's NNX fixes an attribute's kind where it is first bound (here a plain value, static): "
  "the array bound to it later is marked data (nnx.data)"
)


def _literal(code: str) -> bool:
  try:
    ast.literal_eval(code)
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    return False
  return True


def _assignments(init: tp.Any, module: tp.Any) -> dict[str, list[tuple[tp.Any, bool]]]:
  """Each `self.x = value` of `__init__`, in order, by attribute: (the Assign, a literal?)."""
  c = libcst()
  found: dict[str, list[tuple[tp.Any, bool]]] = {}
  for stmt in all_statements(init):
    for small in stmt.body:
      if not isinstance(small, c.Assign) or len(small.targets) != 1:
        continue
      target = small.targets[0].target
      if not isinstance(target, c.Attribute) or dotted(target.value) != "self":
        continue
      literal = _literal(module.code_for_node(small.value))
      found.setdefault(target.attr.value, []).append((small, literal))
  return found


def mark_data(port: ClassPort, ctx: Context) -> ClassPort:
  """`port` with each array bound to an attribute a plain literal was bound to first wrapped
  in `nnx.data(...)`, where the installed flax needs it; unchanged elsewhere."""
  if not (_compat.nnx_keeps_array_attributes() and hasattr(nnx, "data")):
    return port
  arrays = Evidence.of(port, ctx).arrays
  if not arrays:
    return port
  c = libcst()
  module = c.parse_module(port.code)
  classdef = next((s for s in module.body if isinstance(s, c.ClassDef)), None)
  methods = [] if classdef is None else classdef.body.body
  init = next(
    (s for s in methods if isinstance(s, c.FunctionDef) and s.name.value == "__init__"), None
  )
  if init is None:
    return port
  wrap: set[int] = set()
  for attr, bindings in _assignments(init, module).items():
    if attr not in arrays or not bindings or not bindings[0][1]:
      continue  # an array from its first binding on: NNX makes it data itself
    later = [a for a, literal in bindings[1:] if not literal]
    wrap.update(id(a) for a in later)
    for a in later[:1]:
      code = module.code_for_node(a).strip()
      port.changes.append(
        Change(
          port.source.file, port.source.first_line, code[:90], f"self.{attr} = nnx.data(...)", WHY
        )
      )
  if not wrap:
    return port

  class Wrap(c.CSTTransformer):
    def leave_Assign(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      if id(original) not in wrap:
        return updated
      value = c.parse_expression(f"nnx.data({module.code_for_node(updated.value)})")
      return updated.with_changes(value=value)

  port.code = tp.cast(tp.Any, module.visit(Wrap())).code
  return port
