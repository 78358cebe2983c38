"""Slicing one layer out of a stored value and stacking layers again; placeholders pass through.

A converted stack is described first, layer by layer, as where each layer comes from (a
`Take`), and built once from that: a whole source stack taken in layer order is passed on
as it is (moved to the target's layer axis when that differs) instead of being sliced into
layers and stacked again, so converting a model keeps no second copy of its stacked weights.

An optax state holds, beside arrays, values that hold no numbers: `optax.MaskedNode()` where
`optax.masked` / `optax.multi_transform` leave a param out, `optax.EmptyState()`, `None`.
Such a *placeholder* has no layer axis to slice or stack: it stands for the whole stack on
either side, so it is carried over unchanged, and a stack is a placeholder only when every
layer is the same placeholder (a mask covers a whole Linen `nn.scan` variable).
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
import numpy as np

from .._core.errors import CheckpointError

_MIXED_MASK = (
  "`{key}`: some layers hold arrays and others the optax placeholder {placeholder!r}; "
  "one stacked array cannot be partly masked. Why: the source's optimizer masks these "
  "layers differently (per-layer labels), the target stores them as one stack. Fix: give "
  "every layer of the stack the same optax label (or mask) on the source side."
)


def is_placeholder(value: object) -> bool:
  """True for a value that holds no array (`MaskedNode()`, `EmptyState()`, `None`)."""
  return not jax.tree_util.tree_leaves(value)


def take_layer(value: tp.Any, layer: int, axis: int) -> tp.Any:
  """Layer `layer` of a value stacked along `axis`; a placeholder stands for every layer."""
  if is_placeholder(value):
    return value
  return jax.lax.index_in_dim(jnp.asarray(value), layer, axis, False)


def stack_layers(layers: tp.Sequence[tp.Any], axis: int, key: tp.Sequence[str]) -> tp.Any:
  """The layers stacked along `axis`; layers that are all one placeholder stay that placeholder.

  Raises:
    CheckpointError: some layers are placeholders and others arrays (or other placeholders).
  """
  masked = [v for v in layers if is_placeholder(v)]
  if not masked:
    return jnp.stack([jnp.asarray(v) for v in layers], axis=axis)
  first = masked[0]
  same = jax.tree_util.tree_structure(first)
  if len(masked) != len(layers) or any(jax.tree_util.tree_structure(v) != same for v in masked):
    raise CheckpointError(_MIXED_MASK.format(key="/".join(key), placeholder=first))
  return first


class Take(tp.NamedTuple):
  """Where one layer (or one whole value) of the target comes from in the source."""

  key: tuple[str, ...]  # the source array
  layer: int | None  # its layer, along `axis`
  axis: int | None  # its layer axis; None: the whole array


def take(source: tp.Mapping[tuple[str, ...], tp.Any], where: Take) -> tp.Any:
  """The value `where` names: one layer of a stack, or a whole array."""
  value = source[where.key]
  if where.axis is None:
    return value
  return take_layer(value, tp.cast(int, where.layer), where.axis)


def gather(
  source: tp.Mapping[tuple[str, ...], tp.Any],
  layers: tp.Mapping[int, Take],
  axis: int,
  key: tp.Sequence[str],
) -> tp.Any:
  """The target stack (layer axis `axis`) whose layer `i` is `layers[i]`.

  Layers `0..n-1` that are the layers `0..n-1` of one source stack of depth n are that
  stack, moved to `axis` (no copy when the axes agree); other layers are sliced and stacked.
  """
  n = len(layers)
  first = layers[0]
  value, stacked_along = source[first.key], first.axis
  if stacked_along is not None and all(
    layers[i] == Take(first.key, i, stacked_along) for i in range(n)
  ):
    if is_placeholder(value):
      return value
    if np.shape(value)[stacked_along] == n:
      if stacked_along == axis:
        return value
      return jnp.moveaxis(jnp.asarray(value), stacked_along, axis)
  return stack_layers([take(source, layers[i]) for i in range(n)], axis, key)
