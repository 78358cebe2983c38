"""`lb.sharding.shard_buffers`: place a model's record buffers on a device mesh after declaration.

How layouts are chosen and kept is described in `_core/placement.py`; this is the explicit override.
"""

from __future__ import annotations

import fnmatch
import typing as tp

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .. import _compat
from .._core import buffers as _buffers
from .._core import memory as _memory
from .._core import placement
from .._core import recorder as _recorder
from .._core import site as _site
from .._core.errors import ShardingError

Model = tp.TypeVar("Model")

ShardingSpec = placement.ShardingSpec


def _names(root_path: tuple[tp.Any, ...], site: tuple[str, ...], sow: tuple[str, ...]) -> set[str]:
  """The `/`-joined paths a mapping key may give for one buffer.

  As `capacity=` takes them: the sow's path inside its collection (every leaf of a sown pytree
  shares it) or the leaf's own, each from the recorder or from the root of the model. And each
  with its collection in front (`"intermediates/h"`), as the callable, `lb.sow_sites` and this
  function's errors name the buffer.
  """
  inside = [site[1:], sow[1:]]
  names = {"/".join(map(str, p)) for q in inside for p in (q, (*root_path, *q))}
  return names | {"/".join(map(str, p)) for q in (site, sow) for p in (q, (*root_path, *q))}


def _key_matches(key: str, names: set[str], collection: str) -> bool:
  if key == collection or key in names:
    return True
  return any(c in key for c in "*?[") and any(fnmatch.fnmatchcase(n, key) for n in names)


def shard_buffers(model: Model, sharding: ShardingSpec, *, mesh: tp.Any = None) -> Model:
  """Place a model's record buffers on a device mesh, overriding the inferred layout.

  Each spec describes the *recorded value's* axes (what one `sow` stores, including axes
  added by `nn.scan`); loopbridge prepends the unsharded capacity axis, and for a stacked
  module (`lb.layers.stack`, `nnx.vmap`), whose buffers are `(layers, capacity, *value)`,
  the unsharded layer axes before it. The layout is kept
  as the buffer's NNX partitioning metadata (so `nnx.get_partition_spec(nnx.state(model))`
  agrees) and re-applied on every write, so it survives jitted loops.

  Args:
    model: an `lb.ToNNX` (or an NNX module holding some) after `lazy_init`/`preallocate`.
    sharding: one of
      - a `PartitionSpec` / `NamedSharding` (or `None`: replicated) for every buffer;
      - a mapping whose keys are a collection name, a `/`-joined sow path or a glob of one
        (as for `capacity=`, the path with or without its collection: `"h"` or
        `"intermediates/h"`; a sown pytree's path names all its leaves, a leaf's own path
        such as `"pair/0"` names one) to such a spec; buffers no key names keep their layout;
      - a callable `(site, value_shape) -> spec`, `site` like `"intermediates/x"`.
      Every call signature's buffer of a sow answers to the sow's path (keys and callables
      see the same public path for each).
    mesh: the mesh a `PartitionSpec` refers to (not needed for `NamedSharding`s).

  Returns:
    `model`, with its buffers moved (recorded values and counts are kept).

  Raises:
    ShardingError: no mesh for a `PartitionSpec`, an unknown mesh axis, a spec longer than
      the value, a mesh axis that does not divide the axis it splits, or a mapping key that
      names no buffer.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np, loopbridge as lb
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones((4, 2)), capacity=3)
    >>> _ = lb.sharding.shard_buffers(model, {"x": P("data")}, mesh=mesh)
    >>> tuple(lb.buffers(model)["intermediates"]["x"].sharding.spec)
    (None, 'data')
  """
  keys_used: set[str] = set()
  found_any = replaced = False
  for root_path, recorder in _recorder.iter_recorders(model):
    buffers = getattr(recorder, _recorder.BUFFERS_ATTR)
    sow_of = {s.key: s.sow_key for s in _recorder.sites_of(recorder) or ()}
    for site, buffer, _ in _recorder.pairs(recorder):
      found_any = True
      # Keys and callables see the public path: every call signature's buffer of one sow is
      # named alike (later signatures sit behind a `loopbridge__signature_<slot>` key).
      _, public = _site.split_slot(site)
      label = "/".join(map(str, (*root_path, *public)))
      value = _compat.variable_value(buffer)
      # A stacked module's buffer (`lb.layers.stack`, `nnx.vmap`) is (*layers, capacity,
      # *value_shape): the spec describes the value, after the layer and capacity axes.
      stack_axes = getattr(buffer, "stack_axes", 0) or 0
      value_shape = tuple(value.shape[stack_axes + 1 :])
      if _memory.is_host(buffer):
        raise ShardingError(
          f"buffer {label} keeps its records in host memory (memory='host'); "
          "lb.sharding.shard_buffers places buffers in device memory. Why: moving a host "
          "record to the devices could exceed their memory, which is what host records avoid. "
          "Fix: leave this site out of the spec (a mapping names only the sites to shard), or "
          "declare it on the device (memory='device') before sharding it; host records of "
          "batch-sharded sample inputs keep the inferred layout in host memory."
        )
      if isinstance(sharding, tp.Mapping):
        names = _names(tuple(root_path), public, sow_of.get(site, public))
        keys = [k for k in sharding if _key_matches(k, names, public[0])]
        if not keys:
          continue
        # The most specific key wins, as for capacity: exact path, then glob, then collection.
        exact = [k for k in keys if k in names]
        key = exact[0] if exact else next((k for k in keys if k != public[0]), keys[0])
        keys_used.update(keys)
        spec = sharding[key]
      elif callable(sharding) and not isinstance(sharding, (PartitionSpec, NamedSharding)):
        spec = sharding("/".join(public), value_shape)
      else:
        spec = sharding
      target = placement.value_sharding(label, value_shape, spec, mesh, stack_axes)
      metadata = placement.buffer_metadata(target)
      if stack_axes:
        metadata["stack_axes"] = stack_axes
      new = _buffers.placed_buffer(
        jax.device_put(value, target), overflow=buffer.overflow, **metadata
      )
      node = buffers
      for key_ in site[:-1]:
        node = node[key_]
      node[site[-1]] = new
      replaced = True
    _compat.set_data_attribute(recorder, _recorder.BUFFERS_ATTR, buffers)
  if replaced:
    # New Buffer Variables, as a declaration makes: a compiled step built before must follow
    # them, or it keeps writing (and donating) the replaced ones.
    _recorder.bump_generation()
  if isinstance(sharding, tp.Mapping):
    unused = [k for k in sharding if k not in keys_used]
    if unused or not found_any:
      raise ShardingError(
        f"buffer sharding key(s) {unused} name no buffer of this model. Why: a key that "
        "matches nothing is usually a typo and would leave a buffer on the wrong devices. "
        "Keys are a collection name, a '/'-joined sow path inside it, or a glob; the buffers "
        f"are: {sorted({'/'.join(_site.split_slot(s)[1]) for s in _all_sites(model)})}."
      )
  return model


def _all_sites(model: tp.Any) -> list[tuple[str, ...]]:
  return [site for _, rec in _recorder.iter_recorders(model) for site, _, _ in _recorder.pairs(rec)]
