"""Discover stage, Linen side: what one Linen `init`/`apply` sowed, and how.

What Linen returns from a call with its collections mutable (`init` makes every collection
mutable; discovery applies with `mutable=True`) is the ground truth for the recorded shapes: a
tuple per default-reduce sow site, stacked along the lifted axis inside `nn.scan`/`nn.vmap`.
Two facts are not in that tree, so `observe()` watches the call itself:
- *how* each value was sown: with the default tuple reduce (a record) or a custom
  `reduce_fn`/`init_fn` (a shape-stable accumulator: state, not a record), and which sows Linen
  dropped because an enclosing lifted transform does not carry their collection;
- which lifted transforms enclose each sow, and along which axis they stack it.

Some values reach a collection without Linen's `sow`: a wrapper that runs an NNX module
(`nnx.bridge.ToLinen`, `to_linen`, or one a user writes the same way) writes the NNX module's
sows into the Linen collection with `Module.put_variable` *after* the call, and not at all
during `init`. `observe()` therefore also logs every `Module.put_variable` (the writes a module
makes itself), and `classify()` counts as a record every tuple an apply returns that no Linen
`sow` explains and that was not among the variables passed in: exactly what Linen's own
`apply(mutable=[...])` returns for such a site (a tuple of the call's values).

How the call is watched: `flax.linen.Module.sow` and `flax.core.lift.pack` (the building block
of every Linen lifted transform) are wrapped only while at least one `observe()` block is open.
The wrappers chain to the functions installed when the first block opened (so a patch someone
else made survives), log only into the log of the current context (a `ContextVar`: other
threads and other calls pass straight through), and are removed when the last block closes,
unless someone replaced them in the meantime (then theirs stays and ours passes through).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import threading
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen, nnx, traverse_util
from flax.core import lift as core_lift
from flax.core import scope as core_scope
from flax.linen import module as linen_module_lib
from flax.nnx import module as nnx_module_lib

from .errors import NotDeclaredError
from .site import (
  DroppedSow,
  NNXAccumulatorInit,
  SowCall,
  SowSite,
  Transform,
  flatten_value,
  is_pytree_value,
  with_lengths,
)

_SOW_LOG: contextvars.ContextVar[list[SowCall] | None] = contextvars.ContextVar(
  "loopbridge_linen_sow_log", default=None
)
# Enclosing lifted transforms of the current context: (kind, path, out filters, axes, reverse).
_Lift = tuple[str, tuple[str, ...], tuple[core_scope.Filter, ...], tuple[object, ...], bool]
_LIFTS: contextvars.ContextVar[tuple[_Lift, ...]] = contextvars.ContextVar(
  "loopbridge_linen_lifts", default=()
)


def is_array_value(value: object) -> tp.TypeGuard[jax.typing.ArrayLike]:
  """Whether a sown value is one array (or a number), as opposed to a pytree of them."""
  return isinstance(value, (jax.Array, np.ndarray, np.generic, float, int, bool)) or hasattr(
    value, "aval"
  )


def _transforms_for(col: str) -> tuple[Transform, ...]:
  out = []
  for kind, path, filters, axes, reverse in _LIFTS.get():
    index = next((i for i, f in enumerate(filters) if core_scope.in_filter(f, col)), None)
    axis = axes[index] if index is not None else None
    out.append(
      Transform(
        kind,
        path,
        axis if isinstance(axis, int) else None,
        None,
        reverse,
        carries=index is not None,
      )
    )
  return tuple(out)


class SowLog(list):
  """The Linen `sow` calls of one observed block (a list), and the writes made without `sow`.

  `writes` holds one entry per tuple a module wrote itself with `Module.put_variable` (where
  a wrapper such as `nnx.bridge.ToLinen` puts an NNX module's sows); `direct_writes` counts
  every `put_variable` call, tuple or not: a module that writes its variables itself may write
  sows in `apply` that `init` never shows.
  """

  def __init__(self) -> None:
    super().__init__()
    self.writes: list[SowCall] = []
    self.direct_writes = 0
    # Custom-reduce sows of NNX modules run inside the block, by sow name: a wrapper writes
    # their accumulators with `put_variable` after the call.
    self.nnx_accumulators: dict[str, NNXAccumulatorInit] = {}
    # Every `sow` of an NNX module run inside the block: in `init` a wrapper writes none of
    # them, and one whose module has no Variables (flax 0.11+) writes nothing at all there.
    self.nnx_sows = 0


class _Installed:
  """The process-wide install state of the wrappers (guarded by `lock`)."""

  lock = threading.Lock()
  depth = 0
  sow: tp.Any = None  # what `linen.Module.sow` was when the first block opened
  pack: tp.Any = None  # what `flax.core.lift.pack` was then
  put_variable: tp.Any = None  # what `linen.Module.put_variable` was then
  nnx_sow: tp.Any = None  # what `nnx.Module.sow` was then


def _observing_sow(
  self,
  col,
  name,
  value,
  reduce_fn=linen_module_lib.tuple_reduce,
  init_fn=linen_module_lib.tuple_init,
):
  log = _SOW_LOG.get()
  if log is not None and self.scope is not None:
    shape, dtype = (
      (tuple(jnp.shape(value)), str(jnp.result_type(value)))
      if is_array_value(value)
      else (None, None)
    )
    leaf_shapes = None
    if shape is None:
      treedef, leaves = flatten_value(value)
      if is_pytree_value(treedef, leaves):
        leaf_shapes = tuple(tuple(jnp.shape(v)) if is_array_value(v) else None for _, v in leaves)
    log.append(
      SowCall(
        collection=col,
        module_path=tuple(self.scope.path),
        name=name,
        shape=shape,
        dtype=dtype,
        default_reduce=(
          reduce_fn is linen_module_lib.tuple_reduce and init_fn is linen_module_lib.tuple_init
        ),
        dropped=not self.scope.is_mutable_collection(col),
        module_type=type(self).__name__,
        init_fn=init_fn,
        transforms=_transforms_for(col),
        leaf_shapes=leaf_shapes,
      )
    )
  return _Installed.sow(self, col, name, value, reduce_fn, init_fn)


def _observing_nnx_sow(self, variable_type, name, value, *args, **kwargs):
  log = _SOW_LOG.get()
  if isinstance(log, SowLog):
    log.nnx_sows += 1
    bound = inspect.signature(_Installed.nnx_sow).bind(
      self, variable_type, name, value, *args, **kwargs
    )
    bound.apply_defaults()
    reduce_fn, init_fn = bound.arguments.get("reduce_fn"), bound.arguments.get("init_fn")
    custom = (
      reduce_fn is not nnx_module_lib.tuple_reduce or init_fn is not nnx_module_lib.tuple_init
    )
    if custom and callable(init_fn):
      log.nnx_accumulators.setdefault(name, NNXAccumulatorInit(init_fn, variable_type))
  return _Installed.nnx_sow(self, variable_type, name, value, *args, **kwargs)


def _observing_put_variable(self, col, name, value, *args, **kwargs):
  log = _SOW_LOG.get()
  if isinstance(log, SowLog) and self.scope is not None:
    log.direct_writes += 1
    # A wrapper writes a whole subtree at once (`put_variable('intermediates', 'block', {...})`):
    # each tuple inside it is one site.
    items: tp.Iterable[tuple[tuple[str, ...], object]] = ()
    if isinstance(value, tuple):
      items = [((), value)]
    elif isinstance(value, tp.Mapping):
      is_leaf = lambda _, v: isinstance(v, tuple)  # noqa: E731
      items = traverse_util.flatten_dict(dict(value), is_leaf=is_leaf).items()
    for sub, leaf in items:
      if isinstance(leaf, tuple) and leaf:
        log.writes.append(_write_call(self, col, (name, *sub), leaf[0]))
  return _Installed.put_variable(self, col, name, value, *args, **kwargs)


def _write_call(module: tp.Any, col: str, keys: tuple[str, ...], first: tp.Any) -> SowCall:
  """A write of a tuple of values, described as the default-reduce sow it stands for."""
  shape, dtype, leaf_shapes = None, None, None
  if is_array_value(first):
    shape, dtype = tuple(jnp.shape(first)), str(jnp.result_type(first))
  else:
    treedef, leaves = flatten_value(first)
    if is_pytree_value(treedef, leaves):
      leaf_shapes = tuple(tuple(jnp.shape(v)) if is_array_value(v) else None for _, v in leaves)
  return SowCall(
    collection=col,
    module_path=(*module.scope.path, *keys[:-1]),
    name=keys[-1],
    shape=shape,
    dtype=dtype,
    default_reduce=True,
    module_type=type(module).__name__,
    init_fn=linen_module_lib.tuple_init,
    transforms=_transforms_for(col),
    leaf_shapes=leaf_shapes,
  )


def _observing_pack(
  fn, in_variable_filters, out_variable_filters, rng_filters, name=None, enable_kwargs=False
):
  packed = _Installed.pack(
    fn,
    in_variable_filters,
    out_variable_filters,
    rng_filters,
    name=name,
    enable_kwargs=enable_kwargs,
  )
  if _SOW_LOG.get() is None:
    return packed
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
    frame = (name or "transform", tuple(getattr(scope, "path", ())), filters, axes, reverse)
    token = _LIFTS.set((*_LIFTS.get(), frame))
    try:
      return packed(scope_tree, *args, **kwargs)
    finally:
      _LIFTS.reset(token)

  return wrapper


@contextlib.contextmanager
def observe() -> tp.Iterator[SowLog]:
  """Collect every Linen `Module.sow` and `Module.put_variable` call made in this context."""
  with _Installed.lock:
    if _Installed.depth == 0:
      _Installed.sow, _Installed.pack = linen.Module.sow, core_lift.pack
      _Installed.put_variable = linen.Module.put_variable
      _Installed.nnx_sow = nnx.Module.sow
      linen.Module.sow = _observing_sow
      nnx.Module.sow = _observing_nnx_sow
      linen.Module.put_variable = _observing_put_variable
      core_lift.pack = _observing_pack
    _Installed.depth += 1
  log = SowLog()
  token = _SOW_LOG.set(log)
  try:
    yield log
  finally:
    _SOW_LOG.reset(token)
    with _Installed.lock:
      _Installed.depth -= 1
      if _Installed.depth == 0:
        # Put back what was there, unless someone installed their own on top meanwhile: theirs
        # stays, and ours (which it may call) passes straight through outside a block.
        if linen.Module.sow is _observing_sow:
          linen.Module.sow = _Installed.sow
        if core_lift.pack is _observing_pack:
          core_lift.pack = _Installed.pack
        if linen.Module.put_variable is _observing_put_variable:
          linen.Module.put_variable = _Installed.put_variable
        if nnx.Module.sow is _observing_nnx_sow:
          nnx.Module.sow = _Installed.nnx_sow


@dataclasses.dataclass
class LinenFindings:
  """What one Linen call sowed, sorted into records, accumulators and dropped sows."""

  sites: list[SowSite]
  record_paths: set[tuple[str, ...]]  # tuple-reduce sites: (collection, *path)
  accumulators: dict[tuple[str, ...], tuple[SowCall, object]]  # custom reduce: (call, value)
  dropped: list[DroppedSow]


_NON_ARRAY_HELP = (
  "Why: one buffer holds one array shape; a pytree (tuple, dict, struct dataclass) gets one "
  "buffer per array leaf, so its structure and leaf shapes must be the same on every sow. "
  "Fix: sow each kind of value under its own name, and sow arrays or pytrees of arrays. If "
  "the site is '__call__' (or another method name) it comes from capture_intermediates "
  "capturing what a method returns: pass capture_intermediates=filter_fn that selects "
  "modules returning arrays, e.g. lambda mdl, name: not isinstance(mdl, Block)."
)


PRNG_KEY_SOWN = (
  "{where}sow site {site} sows a typed PRNG key ({dtype}, from jax.random.key). Why: record "
  "buffers hold numeric arrays, and a typed key has no numeric dtype to allocate them with. "
  "Fix: sow its data, self.sow(..., jax.random.key_data(key)), and rebuild keys from the "
  "record with jax.random.wrap_key_data(records)."
)


def _describe_value(value: tp.Any) -> tp.Any:
  if hasattr(value, "shape"):
    return tuple(value.shape)
  if isinstance(value, (tuple, list, dict)) or dataclasses.is_dataclass(value):
    return jax.tree.map(
      lambda v: tuple(v.shape) if hasattr(v, "shape") else type(v).__name__, value
    )
  return type(value).__name__


def _scalar_as_array(leaf: object) -> object:
  if isinstance(leaf, (bool, int, float, complex)):
    return jnp.asarray(leaf)
  return leaf


def _record_sites(path: tuple[str, ...], value: tuple, call: SowCall) -> list[SowSite]:
  """The sites of one tuple-reduce sow: one for an array, one per array leaf of a pytree."""
  # A Python number is recorded as a 0-d array of JAX's default dtype for it, as Linen keeps
  # it in the collection (and as 0.1 recorded it).
  flat = [flatten_value(jax.tree.map(_scalar_as_array, v)) for v in value]
  treedefs = {treedef for treedef, _ in flat}
  leaves_ok = all(
    hasattr(leaf, "shape") and hasattr(leaf, "dtype") for _, leaves in flat for _, leaf in leaves
  )
  if len(treedefs) != 1 or not leaves_ok:
    raise NotDeclaredError(
      f"sow site {'/'.join(path)} receives values of different shapes/dtypes or non-array "
      f"values within one call ({[_describe_value(v) for v in value]}). " + _NON_ARRAY_HELP
    )
  (treedef,) = treedefs
  first = flat[0][1]
  for keys, leaf in first:
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      where = f"leaf {''.join(f'[{k}]' for k in keys)} of " if keys else ""
      raise NotDeclaredError(
        PRNG_KEY_SOWN.format(where=where, site="/".join(path), dtype=leaf.dtype)
      )
  pytree = is_pytree_value(treedef, first)
  sites = []
  for index, (keys, _) in enumerate(first):
    shapes = {
      (tuple(leaves[index][1].shape), np.dtype(leaves[index][1].dtype)) for _, leaves in flat
    }
    if len(shapes) != 1:
      where = f"leaf {''.join(f'[{k}]' for k in keys)} of " if pytree else ""
      raise NotDeclaredError(
        f"{where}sow site {'/'.join(path)} receives values of different shapes/dtypes "
        f"within one call ({[_describe_value(v) for v in value]}). " + _NON_ARRAY_HELP
      )
    ((shape, dtype),) = shapes
    sown_shape = call.shape
    if pytree:
      sown_shape = (
        call.leaf_shapes[index]
        if call.leaf_shapes is not None and index < len(call.leaf_shapes)
        else None
      )
    sites.append(
      SowSite(
        path[0],
        path[1:],
        shape,
        str(dtype),
        sown_shape,
        len(value),
        with_lengths(call.transforms, shape, sown_shape),
        leaf=keys if pytree else (),
        treedef=treedef if pytree else None,
        leaf_index=index,
      )
    )
  return sites


def _unlogged_call(path: tuple[str, ...], value: tuple) -> SowCall:
  """A tuple written neither by `sow` nor by `put_variable` (e.g. `variable(...).value = t`):
  a default-reduce record whose sown shape and enclosing transforms are unknown."""
  first = value[0] if value else None
  return SowCall(
    collection=path[0],
    module_path=tuple(path[1:-1]),
    name=path[-1],
    shape=None,
    dtype=None if first is None or not hasattr(first, "dtype") else str(first.dtype),
    default_reduce=True,
    init_fn=linen_module_lib.tuple_init,
  )


def _nnx_accumulator_call(path: tuple[str, ...], init: NNXAccumulatorInit) -> SowCall:
  return SowCall(
    collection=path[0],
    module_path=path[1:-1],
    name=path[-1],
    shape=None,
    dtype=None,
    default_reduce=False,
    init_fn=init,
  )


def classify(
  collections: tp.Mapping[str, object],
  calls: tp.Sequence[SowCall],
  inputs: tp.Mapping[str, object] | None = None,
) -> LinenFindings:
  """Sort the collections a Linen call returned (concrete or abstract) using its sow log.

  Args:
    collections: what the call returned (all of `init`'s variables, or `apply`'s updates).
    calls: the `observe()` log of the same call.
    inputs: for an `apply`, the variables passed in. A tuple the call returned that no Linen
      `sow` explains and that was not passed in is a record written without `sow` (an NNX
      module's sows, written by a wrapper such as `nnx.bridge.ToLinen`). Without `inputs` (an
      `init`) only tuples the log shows written by `Module.put_variable` count.

  Returns:
    The records' sites, their paths, the accumulators and the sows Linen dropped.
  """
  recordable = {c.site for c in calls if c.default_reduce and not c.dropped}
  custom = {c.site: c for c in calls if not c.default_reduce and not c.dropped}
  dropped_sites = {c.site for c in calls if c.dropped}
  first_call = {}
  for c in calls:
    first_call.setdefault(c.site, c)
  writes: dict[tuple[str, ...], SowCall] = {}
  for c in getattr(calls, "writes", ()):
    writes.setdefault(c.site, c)
  is_tuple = lambda _, v: isinstance(v, tuple)  # noqa: E731
  passed_in = (
    None if inputs is None else set(traverse_util.flatten_dict(dict(inputs), is_leaf=is_tuple))
  )
  flat = traverse_util.flatten_dict(dict(collections), is_leaf=is_tuple)
  sites, record_paths, accumulators = [], set(), {}
  nnx_custom = getattr(calls, "nnx_accumulators", {})
  for path, value in flat.items():
    if path in custom:
      accumulators[path] = (custom[path], value)
      continue
    if not isinstance(value, tuple):
      if path[-1] in nnx_custom and (passed_in is None or path not in passed_in):
        # An NNX module's accumulator, written by its wrapper: state to create before loops.
        accumulators[path] = (_nnx_accumulator_call(path, nnx_custom[path[-1]]), value)
      continue
    if path in recordable:
      call = first_call[path]
    elif path in dropped_sites:
      continue
    elif path in writes and (passed_in is None or path not in passed_in):
      call = writes[path]
    elif passed_in is not None and path not in passed_in:
      call = _unlogged_call(path, value)
    else:
      continue
    record_paths.add(path)
    if not value:
      continue
    sites.extend(_record_sites(path, value, call))
  # Custom-reduce sows nested in a path (not a leaf of `flat`): look them up directly.
  for site, call in custom.items():
    if site not in accumulators:
      node: object = collections
      for key in site:
        node = node.get(key) if isinstance(node, tp.Mapping) else None
      accumulators[site] = (call, node)
  dropped, seen = [], set()
  for c in calls:
    if c.dropped and c.site not in seen:
      seen.add(c.site)
      dropped.append(DroppedSow.from_call(c))
  return LinenFindings(sorted(sites, key=lambda s: s.key), record_paths, accumulators, dropped)
