"""Declare stage: turn discovered sites into buffers on their recorders.

One declaration covers one root and one call: the capacity spec is resolved once against every
site the call makes (keys are paths from the root, so a bare `lb.ToNNX` uses its own paths), the
overflow policy and the buffer layouts are chosen, and each recorder gets a `Buffer`/`Count`
pair per site. A site whose storage (shape, dtype, capacity, policy) is unchanged keeps its
buffer and what it recorded; sites the call does not make keep theirs too.
"""

from __future__ import annotations

import dataclasses
import typing as tp
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from . import _buffers
from . import _capacity
from . import _compat
from . import _native_hook
from . import _recorder
from . import _sharding
from ._errors import DroppedSowWarning
from ._site import DroppedSow, SowSite


@dataclasses.dataclass
class Part:
  """One recorder's share of a declaration."""

  path: tuple[tp.Any, ...]  # from the root
  node: tp.Any  # the recorder module
  sites: list[SowSite]  # what the call sows there, capacity/overflow not yet set
  # lb.ToNNX defaults from its constructor (None for native modules).
  default_capacity: _capacity.CapacitySpec | None = None
  default_overflow: str | None = None
  dropped: list[DroppedSow] = dataclasses.field(default_factory=list)


def global_key(part: Part, site: SowSite) -> tuple[str, ...]:
  """The site's key from the root: collection, then the recorder's path, then the site path."""
  return (site.collection, *map(str, part.path), *site.path)


def _capacities(parts: list[Part], capacity: _capacity.CapacitySpec | None,
                model_name: str) -> dict[int, dict[tuple[str, ...], int]]:
  """Capacity per (part index, site key)."""
  out: dict[int, dict[tuple[str, ...], int]] = {}
  if capacity is not None:
    keys = {global_key(p, s): (i, s.key) for i, p in enumerate(parts) for s in p.sites}
    resolved = _capacity.resolve_capacities(capacity, sorted(keys), model_name=model_name)
    for key, (i, local) in keys.items():
      out.setdefault(i, {})[local] = resolved[key]
    return out
  # No capacity at the entry: each lb.ToNNX falls back to its constructor's; native sites have
  # none (the error lists every site still uncovered).
  uncovered = []
  for i, part in enumerate(parts):
    if part.default_capacity is not None and part.sites:
      local = _capacity.resolve_capacities(part.default_capacity, [s.key for s in part.sites],
                                           model_name=model_name)
      out[i] = local
    else:
      uncovered.extend(global_key(part, s) for s in part.sites)
  if uncovered:
    _capacity.resolve_capacities(None, sorted(uncovered), model_name=model_name)
  return out


def declare(parts: list[Part], *, capacity: _capacity.CapacitySpec | None,
            overflow: str | None, shardings_from: tuple[tp.Any, tp.Any], model_name: str) -> None:
  """(Re)declare the buffers of every part. `capacity`/`overflow` were validated by the entry."""
  capacities = _capacities(parts, capacity, model_name)
  for i, part in enumerate(parts):
    for dropped in part.dropped:
      warnings.warn(dropped.warning_text(), DroppedSowWarning, stacklevel=5)
    policy = overflow or part.default_overflow or "error"
    sites = [dataclasses.replace(s, capacity=capacities[i][s.key], overflow=policy)
             for s in part.sites]
    layouts = _sharding.infer_buffer_shardings(
        *shardings_from, {s.key: (s.shape, s.sown_shape) for s in sites if not s.stack_axes})
    _declare_part(part, sites, layouts)
  _recorder.bump_generation()


def _declare_part(part: Part, sites: list[SowSite], layouts: dict) -> None:
  node = part.node
  _recorder.make_recorder(node)
  buffers = getattr(node, _recorder.BUFFERS_ATTR)
  counts = getattr(node, _recorder.COUNTS_ATTR)
  declared = {s.key: s for s in (_recorder.sites_of(node) or ())}
  for site in sites:
    old = declared.get(site.key)
    same_storage = (old is not None and isinstance(_recorder.get_nested(buffers, site.key),
                                                   _buffers.Buffer)
                    and (old.buffer_shape, old.dtype, old.overflow)
                    == (site.buffer_shape, site.dtype, site.overflow))
    layout = layouts.get(site.key)
    if same_storage and layout is not None:
      # Same storage, a new layout inferred from these sample arguments: move what it holds.
      buffer = _recorder.get_nested(buffers, site.key)
      names, _ = _compat.variable_sharding(buffer)
      if names != tuple(layout.spec):
        _recorder.set_nested(buffers, site.key, _buffers.Buffer(
            jax.device_put(_compat.variable_value(buffer), layout), overflow=site.overflow,
            **_sharding.buffer_metadata(layout)))
    if not same_storage:
      stack = site.shape[:site.stack_axes]
      _recorder.set_nested(buffers, site.key, _buffers.new_buffer(
          site.capacity, site.value_shape, np.dtype(site.dtype), site.overflow,
          layout, stack=stack))
      _recorder.set_nested(counts, site.key, _buffers.Count(jnp.zeros(stack, _buffers.COUNT_DTYPE)))
    declared[site.key] = site
  _compat.set_data_attribute(node, _recorder.BUFFERS_ATTR, buffers)
  _compat.set_data_attribute(node, _recorder.COUNTS_ATTR, counts)
  setattr(node, _recorder.SITES_ATTR, tuple(declared[k] for k in sorted(declared)))
  if part.dropped:
    known = {(d.collection, d.module_path, d.name) for d in vars(node).get(_recorder.DROPPED_ATTR, ())}
    new = tuple(d for d in part.dropped if (d.collection, d.module_path, d.name) not in known)
    setattr(node, _recorder.DROPPED_ATTR, vars(node).get(_recorder.DROPPED_ATTR, ()) + new)
  if sites:
    _native_hook.install(type(node))
