"""An RNN cell's first carry: Linen's `cell.initialize_carry(rng, input_shape)` in NNX.

NNX's cells take the shape first and the random streams second
(`initialize_carry(input_shape, rngs)`), and an NNX cell is built with its input width. Two
forms are drafted:

- a cell the port holds (`self.cell.initialize_carry(rng, shape)`): the arguments swap, the key
  wrapped in `nnx.Rngs`;
- a cell built detached only for its carry (flax's sst2:
  `nn.OptimizedLSTMCell(self.hidden_size, parent=None).initialize_carry(rng, shape)`): the NNX
  cell is built in place, its input width the shape's last axis (the carry is for inputs of
  that shape), its own weights unused.

A detached construction used otherwise stays a TODO (its variables would belong to no module).
"""

from __future__ import annotations

import typing as tp

from ..emit.construction import bind
from ..plan import standard_layers
from ..plan.find_sites import Site
from ..plan.source import dotted, libcst

if tp.TYPE_CHECKING:
  import libcst as cst

Planner = tp.Any  # rewrite_class.Planner, typed loosely so this module stays below it

WHY_SWAPPED = "NNX's initialize_carry takes the input shape first, then the random streams"
WHY_DETACHED = (
  "a cell built detached (parent=None) only for its carry: the NNX cell is built in place with "
  "its input width (the shape's last axis), its weights unused"
)
DETACHED_ELSEWHERE = (
  "a Linen module built detached (parent=None) and used for more than its "
  "initialize_carry(rng, shape): build its NNX counterpart in __init__ by hand"
)


def is_detached(site: Site) -> bool:
  """`Cls(..., parent=None)`: a module no parent adopts."""
  return any(
    a.keyword is not None and a.keyword.value == "parent" and dotted(a.value) == "None"
    for a in site.node.args
  )


def _carry_args(call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
  """(rng, input_shape) of a Linen `initialize_carry` call, or None."""
  if len(call.args) != 2 or any(a.star for a in call.args):
    return None
  by_name = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
  positional = [a.value for a in call.args if a.keyword is None]
  rng = positional[0] if positional else by_name.get("rng")
  shape = positional[1] if len(positional) > 1 else by_name.get("input_shape")
  return None if rng is None or shape is None else (rng, shape)


def _nnx_cell(cls: type) -> standard_layers.LayerMap | None:
  from flax import linen as nn

  layer = standard_layers.lookup(cls)
  if layer is None or not issubclass(cls, nn.RNNCellBase):
    return None
  return layer if hasattr(layer.nnx_class, "initialize_carry") else None


def plan_detached(planner: Planner, site: Site) -> None:
  """Plan `Cell(..., parent=None).initialize_carry(rng, shape)` (or a TODO for the site)."""
  c = libcst()
  attribute: tp.Any = planner.parents.get(site.node)
  call: tp.Any = planner.parents.get(attribute) if attribute is not None else None
  layer = _nnx_cell(tp.cast(type, site.target))
  method = getattr(getattr(attribute, "attr", None), "value", None)
  if (
    layer is None
    or not isinstance(attribute, c.Attribute)
    or method != "initialize_carry"
    or not isinstance(call, c.Call)
    or call.func is not attribute
    or _carry_args(call) is None
  ):
    planner.todo(site, DETACHED_ELSEWHERE)
    return
  bound, error = bind(site, tp.cast(type, site.target))
  if error:
    planner.todo(site, error)
    return
  known = {p.name for p in layer.parameters()}
  for field in bound:
    if field != "parent" and layer.renames.get(field, field) not in known:
      planner.todo(site, f"the detached cell's {field}= has no counterpart in nnx.{layer.nnx_name}")
      return
  planner.carry_calls[id(call)] = site


def carry_call(planner: Planner, original: cst.Call, updated: cst.Call) -> str | None:
  """The NNX form of a planned `initialize_carry` call (None: not one)."""
  site = planner.carry_calls.get(id(original))
  if site is not None:
    return _detached(planner, site, original, updated)
  return _held(planner, original, updated)


def _detached(planner: Planner, site: Site, original: cst.Call, updated: cst.Call) -> str:
  layer = tp.cast(standard_layers.LayerMap, _nnx_cell(tp.cast(type, site.target)))
  rng, shape = tp.cast(tuple, _carry_args(updated))
  bound, _ = bind(site, tp.cast(type, site.target))
  args: dict[str, str] = {}
  for field, expr in bound.items():
    if field != "parent":
      args[layer.renames.get(field, field)] = planner.code(expr)
  shape_code = planner.code(shape)
  in_features = next(p.name for p in layer.parameters())
  args[in_features] = f"{shape_code}[-1]"
  parts: list[str] = []
  positional = True
  for p in layer.parameters():
    if p.name not in args:
      positional = positional and p.kind is not p.POSITIONAL_OR_KEYWORD
      continue
    if positional and p.kind is p.POSITIONAL_OR_KEYWORD:
      parts.append(args[p.name])
    else:
      parts.append(f"{p.name}={args[p.name]}")
  parts.append("rngs=nnx.Rngs(0)")
  code = (
    f"{layer.code_name}({', '.join(parts)}).initialize_carry("
    f"{shape_code}, nnx.Rngs({planner.code(rng)}))"
  )
  planner.change(planner.positions[original].start.line, planner.code(original), code, WHY_DETACHED)
  return code


def _held(planner: Planner, original: cst.Call, updated: cst.Call) -> str | None:
  """`self.<cell>.initialize_carry(rng, shape)` of a standard cell the port builds, or
  `cell.initialize_carry(rng, shape)` of a local holding one (`cell = nn.LSTMCell(6)`)."""
  c = libcst()
  func: tp.Any = original.func
  if not (isinstance(func, c.Attribute) and func.attr.value == "initialize_carry"):
    return None
  if isinstance(func.value, c.Attribute) and dotted(func.value.value) == "self":
    attr = func.value.attr.value
    held = [h for h in planner.hoists.values() if h.attr == attr]
  elif isinstance(func.value, c.Name):
    held = [h for h in planner.hoists.values() if h.site.local == func.value.value]
    if len(held) > 1:  # two cells held by locals of one name: which one is not read here
      return None
  else:
    return None
  held = [h for h in held if not h.is_list and _nnx_cell(tp.cast(type, h.site.target)) is not None]
  args = _carry_args(updated)
  if not held or args is None:
    return None
  rng, shape = args
  code = (
    f"{planner.code(tp.cast(tp.Any, updated.func))}({planner.code(shape)}, "
    f"nnx.Rngs({planner.code(rng)}))"
  )
  planner.change(planner.positions[original].start.line, planner.code(original), code, WHY_SWAPPED)
  return code
