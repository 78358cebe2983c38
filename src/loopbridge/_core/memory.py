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
import typing as tp

import jax
import numpy as np
from flax.core import FrozenDict
from jax.sharding import NamedSharding

from .._compat import single_device_sharding
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


def host_sharding(layout: NamedSharding | None, label: str) -> jax.sharding.Sharding:
  """The host-memory sharding of a record buffer (its device layout kept, if it has one)."""
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
  failure = _compiled_host_write_failure(devices[0])
  if failure is not None:
    raise CapacityError(
      f"sow site {label} was declared with memory='host', but this JAX ({jax.__version__}) on "
      f"the {devices[0].platform} backend cannot write into '{HOST_KIND}' memory from a "
      f"compiled program: {failure}. Why: host records are written by the compiled step "
      "itself; a JAX that cannot compile that write would fail at the first step. Fix: keep "
      "the records on the device (memory='device', the default), or use a newer JAX (jax 0.10 "
      "compiles them on the CPU backend; GPUs and TPUs do)."
    )
  if layout is not None:
    return layout.with_memory_kind(HOST_KIND)
  return single_device_sharding(devices[0], memory_kind=HOST_KIND)


@functools.cache
def _compiled_host_write_failure(device: tp.Any) -> str | None:  # a jax.Device
  """Why a compiled one-slot write into `pinned_host` memory fails on `device`, or None.

  Listing the memory is not enough: jax 0.7's CPU backend lists `pinned_host` but its traced
  arguments carry no memory space, so the write a host record makes (`_write_host_slots` in
  buffers.py: a value put to the host, then a slot update) fails to trace; jax 0.8's traces it
  but hands the result back in device memory. The probe runs that very write once per device
  on a two-slot buffer and checks where and what it wrote."""
  host = single_device_sharding(device, memory_kind=HOST_KIND)

  def write(buffer: jax.Array, value: jax.Array) -> jax.Array:
    fresh = jax.device_put(value[None], host)
    return jax.lax.dynamic_update_slice(buffer, fresh, (1,))

  try:
    buffer = jax.device_put(np.zeros(2, np.float32), host)
    out = jax.jit(write)(buffer, jax.device_put(np.ones(1, np.float32)[0], device))
    written = np.asarray(out)
  except Exception as error:  # any failure means: not on this JAX and backend
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
  if out.sharding.memory_kind != HOST_KIND or written.tolist() != [0.0, 1.0]:
    return f"the probe's write landed in '{out.sharding.memory_kind}' memory as {written}"
  return None


def is_host(buffer: object) -> bool:
  """Whether a record buffer lives in host memory (its `memory` metadata)."""
  return getattr(buffer, "memory", "device") == "host"


def host_zeros(shape: tuple[int, ...], dtype: np.dtype, sharding: jax.sharding.Sharding):
  """A zero array placed straight in host memory (never first on the device, which a record
  larger than the device could not fit)."""
  return jax.device_put(np.zeros(shape, dtype), sharding)
