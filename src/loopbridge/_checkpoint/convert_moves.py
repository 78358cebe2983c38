"""Moving the arrays of paired leaves: slice stacks per layer, transform, stack again.

A Linen stack (`nn.scan`) stores a layer axis in each array (its `variable_axes`); an NNX
stack (`nnx.vmap`) stores axis 0. A pair is one layer: its Linen arrays are sliced at that
layer, moved by the pair's leaf rules (`leaf_rules`), and the other side's layers are stacked
again. Values are never cast, so a round trip is bit-exact.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp

from .convert_align import Key, LeafName, Unit, Value
from .convert_match import Pair

# (Linen stack path, collection) -> the layer axis the evidence kept, where several fit.
Axes = tp.Mapping[tuple[tuple[str, ...], str], int]


def layer_axis(unit: Unit, name: LeafName, axes: Axes | None) -> int | None:
  """The layer axis of a unit's stored array (None: one array for the unit)."""
  axis = unit.leaves[name].axis
  if axis is not None and unit.stack is not None and axes:
    return axes.get((unit.stack, name[0]), axis)
  return axis


def _read(unit: Unit, name: LeafName, source: tp.Mapping[Key, Value], axes: Axes | None) -> Value:
  value = source[(name[0], *unit.path, name[1])]
  axis = layer_axis(unit, name, axes)
  if axis is not None:
    value = jax.lax.index_in_dim(jnp.asarray(value), tp.cast(int, unit.layer), axis, False)
  return value


def _move(
  pairs: tp.Sequence[Pair],
  source: tp.Mapping[Key, Value],
  col: str | None,
  axes: Axes | None,
  to_nnx: bool,
) -> dict[Key, Value]:
  whole: dict[Key, Value] = {}
  pieces: dict[Key, tuple[int, dict[int, jax.Array]]] = {}
  for pair in pairs:
    src_units, dst_units = (pair.linen, pair.nnx) if to_nnx else (pair.nnx, pair.linen)
    for move in pair.moves:
      src_refs, dst_refs = (move.linen, move.nnx) if to_nnx else (move.nnx, move.linen)
      if col is not None and src_refs[0][1][0] != col:
        continue
      arrays = [_read(src_units[i], name, source, axes if to_nnx else None) for i, name in src_refs]
      shapes = [dst_units[i].leaves[name].shape for i, name in dst_refs]
      if to_nnx:
        made = move.rule.forward(arrays, shapes)
      else:
        made = move.rule.backward(arrays, shapes)
      for (i, name), value in zip(dst_refs, made):
        unit = dst_units[i]
        key = (name[0], *unit.path, name[1])
        axis = layer_axis(unit, name, None if to_nnx else axes)
        if axis is None:
          whole.setdefault(key, value)  # a variable shared by every layer: the first layer's
        else:
          layers = pieces.setdefault(key, (axis, {}))[1]
          layers[tp.cast(int, unit.layer)] = jnp.asarray(value)
  for key, (axis, layers) in pieces.items():
    whole[key] = jnp.stack([layers[i] for i in range(len(layers))], axis=axis)
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
