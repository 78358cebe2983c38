"""Where a site's records live: in device memory (the default) or in host memory.

`memory=` on `lb.lazy_init` / `lb.preallocate` is `"device"`, `"host"`, or a mapping whose keys
are those of `capacity=` (a collection name, a `/`-joined sow path, a glob of one) and whose
values are `"device"` or `"host"`; a site no key covers stays on the device.

A host record is a buffer in the device's `pinned_host` memory. Each write moves the sown value
there from inside the compiled step (`jax.device_put` to the host sharding, then an in-place
update of one slot), so a loop's records may exceed the device's memory: only one step's value
is on the device at a time. No Python callback runs per step.

Why `pinned_host`: it is the host memory XLA writes into from inside a compiled program
(`unpinned_host` is refused there on a TPU: "CompileTimeHostOffloadOutputLocationMismatch").
Eager JAX operations on a host array do not run on every backend (a slice of one never returned
on a TPU), so host records are read back through NumPy (`np.asarray`), never with `jnp`.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import typing as tp

import jax
import numpy as np
from flax.core import FrozenDict
from jax.sharding import NamedSharding

from .._compat import installed_versions, single_device_sharding
from .errors import CapacityError

Memory = tp.Literal["device", "host"]
MEMORIES: tuple[Memory, ...] = tp.get_args(Memory)
MemorySpec = Memory | tp.Mapping[str, Memory]
SiteKey = tuple[str, ...]
HOST_KIND = "pinned_host"

_HELP = (
  "Pass memory='device' (the default), memory='host', or a mapping from a collection name, a "
  "'/'-joined sow path or a glob of one to 'device' or 'host' (memory={'intermediates': "
  "'host'}); sites no key covers stay on the device."
)


def check_memory_spec(memory: object) -> str | FrozenDict[str, str] | None:
  """Validate the form of `memory=` before any model code runs."""
  if memory is None:
    return None
  if isinstance(memory, tp.Mapping):
    if not memory:
      raise CapacityError(f"memory={{}} places nothing. {_HELP}")
    out: dict[str, str] = {}
    for key, value in tp.cast(tp.Mapping[object, object], memory).items():
      if not isinstance(key, str) or not key:
        raise CapacityError(f"memory key {key!r} must be a non-empty string. {_HELP}")
      out[key] = _check_one(value, f"memory[{key!r}]")
    return FrozenDict(out)
  return _check_one(memory, "memory")


def _check_one(value: object, where: str) -> Memory:
  if not isinstance(value, str) or value not in MEMORIES:
    raise CapacityError(f"{where}={value!r} is not a place loopbridge keeps records. {_HELP}")
  return tp.cast(Memory, value)


def resolve_memory(
  spec: str | tp.Mapping[str, str] | None, sites: tp.Sequence[SiteKey]
) -> dict[SiteKey, str]:
  """Every site's memory: the most specific key wins (exact path, glob, collection)."""
  if spec is None or spec == "device":
    return dict.fromkeys(sites, "device")
  if not isinstance(spec, tp.Mapping):
    return dict.fromkeys(sites, spec)
  out: dict[SiteKey, str] = {}
  used: set[str] = set()
  for site in sites:
    path = "/".join(site[1:])
    globs = [k for k in spec if any(c in k for c in "*?[") and fnmatch.fnmatchcase(path, k)]
    if path in spec:
      key = path
    elif globs:
      if len({spec[k] for k in globs}) > 1:
        raise CapacityError(
          f"sow site {'/'.join(site)} matches memory globs with different places: "
          + ", ".join(f"{k!r}: {spec[k]!r}" for k in globs)
          + ". Fix: add an exact key for this path, or make the globs disjoint."
        )
      key = globs[0]
      used.update(globs)
    elif site[0] in spec:
      key = site[0]
    else:
      out[site] = "device"
      continue
    used.add(key)
    out[site] = spec[key]
  unused = [k for k in spec if k not in used]
  if unused:
    listing = ", ".join(f"{s[0]}: {'/'.join(s[1:])!r}" for s in sites)
    raise CapacityError(
      f"memory key(s) {unused} match no sow site of this call. Why: a key that matches nothing "
      f"is usually a typo and would leave records on the device. The sites of this call are: "
      f"{listing or 'none'}."
    )
  return out


def host_sharding(
  layout: NamedSharding | None, label: str, slots: int, shape: tuple[int, ...], dtype: np.dtype
) -> jax.sharding.Sharding:
  """The host-memory sharding of a record buffer (its device layout kept, if it has one).

  Refused where this JAX and backend cannot compile the very write the record makes for one
  `shape`/`dtype` value into its `slots` (see `_compiled_host_write_failure`)."""
  devices = [jax.devices()[0]] if layout is None else list(np.asarray(layout.mesh.devices).flat)
  kinds = {m.kind for d in devices for m in d.addressable_memories()}
  if HOST_KIND not in kinds:
    raise CapacityError(
      f"sow site {label} was declared with memory='host', but the devices here have no "
      f"'{HOST_KIND}' memory (they have: {', '.join(sorted(kinds)) or 'none listed'}). Why: host "
      "records are written by the compiled step into pinned host memory, which this JAX and "
      "backend do not offer. Fix: keep the records on the device (memory='device', the "
      "default), or use a JAX whose backend lists pinned_host memory (GPUs and TPUs do; "
      "the CPU backend does in newer jax releases, e.g. jax 0.10)."
    )
  value_bytes = max(1, math.prod(shape) * np.dtype(dtype).itemsize)
  probe_slots = max(3, min(slots, _PROBE_BYTES // value_bytes))
  failure = _compiled_host_write_failure(devices[0], probe_slots, tuple(shape), np.dtype(dtype))
  if failure is not None:
    version = installed_versions()["jax"]
    path = label.split("/", 1)[-1]
    raise CapacityError(
      f"sow site {label} was declared with memory='host', but this JAX ({version}) on "
      f"the {devices[0].platform} backend cannot compile the write of one "
      f"{np.dtype(dtype).name}{list(shape)} value into '{HOST_KIND}' memory: {failure}. "
      "Why: host records are written by the compiled step itself; a write this JAX cannot "
      "compile would fail at the first step. Fix: keep this site's records on the device "
      f"(memory={{{path!r}: 'device'}}, or memory='device' for all), or use a JAX that "
      "compiles it (jax 0.10 on the CPU backend does). Where it names lane slices (a TPU), "
      "the value's shape and the slot count are what the write cannot take (a scalar, "
      "float32[2, 4] in 7 slots); a TPU v5e wrote others (float32[8], [8, 128], [2, 4, 8] "
      "in 6 slots), so a sow of another shape may be taken: the same probe decides."
    )
  if layout is not None:
    return layout.with_memory_kind(HOST_KIND)
  return single_device_sharding(devices[0], memory_kind=HOST_KIND)


# A probe's buffer holds the record's own number of slots up to this size: a TPU lays a host
# buffer out by its shape (float32[7, 2, 4] with the slot axis innermost, which the write then
# cannot take; float32[4, 2, 4] not), so a probe of another slot count proves nothing.
_PROBE_BYTES = 1 << 28


@functools.cache
def _compiled_host_write_failure(
  device: tp.Any, slots: int, shape: tuple[int, ...], dtype: np.dtype
) -> str | None:  # device: a jax.Device
  """Why a compiled one-slot write of a `shape`/`dtype` value into `pinned_host` memory fails
  on `device`, or None.

  Listing the memory is not enough: jax 0.7's CPU backend lists `pinned_host` but its traced
  arguments carry no memory space, so the write a host record makes (`write_host_slot`: a
  value put to the host, then a slot update) fails to trace; jax 0.8's traces it but hands the
  result back in device memory. A TPU v5e (jax 0.10.2) compiles it for some value
  shapes and not others, and not the same inside a loop of several steps as in one step
  outside a loop ("Lane slice updating is not supported in async dynamic update slice": a
  scalar, and float32[2, 4] outside a loop; float32[8], [128], [8, 128], [2, 4, 8], [4096, 4096]
  were written both ways). The probe runs the stricter form, one write at a traced slot outside
  any loop (what `lb.compile_step` and a jitted single step do), once per device, shape and
  dtype, on a buffer of the record's slots (as many as fit `_PROBE_BYTES` for a larger
  record), and checks where and what it wrote."""
  host = single_device_sharding(device, memory_kind=HOST_KIND)
  try:
    buffer = host_zeros((slots, *shape), dtype, host)
    value = jax.device_put(np.ones(shape, dtype), device)
    out = jax.jit(functools.partial(write_host_slot, host=host))(buffer, value, np.int32(2))
    written = np.asarray(out)
  except Exception as error:  # any failure means: not on this JAX and backend
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
  if out.sharding.memory_kind != HOST_KIND or not (
    (np.delete(written, 2, axis=0) == 0).all() and (written[2] == 1).all()
  ):
    return f"the probe's write landed in '{out.sharding.memory_kind}' memory as {written}"
  return None


def write_host_slot(
  buffer: jax.Array, value: jax.Array, slot: tp.Any, host: jax.sharding.Sharding
) -> jax.Array:
  """`value` written into slot `slot` of a host-memory `buffer` from inside a compiled step:
  moved to host memory (`host`), then the slot updated. What a host record does each step
  (`buffers._write_host_slots`), and what the declaration's probe compiles."""
  fresh = jax.device_put(jax.numpy.expand_dims(value, 0), host)
  return jax.lax.dynamic_update_slice(buffer, fresh, (slot,) + (0,) * (buffer.ndim - 1))


def is_host(buffer: object) -> bool:
  """Whether a record buffer lives in host memory (its `memory` metadata)."""
  return getattr(buffer, "memory", "device") == "host"


def host_zeros(shape: tuple[int, ...], dtype: np.dtype, sharding: jax.sharding.Sharding):
  """A zero array placed straight in host memory, never first on the device (which a record
  larger than the device could not fit).

  Moved from a broadcast NumPy zero, which holds one element: on a TPU v5e host (jax 0.10.2) a
  4 GB record made that way took 4 GB of host memory, made from `np.zeros` (or `np.empty`) it
  took 8 GB, the array's pages as well as the record's. A compiled program with its output in
  host memory is no way round it: it fills the output on the device first (refused beyond the
  device's memory) and its result does not carry the host memory space a write needs."""
  return jax.device_put(np.broadcast_to(np.zeros((), dtype), shape), sharding)
