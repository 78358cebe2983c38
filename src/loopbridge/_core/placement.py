"""How record buffers are laid out on a device mesh: chosen at declaration, kept in loops.

A buffer is `(capacity, *value_shape)`; it is sharded like the value it records, with the
capacity axis never sharded, so per-device buffer bytes shrink with the mesh. The layout is
stored on the `Buffer` Variable as standard NNX partitioning metadata (the same key
`nnx.get_partition_spec` reads for params), and every in-place write re-applies it as a
sharding constraint, so XLA's propagation inside a jitted loop cannot move it.

How a layout is chosen, in order:
1. By inference when `lb.lazy_init` / `lb.preallocate` declares a buffer: if a sample argument
   is a concrete `jax.Array` whose leading (batch) axis is sharded by a `NamedSharding`, every
   sown value whose own leading axis has the same size is sharded the same way along that axis
   (axes added by `nn.scan`/`nn.vmap` are skipped). Everything else stays unsharded. A value
   whose leading axis merely happens to have the batch size is sharded too; that changes the
   layout only, never a recorded value.
2. Explicitly, after declaration, with `lb.sharding.shard_buffers(model, spec, mesh=mesh)`, which
   overrides the inferred layout for the buffers it names. Re-declaring a buffer with
   `lb.preallocate` (new shape/capacity) infers again: call `lb.sharding.shard_buffers` after it.
"""

from __future__ import annotations

import math
import typing as tp

import jax
import jax.core
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from .. import _compat
from .errors import ShardingError

SpecLike = PartitionSpec | NamedSharding | None
ShardingSpec = SpecLike | tp.Mapping[str, SpecLike] | tp.Callable[[str, tuple[int, ...]], SpecLike]
# One entry of a PartitionSpec that shards: a mesh axis name, or several.
MeshAxes = str | tuple[str, ...]
AnyMesh = Mesh | AbstractMesh  # what a NamedSharding holds
SiteKey = tp.TypeVar("SiteKey", bound=tp.Hashable)


def _batch_axes(args: object, kwargs: object) -> dict[int, tuple[MeshAxes, AnyMesh]]:
  """{leading-axis size: (mesh axes, mesh)} for every concrete arg sharded along axis 0."""
  found: dict[int, tuple[MeshAxes, AnyMesh]] = {}
  for leaf in jax.tree_util.tree_leaves((args, kwargs)):
    if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer) or leaf.ndim == 0:
      continue
    sharding = getattr(leaf, "sharding", None)
    if not isinstance(sharding, NamedSharding) or len(sharding.spec) == 0:
      continue
    axes = sharding.spec[0]
    if axes is None or _axes_size(sharding.mesh, axes) == 1:
      continue
    found.setdefault(int(leaf.shape[0]), (axes, sharding.mesh))
  return found


def _axes_size(mesh: AnyMesh, axes: MeshAxes) -> int:
  names = axes if isinstance(axes, tuple) else (axes,)
  return math.prod(mesh.shape[n] for n in names)


def _leading_axis_position(
  shape: tuple[int, ...], sown_shape: tuple[int, ...] | None
) -> int | None:
  """Where the sown value's axis 0 sits in the recorded value (lifted transforms add axes)."""
  if not sown_shape or not shape:
    return None
  lifted = len(shape) - len(sown_shape)
  if lifted >= 0 and tuple(shape[lifted:]) == tuple(sown_shape):
    return lifted  # lifted axes in front (nn.scan/nn.vmap with axis 0)
  if shape[0] == sown_shape[0]:
    return 0
  return None


def infer_buffer_shardings(
  args: object,
  kwargs: object,
  sites: tp.Mapping[SiteKey, tuple[tuple[int, ...], tuple[int, ...] | None]],
) -> dict[SiteKey, NamedSharding]:
  """Buffer shardings inferred from batch-sharded sample args (rule 1 of the module doc).

  `sites` maps a site to (recorded value shape, shape passed to `sow`). Sites left out of the
  result stay unsharded.
  """
  batch = _batch_axes(args, kwargs)
  if not batch:
    return {}
  out = {}
  for site, (shape, sown_shape) in sites.items():
    position = _leading_axis_position(tuple(shape), sown_shape)
    if position is None or sown_shape is None or sown_shape[0] not in batch:
      continue
    axes, mesh = batch[sown_shape[0]]
    spec: list[MeshAxes | None] = [None] * len(shape)
    spec[position] = axes
    out[site] = NamedSharding(mesh, PartitionSpec(None, *spec))
  return out


def buffer_metadata(sharding: object) -> dict[str, object]:
  """Variable metadata recording a buffer's NamedSharding (empty for other shardings)."""
  if not isinstance(sharding, NamedSharding):
    return {}
  return _compat.sharding_metadata(tuple(sharding.spec), sharding.mesh)


def constrain(variable: nnx.Variable, value: jax.Array) -> jax.Array:
  """`value` constrained to the layout recorded on `variable` (unchanged if it has none)."""
  names, mesh = _compat.variable_sharding(variable)
  if names is None or mesh is None:
    return value
  if len(names) > value.ndim:
    # One layer of a stacked buffer (`lb.layers.layer`, a scan over the stack) lacks the
    # leading layer axes, which `value_sharding` never shards.
    names = names[len(names) - value.ndim :]
  return jax.lax.with_sharding_constraint(value, NamedSharding(mesh, PartitionSpec(*names)))


def value_sharding(
  label: str,
  value_shape: tuple[int, ...],
  spec: SpecLike,
  mesh: AnyMesh | None,
  stack_axes: int = 0,
) -> NamedSharding:
  """The buffer sharding for a value-level spec: capacity axis prepended, unsharded, and
  before it the `stack_axes` layer axes of a stacked module's buffer, unsharded too."""
  if isinstance(spec, NamedSharding):
    mesh, spec = spec.mesh, spec.spec
  elif spec is None:
    spec = PartitionSpec()
  elif not isinstance(spec, PartitionSpec):
    raise ShardingError(
      f"the sharding given for buffer {label} is a {type(spec).__name__}; loopbridge takes a "
      "jax.sharding.PartitionSpec or NamedSharding of the recorded value (without the "
      "capacity axis), or None for replicated. Fix: e.g. PartitionSpec('data', None)."
    )
  if mesh is None:
    raise ShardingError(
      f"a PartitionSpec was given for buffer {label} but no mesh. Why: a PartitionSpec names "
      "mesh axes, so the mesh must be known to place the buffer. Fix: pass "
      "lb.sharding.shard_buffers(model, spec, mesh=mesh), or give a NamedSharding(mesh, spec)."
    )
  if len(spec) > len(value_shape):
    raise ShardingError(
      f"the spec {spec} for buffer {label} has {len(spec)} entries but the recorded value has "
      f"shape {value_shape} ({len(value_shape)} axes). Why: the spec describes the recorded "
      "value; loopbridge adds the (unsharded) capacity axis itself. Fix: one entry per value "
      "axis at most, e.g. PartitionSpec('data')."
    )
  for axis, axes in enumerate(spec):
    if axes is None:
      continue
    names = axes if isinstance(axes, tuple) else (axes,)
    unknown = [n for n in names if n not in mesh.shape]
    if unknown:
      raise ShardingError(
        f"buffer {label}: mesh axis {unknown[0]!r} in {spec} is not an axis of the mesh "
        f"{dict(mesh.shape)}. Fix: use one of {list(mesh.shape)}."
      )
    size = _axes_size(mesh, axes)
    if value_shape[axis] % size:
      raise ShardingError(
        f"buffer {label} records values of shape {value_shape}; axis {axis} (size "
        f"{value_shape[axis]}) is split over mesh axes {axes!r} of total size {size}, which "
        f"does not divide {value_shape[axis]}. Why: every device must hold an equal slice of "
        f"the buffer. Fix: make that axis (e.g. the batch) a multiple of {size}, use a mesh "
        "whose axes divide it, or leave the axis unsharded (None in the spec)."
      )
  return NamedSharding(mesh, PartitionSpec(*(None,) * stack_axes, None, *spec))
