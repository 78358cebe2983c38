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

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .. import _compat
from .._core.errors import CheckpointError
from .convert_align import Key, LeafName, Unit, Value
from .convert_pairs import Pair
from .layer_values import Take, gather, is_placeholder, through_rule, value_of
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


# --- writing the moved values ----------------------------------------------------------


def describe_value(value: Value | jax.ShapeDtypeStruct) -> str:
  if is_placeholder(value):
    return f"the optax placeholder {value!r}"
  return f"{jnp.result_type(value)}{list(np.shape(value))}"


_PLACEHOLDER_MISMATCH = (
  "{what}: `{key}` is {new} in the source but {old} in the target. Why: the two optimizers "
  "leave different params out (optax.masked / optax.multi_transform labels, "
  "optax.set_to_zero), so this slot means something else on each side. Fix: build the "
  "target's optimizer with the source's transformation and the same labels for these params."
)


def checked_writes(
  targets: tp.Mapping[Key, nnx.Variable],
  values: tp.Mapping[Key, Value],
  what: str,
  copy: bool = False,
) -> list[tuple[nnx.Variable, jax.Array]]:
  """(Variable, new value) for every target, each checked before anything is written; the
  new value on the old placement, a copy of its own when `copy` (else it may be the very
  array given)."""
  writes = []
  for key, variable in targets.items():
    if key not in values:
      raise CheckpointError(f"{what}: nothing converts into `{'/'.join(key)}`.")
    old, new = _compat.variable_value(variable), values[key]
    if is_placeholder(old) or is_placeholder(new):
      # Placeholders hold no numbers: the target keeps its own, if it is the same kind.
      if jax.tree_util.tree_structure(old) != jax.tree_util.tree_structure(new):
        raise CheckpointError(
          _PLACEHOLDER_MISMATCH.format(
            what=what, key="/".join(key), new=describe_value(new), old=describe_value(old)
          )
        )
      continue
    if np.shape(old) != np.shape(new) or jnp.result_type(old) != jnp.result_type(new):
      raise CheckpointError(
        f"{what}: `{'/'.join(key)}` is {describe_value(new)} in the source but "
        f"{describe_value(old)} in the target. Build the target with the source's widths, "
        "depth and dtypes (values are never cast, so a round trip stays bit-exact)."
      )
    sharding = getattr(old, "sharding", None)
    placed = jax.device_put(new, sharding) if sharding is not None else jnp.asarray(new)
    # device_put onto the placement an array already has returns that array's buffer, and
    # jnp.asarray keeps a jax.Array as it is; jnp.array(copy=True) keeps the sharding.
    writes.append((variable, jnp.array(placed, copy=True) if copy else placed))
  return writes
