"""Moving the arrays of paired leaves: slice stacks per layer, transform, stack again.

A Linen stack (`nn.scan`) stores a layer axis in each array (its `variable_axes`); an NNX
stack (`nnx.vmap`) stores axis 0. A pair is one layer: its Linen arrays are sliced at that
layer, moved by the pair's leaf rules (`leaf_rules`), and the other side's layers are stacked
again. Values are never cast, so a round trip is bit-exact.

A leaf that moves as it is (`Rename`: same name or another) is not read per layer but noted
as where each layer comes from (`layer_values.Take`): a whole source stack taken in layer
order is then handed over as it is, or moved once to the other layer axis, so a conversion
keeps no second copy of the stacked weights. Optax placeholders (`MaskedNode()`,
`EmptyState()`, `None`) hold no numbers and pass through every move (`layer_values`).
"""

from __future__ import annotations

import typing as tp

from .convert_align import Key, LeafName, Unit, Value
from .convert_match import Pair
from .layer_values import Take, gather, through_rule, value_of
from .leaf_rules import Rename

# (Linen stack path, collection) -> the layer axis the evidence kept, where several fit.
Axes = tp.Mapping[tuple[tuple[str, ...], str], int]


def layer_axis(unit: Unit, name: LeafName, axes: Axes | None) -> int | None:
  """The layer axis of a unit's stored array (None: one array for the unit)."""
  axis = unit.leaves[name].axis
  if axis is not None and unit.stack is not None and axes:
    return axes.get((unit.stack, name[0]), axis)
  return axis


def _where(unit: Unit, name: LeafName, axes: Axes | None) -> Take:
  """Where a unit's value of leaf `name` is in the source: its layer of a stack, or whole."""
  return Take((name[0], *unit.path, name[1]), unit.layer, layer_axis(unit, name, axes))


def _move(
  pairs: tp.Sequence[Pair],
  source: tp.Mapping[Key, Value],
  col: str | None,
  axes: Axes | None,
  to_nnx: bool,
) -> dict[Key, Value]:
  whole: dict[Key, Value] = {}
  # Per target stack: its layer axis and, per layer, a Take or a value a rule made.
  pieces: dict[Key, tuple[int, dict[int, tp.Any]]] = {}
  for pair in pairs:
    src_units, dst_units = (pair.linen, pair.nnx) if to_nnx else (pair.nnx, pair.linen)
    for move in pair.moves:
      src_refs, dst_refs = (move.linen, move.nnx) if to_nnx else (move.nnx, move.linen)
      if col is not None and src_refs[0][1][0] != col:
        continue
      wheres = [_where(src_units[i], name, axes if to_nnx else None) for i, name in src_refs]
      made: list[tp.Any]
      if isinstance(move.rule, Rename):
        made = list(wheres)  # the same array: read when its stack is built
      else:
        shapes = [dst_units[i].leaves[name].shape for i, name in dst_refs]
        transform = move.rule.forward if to_nnx else move.rule.backward
        arrays = [value_of(source, w) for w in wheres]
        made = through_rule(transform, arrays, shapes, move.rule, [w.key for w in wheres])
      for (i, name), value in zip(dst_refs, made):
        unit = dst_units[i]
        key = (name[0], *unit.path, name[1])
        axis = layer_axis(unit, name, None if to_nnx else axes)
        if axis is None:
          if key not in whole:  # a variable shared by every layer: the first layer's
            whole[key] = value_of(source, value)
        else:
          pieces.setdefault(key, (axis, {}))[1][tp.cast(int, unit.layer)] = value
  for key, (axis, layers) in pieces.items():
    whole[key] = gather(source, layers, axis, key)
  return whole


def to_nnx(
  pairs: tp.Sequence[Pair],
  source: tp.Mapping[Key, Value],
  col: str | None = None,
  axes: Axes | None = None,
) -> dict[Key, Value]:
  """Linen arrays by key -> NNX arrays by key (only collection `col` when given)."""
  return _move(pairs, source, col, axes, True)


def to_linen(
  pairs: tp.Sequence[Pair],
  source: tp.Mapping[Key, Value],
  col: str | None = None,
  axes: Axes | None = None,
) -> dict[Key, Value]:
  """NNX arrays by key -> Linen arrays by key (stacked along each Linen layer axis)."""
  return _move(pairs, source, col, axes, False)
