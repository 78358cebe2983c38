"""Count vectors in checkpoints: format 2 saves them, format 1 (loopbridge 0.2) had scalars.

A recorder keeps the counts of all its sites in one `Count` vector, an entry per site
(`SowSite.count_index`), saved at `<recorder path>/loopbridge__counts`. loopbridge 0.2 saved
one scalar per site instead, at `<recorder path>/loopbridge__counts/<site key>`; restoring such
a checkpoint reads those scalars and puts each into its site's entry.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
import numpy as np

from .._core import recorder

Path = tuple[str, ...]
# Per recorder, by the saved path of its Count vector: each site's entry, by site key.
Entries = dict[Path, dict[Path, int]]


def entries(model: object, key_str: tp.Callable[[object], str]) -> Entries:
  """Each recorder's site entries, by the saved path of its Count vector (`key_str`: one
  graph path step as the checkpoint spells it)."""
  out: Entries = {}
  for path, node in recorder.iter_recorders(model):
    if recorder.counts_of(node) is not None:
      out[(*map(key_str, path), recorder.COUNTS_ATTR)] = recorder.count_indices(node)
  return out


def read_per_site(
  vectors: Entries,
  expected: dict[Path, tuple[tuple[int, ...], np.dtype]],
  target: dict[Path, jax.ShapeDtypeStruct],
) -> None:
  """Expect a format 1 checkpoint's scalar per site (with the stack axes) instead of each
  vector: `expected` (shapes, dtypes) and `target` (what orbax reads) are rewritten."""
  for vector_key, sites in vectors.items():
    shape, dtype = expected.pop(vector_key)
    # Each scalar is read where its vector lives (orbax warns about a target without one).
    sharding = target.pop(vector_key).sharding
    for site_key in sites:
      expected[(*vector_key, *site_key)] = (shape[:-1], dtype)
      target[(*vector_key, *site_key)] = jax.ShapeDtypeStruct(shape[:-1], dtype, sharding=sharding)


def stack_per_site(vectors: Entries, restored: dict[Path, jax.Array]) -> None:
  """Replace the scalars `read_per_site` asked for by each recorder's vector, in place."""
  for vector_key, sites in vectors.items():
    by_index = {index: restored.pop((*vector_key, *site)) for site, index in sites.items()}
    restored[vector_key] = jnp.stack([by_index[i] for i in range(len(by_index))], axis=-1)


def site_count(
  vectors: Entries, restored: dict[Path, jax.Array], buffer_key: Path
) -> jax.Array | None:
  """The restored count of the site whose buffer is saved at `buffer_key` (None if unknown)."""
  i = buffer_key.index(recorder.BUFFERS_ATTR)
  vector_key = (*buffer_key[:i], recorder.COUNTS_ATTR)
  index = vectors.get(vector_key, {}).get(buffer_key[i + 1 :])
  if vector_key not in restored or index is None:
    return None
  return restored[vector_key][..., index]
