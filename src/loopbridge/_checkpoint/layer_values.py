"""Slicing one layer out of a stored value and stacking layers again; placeholders pass through.

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
