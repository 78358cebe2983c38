"""Preallocated record buffers: the Variable types, the O(1) in-place append, and read-back.

One sow site owns a `Buffer` of shape `(capacity, *value_shape)`; the values sown at each site
since the last reset are counted in one int32 `Count` vector per recorder, one entry per site
(a count keeps going past `capacity`, so overflow is visible). One vector rather than a scalar
per site: a compiled step passes each array as one argument, and every argument costs about a
microsecond of dispatch. The site's entry is a fixed index (`SowSite.count_index`). The
overflow policy travels with the Buffer as static Variable metadata, so any code holding the
buffer and its count can append or read without looking anything up.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .. import _compat
from . import memory as _memory
from . import placement
from .capacity import Overflow
from .errors import BufferOverflowError, NotDeclaredError, StackError

COUNT_DTYPE = jnp.int32
# A count stops here instead of wrapping around to negative numbers (which would read back as
# an empty record); reading a buffer whose count reached it is an error.
COUNT_LIMIT = int(np.iinfo(np.int32).max)


class Buffer(nnx.Variable):
  """Preallocated storage of one sow site: shape `(capacity, *value_shape)`, the sown dtype.

  Metadata: `overflow` (`"error"`, `"drop"` or `"wrap"`). Filter with
  `nnx.state(model, lb.Buffer)`.

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3)
    >>> [b.shape for b in jax.tree.leaves(nnx.state(model, lb.Buffer))]
    [(3, 2)]
  """


class Count(nnx.Variable):
  """Values sown at each site of one recorder since the last reset: an int32 vector.

  One entry per declared site (a count may exceed the capacity); read them by site with
  `lb.counts`. Modules stacked with a layer axis (`nnx.vmap`, `lb.layers.stack`) hold
  `(*stack, sites)`.

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3)
    >>> _ = model(jnp.ones(2)); _ = model(jnp.ones(2))
    >>> [c.tolist() for c in jax.tree.leaves(nnx.state(model, lb.Count))]
    [[2]]
  """


def new_buffer(
  capacity: int,
  shape: tp.Sequence[int],
  dtype: jax.typing.DTypeLike,
  overflow: Overflow,
  sharding: jax.sharding.Sharding | None = None,
  stack: tp.Sequence[int] = (),
  host: jax.sharding.Sharding | None = None,
) -> Buffer:
  """A zero-filled Buffer for `capacity` values of `shape`/`dtype`.

  `stack`: leading axes of a module stacked with `nnx.vmap` (its buffer is
  `(*stack, capacity, *shape)`, so NNX transforms slice it like the module's parameters).
  `host`: the host-memory sharding of a host record (`memory.host_sharding`); the buffer is
  made there directly and remembers it, so every write moves its value there.
  """
  full = (*stack, capacity, *shape)
  if host is not None:
    # "error"/"drop" keep the first `capacity` values: a host record has one spare slot after
    # them that writes past the end go to (see `_write_host_slots`).
    spare = int(overflow != "wrap")
    return placed_buffer(
      _memory.host_zeros((capacity + spare, *shape), np.dtype(dtype), host),
      overflow=overflow,
      memory="host",
      host_sharding=host,
      spare_slots=spare,
    )
  value = jnp.zeros(full, dtype)
  if sharding is not None:
    value = jax.device_put(value, sharding)
  # A NamedSharding is also kept as NNX partitioning metadata: writes re-apply it (see
  # `placement`), and `nnx.get_partition_spec` sees it like a param's.
  metadata = placement.buffer_metadata(sharding)
  if stack:
    metadata["stack_axes"] = len(stack)
  return placed_buffer(value, overflow=overflow, **metadata)


def placed_buffer(value: tp.Any, **metadata: tp.Any) -> Buffer:
  """A Buffer holding `value`, which is already placed as its partitioning metadata says.

  flax's eager sharding (0.12) has nothing left to do, and flax 0.12.0's constrains against the
  context mesh only (ignoring the `mesh` metadata), which fails outside one: it is off here.
  """
  with _compat.no_eager_sharding():
    return Buffer(value, **metadata)


def new_counts(sites: int, stack: tp.Sequence[int] = ()) -> Count:
  """A zero Count vector for `sites` sites (`stack`: leading axes of a stacked module)."""
  return Count(jnp.zeros((*stack, sites), COUNT_DTYPE))


def site_count(counts: Count, index: int) -> jax.Array:
  """The count of the site at `index` (with the stack axes of a stacked module)."""
  return _compat.variable_value(counts)[..., index]


def set_site_count(counts: Count, index: int, value: int | jax.Array) -> None:
  """Write one site's entry in place; the vector keeps its shape (a loop carry stays valid)."""
  vector = _compat.variable_value(counts)
  _compat.set_variable_value(counts, jnp.asarray(vector).at[..., index].set(value))


def overflow_of(buffer: Buffer) -> Overflow:
  return buffer.overflow


def capacity_of(buffer: Buffer) -> int:
  """The number of values a buffer keeps (a host record's spare slot not counted)."""
  return _compat.variable_value(buffer).shape[0] - _spare_slots(buffer)


def _spare_slots(buffer: Buffer) -> int:
  return getattr(buffer, "spare_slots", 0) or 0


def check_value(buffer: Buffer, value: jax.typing.ArrayLike, label: str) -> None:
  """Raise if `value` cannot be stored in `buffer` (shape and dtype are fixed at declaration)."""
  buf = _compat.variable_value(buffer)
  shape, dtype = tuple(np.shape(value)), jnp.result_type(value)
  if shape != tuple(buf.shape[1:]) or dtype != buf.dtype:
    raise NotDeclaredError(
      f"sow site {label} received a value of shape {shape} and dtype {dtype}, but its buffer "
      f"was declared for shape {tuple(buf.shape[1:])} and dtype {buf.dtype} (buffer shape "
      f"{tuple(buf.shape)}). Why: buffers keep a fixed shape so the model can run inside "
      "NNX loops. Fix: declare buffers for this call signature with "
      "lb.preallocate(model, *args, capacity=..., **kwargs) before the loop (it leaves the "
      "parameters untouched)."
    )


Record = tuple["Buffer", int, tp.Sequence[jax.typing.ArrayLike], str]
"""One call's sows at one site: (its Buffer, its entry in the Count vector, values, label)."""


def append(
  buffer: Buffer,
  counts: Count,
  site: int,
  values: tp.Sequence[jax.typing.ArrayLike],
  label: str,
  *,
  checked: bool = False,
) -> None:
  """Write `values` (one call's sows at one site, in call order) after the recorded ones.

  Each write touches one slot (`dynamic_update_index_in_dim`), never the whole buffer, and the
  Variables are updated in place so NNX loops see the same structure before and after.
  `counts`/`site`: the recorder's Count vector and this site's entry in it.
  `checked=True`: the caller already ran `check_value` on every value.

  The site's entry is rewritten with `.at[site].set` (a scatter). For sows that come one at a
  time (native NNX modules) that beats rewriting the whole vector (`append_all`): each later
  site's start would depend on the whole rewritten vector, and XLA then recomputes the chain
  of rewrites in every buffer write (1.5x the step time of a 12-sow module).
  """
  if not values:
    return
  if not checked:
    for value in values:
      check_value(buffer, value, label)
  start = site_count(counts, site)
  _write_slots(buffer, start, values)
  added = len(values)
  set_site_count(
    counts,
    site,
    jnp.where(start > COUNT_LIMIT - added, COUNT_LIMIT, start + jnp.asarray(added, COUNT_DTYPE)),
  )


def append_all(counts: Count, records: tp.Sequence[Record]) -> None:
  """`append` for several sites of one recorder (one call's sows), the Count vector written once.

  The caller has run `check_value` on every value.

  Every site's start is read from the vector as it was before the call and the vector is
  rewritten by one saturating elementwise add, which XLA fuses into one small loop. Written
  one site at a time (`append`), each site cost a scatter and a copy of the vector (on the tiny
  model of benchmarks/bench_recording.py, two kernels and three copies more per compiled call:
  about 1% of its dispatch time).
  """
  records = [r for r in records if r[2]]
  if not records:
    return
  # A call's sows at one site arrive as one record (its values in call order), so every start
  # below is the count before the call.
  assert len({site for _, site, _, _ in records}) == len(records), "one record per site"
  vector = jnp.asarray(_compat.variable_value(counts))
  added = np.zeros(vector.shape[-1], np.int64)
  for buffer, site, values, _ in records:
    _write_slots(buffer, vector[..., site], values)
    added[site] = len(values)
  # Saturating: a count stops at COUNT_LIMIT instead of wrapping (see `read`).
  full = vector > jnp.asarray(COUNT_LIMIT - added, COUNT_DTYPE)
  grown = vector + jnp.asarray(added, COUNT_DTYPE)
  _compat.set_variable_value(counts, jnp.where(full, COUNT_LIMIT, grown))


def _write_slots(
  buffer: Buffer, start: jax.Array, values: tp.Sequence[jax.typing.ArrayLike]
) -> None:
  """Store `values` in the slots from `start` on, as the buffer's overflow policy says."""
  if _memory.is_host(buffer):
    _write_host_slots(buffer, start, values)
    return
  buf = placement.constrain(buffer, _compat.variable_value(buffer))
  capacity = buf.shape[0]
  policy = overflow_of(buffer)
  for offset, value in enumerate(values):
    index = start + offset
    if policy == "wrap":
      buf = jax.lax.dynamic_update_index_in_dim(buf, value, index % capacity, 0)
    else:
      # "error"/"drop" keep the first `capacity` values: past the end, rewrite the last slot
      # with what it already holds instead of branching. The read and the write use the very
      # same start indices, so XLA fuses them into one in-place update of the slot: with
      # `dynamic_index_in_dim` it materialised the old slot first (an extra pass over every
      # sown byte, about a fifth of the write's cost; benchmarks/bench_recording.py).
      start_indices = (jnp.minimum(index, capacity - 1),) + (0,) * (buf.ndim - 1)
      kept = jax.lax.dynamic_slice(buf, start_indices, (1, *buf.shape[1:]))
      fresh = jnp.expand_dims(jnp.asarray(value, buf.dtype), 0)
      buf = jax.lax.dynamic_update_slice(
        buf, jnp.where(index < capacity, fresh, kept), start_indices
      )
  _compat.set_variable_value(buffer, placement.constrain(buffer, buf))


def _write_host_slots(
  buffer: Buffer, start: jax.Array, values: tp.Sequence[jax.typing.ArrayLike]
) -> None:
  """`_write_slots` for a record in host memory: each value is moved there by the step itself.

  Nothing is read back from host memory and nothing branches: past the end of an "error"/"drop"
  buffer the write goes to its spare slot, which no read returns. (A `lax.cond` around the
  write, measured on a TPU v5e, made XLA copy the whole host buffer every step; the device
  path's select needs the kept slot, which would have to come back from the host first.)
  """
  host = buffer.host_sharding
  buf = _compat.variable_value(buffer)
  capacity = capacity_of(buffer)
  for offset, value in enumerate(values):
    index = jnp.asarray(start + offset)
    slot = index % capacity if overflow_of(buffer) == "wrap" else jnp.minimum(index, capacity)
    buf = _memory.write_host_slot(buf, jnp.asarray(value, buf.dtype), slot, host)
  _compat.set_variable_value(buffer, buf)


def clear(buffer: Buffer) -> None:
  """Slots cleared, without changing the shape (works inside loops).

  A host record keeps its slots: its count alone goes back to zero (`reset_counts`), and reads
  stop at the count. Zeroing it would need a second record-sized array at once (zeros made on
  the device, which a record larger than the device cannot hold, or a host copy beside the
  record, which host memory may not hold either).
  """
  if _memory.is_host(buffer):
    return
  buf = _compat.variable_value(buffer)
  _compat.set_variable_value(buffer, placement.constrain(buffer, jnp.zeros_like(buf)))


def reset_counts(counts: Count) -> None:
  """Every entry back to zero, shape kept (stacked layers' stack axes too; works in loops)."""
  _compat.set_variable_value(counts, jnp.zeros_like(_compat.variable_value(counts)))


def is_traced(x: object) -> bool:
  return isinstance(x, jax.core.Tracer)


# Reading a stack whose layers hold different numbers of records as one array would hand
# back slots a layer never wrote (zeros) as if they were its records.
UNEVEN_LAYERS = (
  "sow site {label} of a layer stack: its layers recorded {counts} values since the last "
  "reset, so they do not fill one [records, layers, ...] array. Why: a layer run alone "
  "(lb.layers.layer(stack, i)(...)) advances its own count only; the other layers' slots hold "
  "nothing sown. Fix: read a layer by itself, lb.recorded(lb.layers.layer(stack, i)) (or "
  "lb.layers.unstack(stack)); lb.counts(stack) gives each layer's count; lb.reset(stack) "
  "starts every layer from zero."
)


def read(buffer: Buffer, count: jax.Array, label: str) -> jax.Array | np.ndarray:
  """The recorded values, oldest first.

  Outside a trace: trimmed to the number recorded (at most `capacity`); under
  `overflow="error"` reading an overflowed buffer raises `BufferOverflowError`.
  Inside a trace (jit, loops): shapes must be static, so the full `(capacity, ...)` buffer is
  returned (oldest first for `"wrap"`); slots past `count` hold zeros. Use `lb.counts` there.
  `count`: the site's entry of its recorder's Count vector; for a stack seen by `flat_view`,
  one per layer (`(*stack,)`): each layer's ring is turned by its own, and outside a trace the
  layers must agree (StackError otherwise).
  """
  buf = _compat.variable_value(buffer)
  n = count
  capacity = capacity_of(buffer)
  policy = overflow_of(buffer)
  host = _memory.is_host(buffer)
  if is_traced(buf) or is_traced(n):
    if host:
      raise BufferOverflowError(
        f"sow site {label} keeps its records in host memory (memory='host') and was read "
        "inside a trace. Why: a read there computes on the whole buffer (a ring put in order, "
        "the kept slots cut out), which XLA does not run on host memory, and a record larger "
        "than the device could not be brought back to it. Fix: read it outside the compiled "
        "function (lb.recorded(model) after the call); lb.counts works inside."
      )
    if policy == "wrap":
      shift = jnp.where(n > capacity, n % capacity, 0)
      if not jnp.ndim(shift):
        return jnp.roll(buf, -shift, axis=0)
      # Per layer: slot k of layer l is ring slot (k + shift[l]) % capacity.
      order = (jnp.arange(capacity).reshape((capacity,) + (1,) * shift.ndim) + shift) % capacity
      order = order.reshape(order.shape + (1,) * (buf.ndim - order.ndim))
      return jnp.take_along_axis(buf, order, axis=0)
    return buf
  per_layer = np.asarray(n).reshape(-1)
  if per_layer.size > 1 and (per_layer != per_layer[0]).any():
    raise StackError(
      UNEVEN_LAYERS.format(label=label, counts=", ".join(str(int(c)) for c in per_layer))
    )
  n = int(per_layer[0]) if per_layer.size else 0
  if n >= COUNT_LIMIT:
    raise BufferOverflowError(
      f"sow site {label} was sown {COUNT_LIMIT} times or more since the last reset, the "
      "largest count an int32 holds; the count stopped there, so where the latest values "
      "sit is no longer known. Why: counts are int32 on every device. Fix: call "
      "lb.reset(model) between runs (it is shape-stable and works inside loops)."
    )
  if host:
    # Host records are read through NumPy (see `memory`), as a copy: a later donating call
    # may reuse the buffer's memory.
    return _read_host(np.array(buf)[: capacity_of(buffer)], n, policy, label)
  if n < capacity:
    return buf[:n]  # a slice: a new array
  if n == capacity:
    # The whole buffer: jax hands back `buf` itself for a full slice, which the next
    # donating call (lb.compile_step) deletes; a read must survive it like a partial one.
    return jnp.array(buf, copy=True)
  if policy == "error":
    raise BufferOverflowError(_overflowed(label, n, capacity))
  if policy == "drop":
    return jnp.array(buf, copy=True)  # not `buf` itself (see above)
  start = n % capacity
  return jnp.concatenate([buf[start:], buf[:start]], axis=0)


def _read_host(buf: np.ndarray, n: int, policy: Overflow, label: str) -> np.ndarray:
  """`read` of a host record outside a trace, on its NumPy copy."""
  capacity = buf.shape[0]
  if n <= capacity:
    return buf[:n]
  if policy == "error":
    raise BufferOverflowError(_overflowed(label, n, capacity))
  if policy == "drop":
    return buf
  start = n % capacity
  return np.concatenate([buf[start:], buf[:start]], axis=0)


def _overflowed(label: str, n: int, capacity: int) -> str:
  return (
    f"sow site {label} recorded {n} values but its buffer holds capacity={capacity}; the "
    f"first {capacity} were kept and the last {n - capacity} were not stored. Why: "
    "overflow='error' (the default) refuses to hand back an incomplete record silently. "
    "Fix: declare a larger capacity (lb.preallocate(model, *args, capacity=...)), call "
    "lb.reset(model) between runs, or choose overflow='drop' (keep the first values) or "
    "overflow='wrap' (keep the last values)."
  )


def flat_view(buffer: Buffer, count: jax.Array) -> tuple[Buffer, jax.Array]:
  """A stacked buffer `(*stack, capacity, ...)` seen as `(capacity, *stack, ...)`, and the
  site's count (`count`: its entry of the Count vector, with the stack axes).

  The count stays one per layer: a layer run alone (`lb.layers.layer`) advances its own entry,
  so the layers of a stack need not agree (`read` checks them).
  """
  k = getattr(buffer, "stack_axes", 0) or 0
  if _compat.is_layer_view(buffer) and k:
    k -= 1  # one layer of the stack (`lb.layers.layer`): its value lacks the first stack axis
  if not k:
    return buffer, count
  value = _compat.variable_value(buffer)
  moved = jnp.moveaxis(value, k, 0)
  return Buffer(moved, overflow=buffer.overflow), count


def kept_values(buffer: Buffer, count: int | jax.Array) -> tuple[jax.Array | np.ndarray, int]:
  """(the values a buffer holds, oldest first; how many sown values it no longer holds).

  Outside a trace only (a re-declaration copies records from the old buffer with it).
  `count`: the site's count (a scalar).
  """
  buf = _compat.variable_value(buffer)
  n = min(int(count), COUNT_LIMIT)
  capacity = capacity_of(buffer)
  xp = np if _memory.is_host(buffer) else jnp  # host records through NumPy (see `memory`)
  if xp is np:
    buf = np.array(buf)[:capacity]
  if n <= capacity:
    return buf[:n], 0
  if overflow_of(buffer) == "wrap":
    start = n % capacity
    return xp.concatenate([buf[start:], buf[:start]], axis=0), n - capacity
  return buf, n - capacity


def refill(buffer: Buffer, values: jax.Array | np.ndarray) -> int:
  """Append `values` (oldest first) to an empty buffer under its own policy; returns the
  site's new count (the caller writes it into the recorder's Count vector)."""
  buf = _compat.variable_value(buffer)
  capacity, k = capacity_of(buffer), values.shape[0]
  if _memory.is_host(buffer):  # assembled in NumPy, then placed in host memory (see `memory`)
    host = np.zeros(buf.shape, buf.dtype)
    values = np.asarray(values)
    if overflow_of(buffer) == "wrap" and k > capacity:
      host[:] = np.roll(values[k - capacity :], k % capacity, axis=0)
    else:
      host[: min(k, capacity)] = values[:capacity]
    _compat.set_variable_value(buffer, jax.device_put(host, buffer.host_sharding))
    return int(k)
  if overflow_of(buffer) == "wrap" and k > capacity:
    # The last `capacity` values, each in the slot a ring of this capacity would have used.
    buf = jnp.roll(values[k - capacity :], k % capacity, axis=0)
  else:
    take = min(k, capacity)
    buf = buf.at[:take].set(values[:take].astype(buf.dtype))
  _compat.set_variable_value(buffer, placement.constrain(buffer, buf))
  return int(k)
