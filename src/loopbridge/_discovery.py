"""Finding the sow sites of a Linen call without running its FLOPs.

Two sources are combined:
- `jax.eval_shape` of `module.apply(..., mutable=True)` gives what Linen itself returns for
  every sow site (tuple length = sows per call; a sow inside `nn.scan`/`nn.vmap` comes back
  stacked along the lifted axis). This is the ground truth for buffer shapes.
- A short-lived wrapper around `flax.linen.Module.sow` tells us *how* each value was sown:
  with the default tuple reduce (a recordable site) or a custom `reduce_fn`/`init_fn` (a
  shape-stable accumulator that is state, not a record), and which sows Linen dropped because
  an enclosing lifted transform does not carry their collection.
The wrapper is installed only while discovery runs and records into a thread-local list, so
other threads and ordinary calls see Linen's own `sow`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen
from flax import traverse_util
from flax.core import lift as core_lift
from flax.core import scope as core_scope
from flax.linen import module as linen_module_lib

from ._capacity import SiteKey
from ._errors import SowMismatchError


@dataclasses.dataclass(frozen=True)
class Lift:
  """A Linen lifted transform (`nn.scan`, `nn.vmap`, `nn.remat`, ...) enclosing a sow."""

  kind: str  # flax's name for it: "scan", "vmap", "remat", "jit", ...
  path: tuple[str, ...]  # Linen path of the transformed module
  carries: bool  # whether the transform carries the sow's collection out (else Linen drops it)
  axis: int | None  # the axis it stacks the collection along (scan/vmap), None if not/unknown
  reverse: bool = False  # nn.scan(reverse=True)


@dataclasses.dataclass(frozen=True)
class SowCall:
  """One `Module.sow` call seen while tracing."""

  collection: str
  module_path: tuple[str, ...]
  name: str
  shape: tuple[int, ...] | None  # None when the sown value is not a single array
  dtype: str | None
  default_reduce: bool  # the tuple-append reduce/init of `Module.sow`
  dropped: bool  # Linen discarded it: the collection was not mutable in this scope
  module_type: str
  init_fn: tp.Callable[[], tp.Any] | None = dataclasses.field(compare=False, default=None)
  lifts: tuple[Lift, ...] = ()  # enclosing lifted transforms, outermost first

  @property
  def site(self) -> SiteKey:
    return (self.collection, *self.module_path, self.name)


@dataclasses.dataclass(frozen=True)
class FoundSite:
  """A recordable sow site as Linen returns it from one call."""

  site: SiteKey
  per_call: int  # tuple entries per call (k sows of the same name take k slots)
  shape: tuple[int, ...]  # one entry's shape, including axes added by nn.scan / nn.vmap
  dtype: np.dtype
  sown_shape: tuple[int, ...] | None  # the shape passed to `sow` (before lifting)
  lifts: tuple[Lift, ...] = ()  # enclosing lifted transforms, outermost first


@dataclasses.dataclass
class Discovery:
  sites: dict[SiteKey, FoundSite]
  accumulators: dict[SiteKey, SowCall]  # custom reduce_fn/init_fn sows (state, not records)
  dropped: list[SowCall]
  calls: list[SowCall]
  # What Linen stores for each accumulator after the call (lifted transforms add axes).
  accumulator_shapes: dict[SiteKey, tp.Any] = dataclasses.field(default_factory=dict)


_local = threading.local()


def _active_logs() -> list[list[SowCall]]:
  if not hasattr(_local, "logs"):
    _local.logs = []
  return _local.logs


def _active_lifts() -> list[tuple[tp.Any, ...]]:
  """Enclosing lifted transforms of this thread: (kind, path, out filters, axes, reverse)."""
  if not hasattr(_local, "lifts"):
    _local.lifts = []
  return _local.lifts


_ORIGINAL_SOW = linen.Module.sow
_ORIGINAL_PACK = core_lift.pack


def _observing_pack(fn, in_variable_filters, out_variable_filters, rng_filters, name=None,
                    enable_kwargs=False):
  """`flax.core.lift.pack` (the building block of every Linen lifted transform), noting while
  the transformed function runs which transform encloses it and which collections it stacks
  along which axis."""
  packed = _ORIGINAL_PACK(fn, in_variable_filters, out_variable_filters, rng_filters, name=name,
                          enable_kwargs=enable_kwargs)
  # The stacking axes are not an argument of `pack`; scan and vmap keep them in the closure of
  # their inner function (`variable_out_axes`, aligned with the last filters). Best effort: an
  # unknown axis stays None and is derived from the shapes later.
  closure = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
  axes = closure.get("variable_out_axes")
  filters = tuple(out_variable_filters)
  if isinstance(axes, tuple) and len(axes) <= len(filters) and name in ("scan", "vmap"):
    axes = (None,) * (len(filters) - len(axes)) + axes
  else:
    axes = (None,) * len(filters)
  reverse = closure.get("reverse") is True

  @functools.wraps(packed)
  def wrapper(scope_tree, *args, **kwargs):
    scope = scope_tree[0] if isinstance(scope_tree, (list, tuple)) and scope_tree else scope_tree
    path = tuple(getattr(scope, "path", ()))
    frames = _active_lifts()
    frames.append((name or "transform", path, filters, axes, reverse))
    try:
      return packed(scope_tree, *args, **kwargs)
    finally:
      frames.pop()

  return wrapper


def _lifts_for(col: str) -> tuple[Lift, ...]:
  lifts = []
  for kind, path, filters, axes, reverse in _active_lifts():
    index = next((i for i, f in enumerate(filters) if core_scope.in_filter(f, col)), None)
    axis = axes[index] if index is not None else None
    lifts.append(Lift(kind, path, index is not None, axis if isinstance(axis, int) else None,
                      reverse))
  return tuple(lifts)
_install_lock = threading.Lock()
_install_depth = 0


def _observing_sow(self, col, name, value, reduce_fn=linen_module_lib.tuple_reduce,
                   init_fn=linen_module_lib.tuple_init):
  logs = _active_logs()
  if logs and self.scope is not None:
    if isinstance(value, (jax.Array, np.ndarray, np.generic, float, int, bool)) or hasattr(
        value, "aval"):
      shape, dtype = tuple(jnp.shape(value)), str(jnp.result_type(value))
    else:
      shape, dtype = None, None
    logs[-1].append(SowCall(
        collection=col,
        module_path=tuple(self.scope.path),
        name=name,
        shape=shape,
        dtype=dtype,
        default_reduce=(reduce_fn is linen_module_lib.tuple_reduce
                        and init_fn is linen_module_lib.tuple_init),
        dropped=not self.scope.is_mutable_collection(col),
        module_type=type(self).__name__,
        init_fn=init_fn,
        lifts=_lifts_for(col),
    ))
  return _ORIGINAL_SOW(self, col, name, value, reduce_fn, init_fn)


@contextlib.contextmanager
def observe_sows() -> tp.Iterator[list[SowCall]]:
  """Collect every `Module.sow` call made by this thread inside the block."""
  global _install_depth
  with _install_lock:
    if _install_depth == 0:
      linen.Module.sow = _observing_sow
      core_lift.pack = _observing_pack
    _install_depth += 1
  log: list[SowCall] = []
  _active_logs().append(log)
  try:
    yield log
  finally:
    _active_logs().pop()
    with _install_lock:
      _install_depth -= 1
      if _install_depth == 0:
        linen.Module.sow = _ORIGINAL_SOW
        core_lift.pack = _ORIGINAL_PACK


def tuple_sow_paths(calls: tp.Iterable[SowCall]) -> set[SiteKey]:
  """Sites written with the default tuple reduce (and not dropped)."""
  return {c.site for c in calls if c.default_reduce and not c.dropped}


def discover(
    module: linen.Module,
    variables: tp.Mapping[str, tp.Any],
    args: tuple[tp.Any, ...],
    kwargs: dict[str, tp.Any],
    *,
    method: tp.Any,
    rngs: dict[str, jax.Array],
    capture_intermediates: tp.Any = False,
) -> Discovery:
  """Trace one `module.apply(..., mutable=True)` abstractly and describe its sows."""

  def call():
    return module.apply(variables, *args, rngs=rngs, method=method, mutable=True,
                        capture_intermediates=capture_intermediates, **kwargs)[1]

  with observe_sows() as calls:
    # Closing over the (concrete) inputs is fine: under eval_shape every operation is staged,
    # none is executed.
    updates = jax.eval_shape(call)

  recordable = tuple_sow_paths(calls)
  custom = {c.site: c for c in calls if not c.default_reduce and not c.dropped}
  sown_shapes = {c.site: c.shape for c in calls if c.default_reduce}
  lifts = {c.site: c.lifts for c in calls if c.default_reduce}
  sites: dict[SiteKey, FoundSite] = {}
  for path, value in traverse_util.flatten_dict(updates).items():
    if path not in recordable or not isinstance(value, tuple):
      continue
    shapes = {(tuple(v.shape), np.dtype(v.dtype)) for v in value if hasattr(v, "shape")}
    if len(shapes) != 1 or not all(hasattr(v, "shape") for v in value):
      raise SowMismatchError(
          f"sow site {'/'.join(path)} receives values of different shapes/dtypes or non-array "
          f"values within one call ({[getattr(v, 'shape', type(v).__name__) for v in value]}). "
          "Why: one buffer holds one array shape. Fix: sow each kind of value under its own "
          "name, and sow arrays (one `sow` per leaf of a pytree). If the site is "
          "'__call__' (or another method name) it comes from capture_intermediates capturing a "
          "method that returns a tuple/pytree: pass capture_intermediates=filter_fn that "
          "selects modules returning arrays, e.g. lambda mdl, name: not isinstance(mdl, Block)."
      )
    (shape, dtype), = shapes
    sites[path] = FoundSite(path, len(value), shape, dtype, sown_shapes.get(path),
                            lifts.get(path, ()))
  dropped = []
  seen = set()
  for c in calls:
    if c.dropped and c.site not in seen:
      seen.add(c.site)
      dropped.append(c)
  accumulator_shapes = {}
  for site in custom:
    node = updates
    for key in site:
      node = node.get(key) if isinstance(node, dict) else None
    accumulator_shapes[site] = node
  return Discovery(sites=sites, accumulators=custom, dropped=dropped, calls=list(calls),
                   accumulator_shapes=accumulator_shapes)
