"""Shardings, meshes and single-device placement as each supported flax and jax spell them."""

from __future__ import annotations

import contextlib
import typing as tp

import flax
import jax
from flax import nnx


def _partitioning_key() -> str:
  """The Variable metadata key under which `nnx.with_partitioning` records partition names.

  flax 0.10.2 uses `sharding`, 0.11 to 0.12.3 `sharding_names`, 0.12.4 on `out_sharding` (and
  warns that the older names are deprecated); each reads its own back in
  `nnx.get_partition_spec`, so buffers carrying it are sharded by the standard NNX recipe.
  Asked of flax itself: the initializer it returns boxes the value with that metadata.
  """
  boxed = nnx.with_partitioning(lambda *args: None, ("axis",))(None)
  names = [k for k, v in getattr(boxed, "metadata", {}).items() if v == ("axis",)]
  return names[0] if names else "sharding"


_SHARDING_KEY = _partitioning_key()


def sharding_metadata(names: tp.Sequence[str | None], mesh: object) -> dict[str, object]:
  """Variable metadata that records a partitioning (mesh axis names per axis) and its mesh."""
  return {_SHARDING_KEY: tuple(names), "mesh": mesh}


def variable_sharding(variable: nnx.Variable) -> tuple[tuple[tp.Any, ...] | None, tp.Any]:
  """(mesh axis names per axis, mesh) recorded in a Variable's metadata, or (None, None)."""
  if hasattr(variable, "get_metadata"):  # 0.12
    metadata = variable.get_metadata()
  else:  # 0.10 keeps metadata as plain instance attributes
    metadata = vars(variable)
  names = metadata.get(_SHARDING_KEY)
  return (tuple(names) if names is not None else None), metadata.get("mesh")


def mesh_context(mesh: jax.sharding.Mesh) -> tp.ContextManager[object]:
  """Make `mesh` the current mesh (what Linen's `nn.Partitioned` and flax's eager sharding read).

  jax >= 0.7 has `jax.set_mesh`; jax 0.5 uses the mesh itself as the (legacy) context that
  `flax.core.meta` 0.10 checks before constraining partitioned params.
  """
  if hasattr(jax, "set_mesh"):
    return jax.set_mesh(mesh)
  return mesh


def single_device_sharding(device: tp.Any, memory_kind: str | None = None) -> jax.sharding.Sharding:
  """The sharding that places an array on one device (in `memory_kind`, if given).

  jax 0.12 deprecates the class `jax.sharding.SingleDeviceSharding` (reading the name warns)
  for the factory `jax.sharding.make_single_device_sharding`; jax 0.5.3 and 0.10.2 have only
  the class. The factory is looked for first, so the deprecated name is never read where it
  exists.
  """
  make = getattr(jax.sharding, "make_single_device_sharding", None)
  if make is None:
    make = jax.sharding.SingleDeviceSharding
  return make(device, memory_kind=memory_kind)


def no_eager_sharding() -> tp.ContextManager[object]:
  """Create Variables from existing arrays as they are, keeping partitioning as metadata only.

  flax 0.12 shards a Variable with partitioning metadata eagerly at creation (which needs a
  mesh); `nnx.use_eager_sharding(False)` (flax >= 0.12.1) turns that off for the block, and on
  flax 0.12.0, which has only the process-wide flag `flax_always_shard_variable`, the flag is
  flipped for the block. flax 0.10 and 0.11 never shard eagerly.
  """

  if hasattr(nnx, "use_eager_sharding"):
    return nnx.use_eager_sharding(False)
  if getattr(flax.config, "flax_always_shard_variable", False):
    return flax.config.temp_flip_flag("always_shard_variable", False)
  return contextlib.nullcontext()


# flax >= 0.12 shards a Variable with partitioning metadata when it is created
# (`flax_always_shard_variable`, on by default), which needs a mesh; it says so in a
# ValueError with this text (flax 0.10 and 0.11 never shard at creation).
_NO_MESH_MARK = "An auto mesh context or metadata is required"


def is_missing_mesh_error(error: BaseException) -> bool:
  """Whether `error` is flax 0.12's refusal to create a partitioned Variable without a mesh."""
  return isinstance(error, ValueError) and _NO_MESH_MARK in str(error)
