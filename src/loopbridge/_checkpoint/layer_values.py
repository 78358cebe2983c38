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


def value_of(source: tp.Mapping[tuple[str, ...], tp.Any], item: tp.Any) -> tp.Any:
  """The value a layer stands for: read where a `Take` says, or a value already made."""
  return take(source, item) if isinstance(item, Take) else item


def gather(
  source: tp.Mapping[tuple[str, ...], tp.Any],
  layers: tp.Mapping[int, tp.Any],
  axis: int,
  key: tp.Sequence[str],
) -> tp.Any:
  """The target stack (layer axis `axis`) whose layer `i` is `layers[i]`.

  A layer is a `Take` (read from the source) or a value already made (by a leaf rule).
  Layers `0..n-1` that are the layers `0..n-1` of one source stack of depth n are that
  stack, moved to `axis` (no copy when the axes agree); other layers are sliced and stacked.
  """
  n = len(layers)
  first = layers[0]
  if isinstance(first, Take) and first.axis is not None:
    along = first.axis
    if all(
      isinstance(layers[i], Take) and layers[i] == Take(first.key, i, along) for i in range(n)
    ):
      value = source[first.key]
      if is_placeholder(value):
        return value
      if np.shape(value)[along] == n:
        return value if along == axis else jnp.moveaxis(jnp.asarray(value), along, axis)
  return stack_layers([value_of(source, layers[i]) for i in range(n)], axis, key)


_RULE_MASK = (
  "`{keys}`: the leaf rule {rule} moves arrays together with the optax placeholder "
  "{placeholder!r}. Why: the source's optimizer masks some of the leaves this rule splits or "
  "fuses and not the others, so the other side's arrays would be partly masked. Fix: give "
  "every leaf the rule moves the same optax label (or mask) on the source side."
)


def through_rule(
  move: tp.Callable[[list[tp.Any], list[tuple[int, ...]]], list[tp.Any]],
  arrays: tp.Sequence[tp.Any],
  shapes: tp.Sequence[tuple[int, ...]],
  rule: object,
  keys: tp.Sequence[tp.Sequence[str]],
) -> list[tp.Any]:
  """A leaf rule's `move(arrays, shapes)`, through which optax placeholders pass.

  Raises:
    CheckpointError: some of the arrays are placeholders and others not (or other ones).
  """
  masked = [v for v in arrays if is_placeholder(v)]
  if not masked:
    return move(list(arrays), list(shapes))
  first = masked[0]
  same = jax.tree_util.tree_structure(first)
  if len(masked) != len(arrays) or any(jax.tree_util.tree_structure(v) != same for v in masked):
    names = ", ".join("/".join(k) for k in keys)
    raise CheckpointError(_RULE_MASK.format(keys=names, rule=rule, placeholder=first))
  return [first] * len(shapes)
