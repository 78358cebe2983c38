"""The recorder: where a module keeps its buffers, counts and declared sites.

A *recorder* is any NNX module holding the namespaced attributes below: `lb.ToNNX` for its Linen
sows, and every native module that sows (its buffers sit on the module that calls `sow`, so NNX
transforms over stacked modules slice them like parameters). Buffers are a nested dict, Linen-shaped
(collection first); the counts of all its sites are one `Count` vector (one argument of a compiled
step, however many sites), each site's entry at its `SowSite.count_index`; the declared `SowSite`s
are a static tuple (part of the GraphDef). Attribute names are namespaced because
`ToNNX.__getattr__` forwards unknown names to the Linen module and users' Linen variables become
attributes too.

Every declaration bumps a process-wide generation number, so code that cached a model's
Variables (`lb.compile_step`) knows cheaply when it must look again.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing as tp

from flax import nnx

from .. import _compat
from . import buffers
from .site import SowSite

BUFFERS_ATTR = "loopbridge__buffers"
COUNTS_ATTR = "loopbridge__counts"
SITES_ATTR = "loopbridge__sites"
DROPPED_ATTR = "loopbridge__dropped"  # lb.ToNNX: sows Linen discarded (static DroppedSow tuple)
# lb.ToNNX during lazy_init only: a SiteProbe per sow site, so a copy inside an NNX transform
# can be found (and its stacked shape read) after the call; removed by the pipeline.
PROBES_ATTR = "loopbridge__probes"

_generation = itertools.count(1)
_current_generation = 0


def bump_generation() -> int:
  """Mark that some recorder's buffers were (re)declared; returns the new generation."""
  global _current_generation
  _current_generation = next(_generation)
  return _current_generation


def generation() -> int:
  """The current declaration generation (changes whenever any buffer is re-declared)."""
  return _current_generation


def is_recorder(node: object) -> bool:
  return isinstance(node, nnx.Module) and BUFFERS_ATTR in vars(node)


def sites_of(node: object) -> tuple[SowSite, ...] | None:
  """The declared sites of a recorder (None before any declaration)."""
  return vars(node).get(SITES_ATTR)


def iter_recorders(model: tp.Any) -> tp.Iterator[tuple[tuple[tp.Any, ...], nnx.Module]]:
  """Every recorder in `model`'s graph with its path from the root (the root itself: `()`)."""
  if not isinstance(model, nnx.Module):
    raise TypeError(
      f"expected an NNX module holding loopbridge buffers (e.g. lb.ToNNX), got "
      f"{type(model).__name__}."
    )
  for path, node in _compat.iter_graph(model):
    if is_recorder(node):
      yield tuple(path), node


def counts_of(recorder: nnx.Module) -> buffers.Count | None:
  """The recorder's Count vector (None before its first site is declared)."""
  counts = vars(recorder).get(COUNTS_ATTR)
  return counts if isinstance(counts, buffers.Count) else None


def count_index(recorder: nnx.Module, key: tuple[str, ...]) -> int:
  """The site `key`'s entry in the recorder's Count vector (KeyError when not declared)."""
  for site in sites_of(recorder) or ():
    if site.key == key:
      return site.count_index
  raise KeyError(key)


def count_indices(recorder: nnx.Module) -> dict[tuple[str, ...], int]:
  """Each declared site's entry in the Count vector, by site key."""
  return {s.key: s.count_index for s in sites_of(recorder) or ()}


def pairs(
  recorder: nnx.Module,
) -> tp.Iterator[tuple[tuple[str, ...], buffers.Buffer, int]]:
  """(site key, Buffer, entry in the Count vector) per buffer of one recorder, by sorted key."""
  index = count_indices(recorder)

  def walk(tree_b, prefix):
    if isinstance(tree_b, buffers.Buffer):
      yield prefix, tree_b, index[prefix]
      return
    for key in sorted(tree_b):
      yield from walk(tree_b[key], (*prefix, key))

  yield from walk(getattr(recorder, BUFFERS_ATTR), ())


def get_nested(tree: tp.Any, path: tp.Sequence[str]) -> tp.Any:
  for key in path:
    if not isinstance(tree, tp.Mapping) or key not in tree:
      return None
    tree = tree[key]
  return tree


def set_nested(tree: dict, path: tp.Sequence[str], value: tp.Any) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def make_recorder(node: nnx.Module) -> None:
  """Give `node` an empty buffer tree (idempotent); its Count vector comes with its first site."""
  if BUFFERS_ATTR not in vars(node):
    _compat.set_data_attribute(node, BUFFERS_ATTR, {})


def shift_stack_axes(module: nnx.Module, layers: int | None) -> None:
  """Keep the record bookkeeping of `module`'s recorders in step with a new layer axis.

  A recorder's buffers say how many leading stack axes they carry (`stack_axes`), and its
  declared sites give the stacked value shape: reads put the record index first by them, so a
  layer axis added (`layers`: its size) or removed (`layers=None`) by stacking must be counted.
  """
  by = 1 if layers is not None else -1
  for _, node in iter_recorders(module):
    for _, buffer, _ in pairs(node):
      axes = max((getattr(buffer, "stack_axes", 0) or 0) + by, 0)
      if axes:
        _compat.set_variable_metadata(buffer, "stack_axes", axes)
      else:  # as a buffer that was never stacked has it, so the two stack together again
        _compat.drop_variable_metadata(buffer, "stack_axes")
    sites = sites_of(node)
    if sites:
      setattr(
        node,
        SITES_ATTR,
        tuple(
          dataclasses.replace(s, shape=(layers, *s.shape), stack_axes=s.stack_axes + 1)
          if layers is not None
          else dataclasses.replace(s, shape=s.shape[1:], stack_axes=s.stack_axes - 1)
          if s.stack_axes
          else s
          for s in sites
        ),
      )
