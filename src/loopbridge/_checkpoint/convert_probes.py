"""The inputs conversion's evidence runs on: the user's sample and probes the library makes.

A sample users really pass is often degenerate: one token (a softmax over one key is 1, so
query and key cannot be told apart), zeros (every kernel gives the bias), a batch of identical
rows, all-positive inputs to a ReLU net. A wrong candidate agrees on such a sample. So every
candidate is also run on `PROBES` inputs made from the sample's structure: random values of
its shapes and dtypes. Floats are standard normal draws; integers are drawn within the
vocabulary of the embedding they index (found from the sample run's recorded calls), else
within the range the sample shows; bools, PRNG keys, scalars and non-arrays are kept as given
(masks, flags and keys say how to run, not what to compute). A probe whose rows come out all
equal is drawn again. A pairing must agree on every input.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np

# Probes besides the sample: two, so that one unlucky draw cannot decide alone.
PROBES = 2
SAMPLE = "sample"
_SEED = 20260512
_REDRAWS = 8


@dataclasses.dataclass(frozen=True)
class Input:
  """One call both models are run on: the sample, or a probe made from it."""

  name: str  # "sample", "probe 1", ...
  args: tuple[object, ...]
  kwargs: dict[str, object]


def _is_array(leaf: object) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray)) and np.ndim(leaf) >= 1


def _kind(leaf: object) -> str | None:
  """'float', 'int' or None (kept as given) for one leaf of the sample."""
  if not _is_array(leaf):
    return None
  dtype = np.dtype(tp.cast(tp.Any, leaf).dtype) if not _is_key(leaf) else None
  if dtype is None or dtype == np.bool_:
    return None
  if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
    return "float"
  if jnp.issubdtype(dtype, jnp.integer):
    return "int"
  return None


def _is_key(leaf: object) -> bool:
  dtype = getattr(leaf, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _all_equal_rows(a: np.ndarray) -> bool:
  """Whether the slices along some axis longer than 1 are all equal (a degenerate draw)."""
  return any(
    a.shape[axis] > 1 and bool(np.all(a == np.take(a, [0], axis=axis))) for axis in range(a.ndim)
  )


def _draw(leaf: object, kind: str, key: jax.Array, vocabulary: int | None) -> object:
  shape, dtype = np.shape(tp.cast(tp.Any, leaf)), tp.cast(tp.Any, leaf).dtype
  if kind == "float":
    return jax.random.normal(key, shape, dtype)
  if vocabulary is not None:
    lo, hi = 0, vocabulary - 1
  else:
    values = np.asarray(leaf)
    lo, hi = int(values.min()), int(values.max())
  if lo == hi:
    return leaf  # nothing but this value is known to be valid here
  out = jax.random.randint(key, shape, lo, hi + 1, dtype)
  for n in range(_REDRAWS):
    if not _all_equal_rows(np.asarray(out)):
      break
    out = jax.random.randint(jax.random.fold_in(key, n + 1), shape, lo, hi + 1, dtype)
  return out


def make_inputs(
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, object],
  vocabulary: tp.Callable[[object], int | None],
) -> list[Input]:
  """The sample first, then `PROBES` probes of its structure.

  Args:
    sample_args: the user's positional sample arguments.
    sample_kwargs: the user's keyword sample arguments.
    vocabulary: for an integer leaf of the sample, the vocabulary of the embedding it
      indexes (None: draw within the sample's range).
  """
  inputs = [Input(SAMPLE, tuple(sample_args), dict(sample_kwargs))]
  leaves, treedef = jax.tree.flatten((tuple(sample_args), dict(sample_kwargs)))
  kinds = [_kind(leaf) for leaf in leaves]
  vocab = [vocabulary(leaf) if kind == "int" else None for leaf, kind in zip(leaves, kinds)]
  for p in range(PROBES):
    key = jax.random.fold_in(jax.random.key(_SEED), p)
    drawn = [
      leaf if kind is None else _draw(leaf, kind, jax.random.fold_in(key, i), v)
      for i, (leaf, kind, v) in enumerate(zip(leaves, kinds, vocab))
    ]
    args, kwargs = jax.tree.unflatten(treedef, drawn)
    inputs.append(Input(f"probe {p + 1}", tuple(args), dict(kwargs)))
  return inputs


def same_array(a: object, b: object) -> bool:
  """Whether two leaves are the same integer array (a recorded call's input and a sample's)."""
  return (
    _is_array(a)
    and _is_array(b)
    and np.shape(tp.cast(tp.Any, a)) == np.shape(tp.cast(tp.Any, b))
    and not _is_key(a)
    and not _is_key(b)
    and np.asarray(a).dtype == np.asarray(b).dtype
    and bool(np.array_equal(np.asarray(a), np.asarray(b)))
  )
