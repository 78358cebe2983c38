"""Declare stage: turn discovered sites into buffers on their recorders.

One declaration covers one root and one call: the capacity spec is resolved once against every site
the call makes (keys are paths from the root, so a bare `lb.ToNNX` uses its own paths), the overflow
policy and the buffer layouts are chosen, and each recorder gets a `Buffer` per site and an entry
per site in its one `Count` vector (new sites take the next entries: the vector grows here, outside
any loop, never inside one). A site whose storage (shape, dtype, capacity, policy) is unchanged
keeps its buffer and what it recorded; sites the call does not make keep theirs too. A site
re-declared with another capacity or policy keeps its records (copied under the new policy); one
whose value shape changed starts empty, with a `RecordsDiscardedWarning` if it held records. Buffers
that cannot fit in memory are refused before anything is allocated.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing as tp
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from .. import _compat
from . import buffers as _buffers
from . import capacity as _capacity
from . import memory as _memory
from . import native_hook, placement, recorder
from .errors import CapacityError, DroppedSowWarning, RecordsDiscardedWarning
from .site import DroppedSow, SowSite


@dataclasses.dataclass
class Part:
  """One recorder's share of a declaration."""

  path: tuple[tp.Any, ...]  # from the root
  node: nnx.Module  # the recorder module
  sites: list[SowSite]  # what the call sows there, capacity/overflow not yet set
  # An lb.ToNNX's constructor spec (nothing given for native modules).
  default: _capacity.DeclarationSpec = dataclasses.field(default_factory=_capacity.DeclarationSpec)
  dropped: list[DroppedSow] = dataclasses.field(default_factory=list)


def global_key(part: Part, site: SowSite) -> tuple[str, ...]:
  """The site's key from the root: collection, then the recorder's path, then the sow path.

  Every leaf of a sown pytree has the same key: capacity is declared per sow, and its leaves
  share it (they are written together, so they fill together).
  """
  return (site.collection, *map(str, part.path), *site.path)


def _capacities(
  parts: list[Part],
  capacity: _capacity.CapacitySpec | None,
  model_name: str,
  scoped: _capacity.CapacitySpec | None = None,
) -> dict[int, dict[tuple[str, ...], int]]:
  """Capacity per (part index, site key).

  Precedence: the entry's `capacity`, then each lb.ToNNX's constructor capacity, then `scoped`
  (an open `lb.capacity` block) for the sites neither covers.
  """
  out: dict[int, dict[tuple[str, ...], int]] = {}
  if capacity is not None:
    keys: dict[tuple[str, ...], list[tuple[int, tuple[str, ...]]]] = {}
    for i, p in enumerate(parts):
      for s in p.sites:
        keys.setdefault(global_key(p, s), []).append((i, s.key))
    resolved = _capacity.resolve_capacities(capacity, sorted(keys), model_name=model_name)
    for key, locals_ in keys.items():
      for i, local in locals_:
        out.setdefault(i, {})[local] = resolved[key]
    return out
  # No capacity at the entry: each lb.ToNNX falls back to its constructor's; native sites have
  # none but an `lb.capacity` block's (the error lists every site still uncovered).
  uncovered: dict[tuple[str, ...], list[tuple[int, tuple[str, ...]]]] = {}
  for i, part in enumerate(parts):
    if part.default.capacity is not None and part.sites:
      sow_keys = sorted({s.sow_key for s in part.sites})
      local = _capacity.resolve_capacities(part.default.capacity, sow_keys, model_name=model_name)
      out[i] = {s.key: local[s.sow_key] for s in part.sites}
    else:
      for s in part.sites:
        uncovered.setdefault(global_key(part, s), []).append((i, s.key))
  if uncovered:
    resolved = _capacity.resolve_capacities(
      scoped, sorted(uncovered), model_name=model_name, unused_ok=True
    )
    for key, locals_ in uncovered.items():
      for i, local_key in locals_:
        out.setdefault(i, {})[local_key] = resolved[key]
  return out


def declare(
  parts: list[Part],
  *,
  spec: _capacity.DeclarationSpec,
  shardings_from: tuple[tp.Any, tp.Any],
  model_name: str,
  entry: str = "lazy_init",
  scoped_capacity: _capacity.CapacitySpec | None = None,
) -> None:
  """(Re)declare the buffers of every part. `spec` is the entry's, validated there;
  `scoped_capacity` is the entry's `lb.capacity` default (the lowest precedence)."""
  capacities = _capacities(parts, spec.capacity, model_name, scoped_capacity)
  memories = _memory.resolve_memory(
    spec.memory, [global_key(part, s) for part in parts for s in part.sites]
  )
  for i, part in enumerate(parts):
    for dropped in part.dropped:
      warnings.warn(dropped.warning_text(), DroppedSowWarning, stacklevel=5)
    # A re-declared site (same signature, so same slot) keeps the policy it was declared
    # with unless `overflow=` is given.
    declared = {s.key: s.overflow for s in (recorder.sites_of(part.node) or ())}
    placed = _in_slots(
      part.node, [dataclasses.replace(s, capacity=capacities[i][s.key]) for s in part.sites]
    )
    sites = [
      dataclasses.replace(
        s,
        overflow=spec.overflow
        or declared.get(s.key)
        or part.default.overflow
        or _capacity.DEFAULT_OVERFLOW,
      )
      for s in placed
    ]
    layouts = placement.infer_buffer_shardings(
      *shardings_from, {s.key: (s.shape, s.sown_shape) for s in sites if not s.stack_axes}
    )
    hosts = _host_shardings(part, sites, layouts, memories)
    _declare_part(part, sites, layouts, entry, hosts)
  recorder.bump_generation()


def _host_shardings(
  part: Part, sites: list[SowSite], layouts: dict, where: dict[tuple[str, ...], str]
) -> dict[tuple[str, ...], jax.sharding.Sharding]:
  """The host-memory sharding of every site of `part` declared with memory='host'."""
  out = {}
  for site in sites:
    if where.get(global_key(part, site)) != "host":
      continue
    label = "/".join(global_key(part, site))
    if site.stack_axes:
      raise CapacityError(
        f"sow site {label} belongs to a stack of layers and was declared with memory='host'. "
        "Why: the layers of a stack write their records in one vectorized step, which XLA "
        "does not offload to host memory slot by slot. Fix: keep this site on the device "
        "(memory={'...': 'device'} for its path), or record the layers unstacked."
      )
    # "error"/"drop" records hold a spare slot past their capacity (buffers.empty_buffer).
    slots = tp.cast(int, site.capacity) + int(site.overflow != "wrap")
    out[site.key] = _memory.host_sharding(
      layouts.get(site.key), label, slots, tuple(site.shape), np.dtype(site.dtype)
    )
  return out


def _in_slots(node: nnx.Module, sites: list[SowSite]) -> list[SowSite]:
  """Each site in the slot of its call signature: the slot already declared for that
  signature on `node`, else a new one (0 for the node's first signature). A declaration for
  another signature adds buffers beside the others instead of replacing them."""
  declared = recorder.sites_of(node) or ()
  slot_of = {s.signature: s.slot for s in declared}
  next_slot = max((s.slot for s in declared), default=-1) + 1
  placed = []
  for site in sites:
    if site.signature not in slot_of:
      slot_of[site.signature] = next_slot
      next_slot += 1
    placed.append(dataclasses.replace(site, slot=slot_of[site.signature]))
  return placed


_RECORDS_DISCARDED = (
  "lb.{entry}: the buffer of sow site {label} held {n} recorded value(s) that cannot be kept: "
  "{why}. Why: a buffer holds values of one shape. Fix: read them (lb.recorded) before "
  "declaring the new signature, or call lb.reset(model) first to say they are not needed."
)
_RECORDS_LOST = (
  "lb.{entry}: sow site {label} was sown {n} times into capacity {capacity}, so {lost} value(s) "
  "were already not stored; the {kept} it holds move to the new buffer and its count restarts "
  "at {kept}. Fix: declare the larger capacity before the loop runs."
)


def _why_not_kept(site: SowSite, old: _buffers.Buffer) -> str:
  """Why the records of buffer `old` cannot move to `site`'s new buffer ("" if they can)."""
  old_value = _compat.variable_value(old)
  k = getattr(old, "stack_axes", 0) or 0
  if (
    tuple(old_value.shape[:k]) + tuple(old_value.shape[k + 1 :]) == tuple(site.shape)
    and str(old_value.dtype) == site.dtype
    and k == site.stack_axes
    and not k
  ):
    return ""
  if k and k == site.stack_axes:
    return "stacked layers are re-declared empty"
  return (
    f"its values were {tuple(old_value.shape[k + 1 :])} {old_value.dtype} and this call "
    f"sows {site.value_shape} {site.dtype}"
  )


def _pytree_discards(new: list, sites: list[SowSite], buffers: dict) -> dict[tuple, str]:
  """Sown pytrees some leaf of which cannot keep its records: (slot, sow key) -> why.

  The leaves of one sow are one record each call: keeping some leaves' records and not the
  others' would pair values of different calls, so such a sow starts empty on every leaf.
  """
  out: dict[tuple, str] = {}
  for _, site, _ in new:
    existing = recorder.get_nested(buffers, site.key)
    if site.treedef is not None and isinstance(existing, _buffers.Buffer):
      why = _why_not_kept(site, existing)
      if why:
        out.setdefault((site.slot, site.sow_key), f"leaf {site.label}: {why}")
  return out


def _records_cut(
  entry: str, label: str, held: int, capacity: int, policy: _capacity.Overflow | None
) -> str:
  """What a re-declaration to fewer slots than the records held keeps, by the site's policy."""
  kept = {
    "wrap": f"the last {capacity} stay and the oldest {held - capacity} are discarded",
    "drop": f"the first {capacity} stay and the latest {held - capacity} are discarded",
  }.get(
    policy or _capacity.DEFAULT_OVERFLOW,
    f"the first {capacity} stay, the latest {held - capacity} are discarded and reading the "
    "site raises BufferOverflowError (overflow='error')",
  )
  return (
    f"lb.{entry}: sow site {label} held {held} recorded value(s) and is re-declared with "
    f"capacity {capacity}: {kept}. Fix: declare a capacity of at least {held}, or read the "
    "records (lb.recorded) before declaring the smaller capacity."
  )


def _keep_records(
  site: SowSite,
  old: _buffers.Buffer,
  old_count: jax.Array,
  buffer: _buffers.Buffer,
  label: str,
  entry: str,
  why: str = "",
) -> int:
  """Move what `old` recorded into the re-declared `buffer`, or say why it cannot
  (`why`: a reason decided by the caller, e.g. a sibling leaf of a sown pytree).

  `old_count`: the site's entry of the old Count vector. Returns the site's new count.
  """
  n = int(np.max(old_count))
  if n == 0:
    return 0
  why = why or _why_not_kept(site, old)
  if why:
    warnings.warn(
      _RECORDS_DISCARDED.format(entry=entry, label=label, n=n, why=why),
      RecordsDiscardedWarning,
      stacklevel=6,
    )
    return 0
  values, lost = _buffers.kept_values(old, n)
  if lost:
    warnings.warn(
      _RECORDS_LOST.format(
        entry=entry,
        label=label,
        n=n,
        capacity=_buffers.capacity_of(old),
        lost=lost,
        kept=values.shape[0],
      ),
      RecordsDiscardedWarning,
      stacklevel=6,
    )
  capacity = _buffers.capacity_of(buffer)
  if values.shape[0] > capacity:  # a smaller capacity than the records held
    warnings.warn(
      _records_cut(entry, label, values.shape[0], capacity, site.overflow),
      RecordsDiscardedWarning,
      stacklevel=6,
    )
  return _buffers.refill(buffer, values)


def _available_bytes() -> tuple[int | None, str]:
  """Free memory of the default device, or of the host when the device does not say."""
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # some backends do not implement it
    stats = None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), "device memory free"
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "host memory available"
  except (ValueError, OSError, AttributeError):
    return None, ""


def _check_fits(new: list[tuple[str, SowSite, NamedSharding | None]]) -> None:
  """Refuse buffers that cannot be allocated, before allocating any (no raw XLA error)."""
  per_device = 0
  for _, site, layout in new:
    shape = site.buffer_shape
    if layout is not None:
      shape = layout.shard_shape(shape)
    per_device += math.prod(shape) * np.dtype(site.dtype).itemsize
  available, what = _available_bytes()
  if available is not None and per_device > available:
    biggest = sorted(new, key=lambda t: -t[1].buffer_bytes)[:3]
    raise CapacityError(
      f"the buffers declared need {per_device:,} bytes per device but only {available:,} "
      f"bytes of {what} are left (largest: "
      + ", ".join(f"{label} {site.buffer_shape} {site.dtype}" for label, site, _ in biggest)
      + "). Why: every slot of every buffer is allocated up front. Fix: a smaller capacity "
      "(a mapping gives each site its own, e.g. capacity={'intermediates': 64, "
      "'ScanBlock_0/*': 8}), record fewer sites, or shard the buffers over devices."
    )


def _grown_counts(old: _buffers.Count | None, size: int, sites: list[SowSite]) -> jax.Array:
  """The recorder's count vector with `size` entries: the old entries, zeros after them.

  Stacked modules (`nnx.vmap`, `lb.layers.stack`) count per layer: `(*stack, size)`, the stack
  shape of the existing vector, else of the sites.
  """
  if old is not None and _compat.variable_value(old).shape[-1]:
    value = jnp.asarray(_compat.variable_value(old))
    pad = [(0, 0)] * (value.ndim - 1) + [(0, size - value.shape[-1])]
    return jnp.pad(value, pad)
  stack = next((s.shape[: s.stack_axes] for s in sites), ())
  return jnp.zeros((*stack, size), _buffers.COUNT_DTYPE)


def _count_size(counts: _buffers.Count | None) -> int:
  return 0 if counts is None else _compat.variable_value(counts).shape[-1]


def _with_entries(counts: jax.Array, entries: dict[int, int]) -> jax.Array:
  """`counts` with these entries replaced (every layer alike when stacked), in one operation.

  One eager `.at[i].set` per site cost about as much as the rest of a small site's
  declaration (`lb.lazy_init` of a 24-site model, benchmarks/bench_recording.py).
  """
  size = counts.shape[-1]
  mask = np.zeros(size, bool)
  values = np.zeros(size, np.dtype(_buffers.COUNT_DTYPE))
  for index, n in entries.items():
    mask[index], values[index] = True, n
  return jnp.where(mask, values, counts)


def _declare_part(part: Part, sites: list[SowSite], layouts: dict, entry: str, hosts: dict) -> None:
  node = part.node
  recorder.make_recorder(node)
  buffers = getattr(node, recorder.BUFFERS_ATTR)
  declared = {s.key: s for s in (recorder.sites_of(node) or ())}
  next_index = max((s.count_index for s in declared.values()), default=-1) + 1
  prefix = "/".join(map(str, part.path))
  new = []
  for i, site in enumerate(sites):
    old = declared.get(site.key)
    # A re-declared site keeps its entry of the Count vector; a new one takes the next.
    if old is not None:
      site = sites[i] = dataclasses.replace(site, count_index=old.count_index)
    else:
      site = sites[i] = dataclasses.replace(site, count_index=next_index)
      next_index += 1
    existing = recorder.get_nested(buffers, site.key)
    same_storage = (
      old is not None
      and isinstance(existing, _buffers.Buffer)
      and (old.buffer_shape, old.dtype, old.overflow)
      == (site.buffer_shape, site.dtype, site.overflow)
      and _memory.is_host(existing) == (site.key in hosts)
    )
    layout = layouts.get(site.key)
    if same_storage and layout is not None and site.key not in hosts:
      # Same storage, a new layout inferred from these sample arguments: move what it holds.
      names, _ = _compat.variable_sharding(existing)
      if names != tuple(layout.spec):
        recorder.set_nested(
          buffers,
          site.key,
          _buffers.placed_buffer(
            jax.device_put(_compat.variable_value(existing), layout),
            overflow=site.overflow,
            **placement.buffer_metadata(layout),
          ),
        )
    if not same_storage:
      label = "/".join(filter(None, (prefix, *site.key)))
      new.append((label, site, layout))
    declared[site.key] = site
  discards = _pytree_discards(new, sites, buffers)
  renewed = {id(site) for _, site, _ in new}
  for site in sites:  # the other leaves of such a pytree start empty too
    if (site.slot, site.sow_key) in discards and id(site) not in renewed:
      new.append(("/".join(filter(None, (prefix, *site.key))), site, layouts.get(site.key)))
  _check_fits([(label, site, layout) for label, site, layout in new if site.key not in hosts])
  old_size = _count_size(recorder.counts_of(node))
  counts = _grown_counts(recorder.counts_of(node), next_index, sites)
  entries: dict[int, int] = {}  # count index -> the count its new buffer starts from
  for label, site, layout in new:
    existing = recorder.get_nested(buffers, site.key)
    stack = site.shape[: site.stack_axes]
    buffer = _buffers.new_buffer(
      site.capacity,
      site.value_shape,
      np.dtype(site.dtype),
      site.overflow,
      layout,
      stack=stack,
      host=hosts.get(site.key),
    )
    n = 0
    if isinstance(existing, _buffers.Buffer):  # re-declared: keep what it recorded if it can
      n = _keep_records(
        site,
        existing,
        counts[..., site.count_index],
        buffer,
        label,
        entry,
        why=discards.get((site.slot, site.sow_key), ""),
      )
    if n or site.count_index < old_size:  # the grown entries are zeros already
      entries[site.count_index] = n
    recorder.set_nested(buffers, site.key, buffer)
  if entries:
    counts = _with_entries(counts, entries)
  _compat.set_data_attribute(node, recorder.BUFFERS_ATTR, buffers)
  if next_index:
    old_counts = recorder.counts_of(node)
    if old_counts is not None and _compat.variable_value(old_counts).shape == counts.shape:
      _compat.set_variable_value(old_counts, counts)  # same sites: the same Variable
    else:
      _compat.set_data_attribute(node, recorder.COUNTS_ATTR, _buffers.Count(counts))
  setattr(
    node, recorder.SITES_ATTR, tuple(sorted(declared.values(), key=lambda s: (s.slot, s.key)))
  )
  if part.dropped:
    known = {
      (d.collection, d.module_path, d.name) for d in vars(node).get(recorder.DROPPED_ATTR, ())
    }
    new_dropped = tuple(
      d for d in part.dropped if (d.collection, d.module_path, d.name) not in known
    )
    setattr(node, recorder.DROPPED_ATTR, vars(node).get(recorder.DROPPED_ATTR, ()) + new_dropped)
  if sites:
    native_hook.install(type(node))
