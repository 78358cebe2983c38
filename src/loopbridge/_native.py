"""Loop-stable `sow` for any NNX module graph: native `nnx.Module.sow` sites and `lb.ToNNX` parts.

`lb.preallocate(root, *args, capacity=...)` runs one call of `root` abstractly and finds:
- every native `Module.sow` with the default tuple reduce, as NNX itself stores it (a new
  Variable holding a tuple on the sowing module; `nnx.scan` / `nnx.vmap` over stacked modules
  stack it along leading axes), by diffing the graph's state before and after the call;
- every `lb.ToNNX` submodule call and its arguments (its own discovery then runs on them).
Each native site then gets a `Buffer` on the module that sows, stack axes first
(`(*stack, capacity, *value)`), so `nnx.scan`/`nnx.vmap` slice a layer's buffer exactly as they
slice its parameters; `lb.recorded` moves the stack axes after the record index.

How native sows are intercepted: `nnx.Module.sow` is replaced once, at class level, by
`_recording_sow`, which writes into a buffer only when the sowing module carries one for that
(collection, name) and otherwise calls flax's own `sow` unchanged. Why class level: NNX
rebuilds module objects from their class inside every transform (`nnx.merge` in `nnx.scan`,
`nnx.vmap`, loops, `jit`), so a per-instance patch would be lost there, and swapping the
instance's class would change the types users see. A class attribute survives every
split/merge on flax 0.10 and 0.12 alike, and the buffers themselves travel as ordinary state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
import typing as tp
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx import bridge

from . import _buffers
from . import _capacity
from . import _compat
from . import _to_nnx
from ._capacity import SiteKey
from ._errors import DroppedSowWarning, NotInitializedError, SowMismatchError

BUFFERS_ATTR = _to_nnx.BUFFERS_ATTR
COUNTS_ATTR = _to_nnx.COUNTS_ATTR

_ORIGINAL_SOW = nnx.Module.sow
_SOW_DEFAULTS = inspect.signature(_ORIGINAL_SOW).parameters
_DEFAULT_REDUCE = _SOW_DEFAULTS["reduce_fn"].default
_DEFAULT_INIT = _SOW_DEFAULTS["init_fn"].default
_ORIGINAL_TONNX_CALL = _to_nnx.ToNNX.__call__

_local = threading.local()


# ---------------------------------------------------------------------------------- the sow hook
@functools.lru_cache(maxsize=None)
def _collection_of_type(variable_type: type) -> str:
  try:
    return _compat.collection_name(variable_type)
  except ValueError:  # a Variable subclass flax has no registered collection name for
    return variable_type.__name__


def collection_of(variable_type: tp.Any) -> str:
  """Collection name of a `sow` target: a Variable type or (flax 0.12) its registered name."""
  if isinstance(variable_type, str):
    return variable_type
  return _collection_of_type(variable_type)


@dataclasses.dataclass(frozen=True)
class _NativeSow:
  collection: str
  name: str
  default_reduce: bool
  shape: tuple[int, ...] | None
  dtype: str | None
  init_fn: tp.Callable[[], tp.Any] | None = dataclasses.field(compare=False, default=None)


@dataclasses.dataclass
class _Log:
  sows: list[_NativeSow] = dataclasses.field(default_factory=list)
  bridge_ids: dict[int, tuple] = dataclasses.field(default_factory=dict)
  bridge_calls: list[tuple] = dataclasses.field(default_factory=list)


def _shape_dtype(value):
  if isinstance(value, (jax.Array, np.ndarray, np.generic, float, int, bool)) or hasattr(
      value, "aval"):
    return tuple(jnp.shape(value)), str(jnp.result_type(value))
  return None, None


def _recording_sow(self, variable_type, name, value, reduce_fn=_DEFAULT_REDUCE,
                   init_fn=_DEFAULT_INIT):
  default = reduce_fn is _DEFAULT_REDUCE and init_fn is _DEFAULT_INIT
  log = getattr(_local, "log", None)
  if log is not None:  # discovery: let flax store the value; the state diff reads it back
    log.sows.append(_NativeSow(collection_of(variable_type), name, default,
                               *_shape_dtype(value), init_fn=init_fn))
    with warnings.catch_warnings():
      # flax 0.12 deprecates `sow` outside `nnx.capture`; discovery runs on a throwaway copy.
      warnings.filterwarnings("ignore", category=DeprecationWarning)
      return _ORIGINAL_SOW(self, variable_type, name, value, reduce_fn, init_fn)
  if getattr(_local, "silent", False) and default:
    return True  # lb.lazy_init's concrete call: records start after initialization
  store = vars(self).get(BUFFERS_ATTR)
  if store is not None and default and not isinstance(self, bridge.ToNNX):
    collection = collection_of(variable_type)
    buffer = getattr(self, BUFFERS_ATTR).get(collection, {}).get(name)
    label = f"{type(self).__name__}: {collection}/{name}"
    if not isinstance(buffer, _buffers.Buffer):
      if hasattr(self, "__captures__"):
        # Inside `nnx.capture` (flax 0.12) an undeclared sow (e.g. `method_outputs=`) goes
        # to the capture only, which changes no module state: nothing to record, no error.
        return _ORIGINAL_SOW(self, variable_type, name, value, reduce_fn, init_fn)
      raise SowMismatchError(
          f"{label} was sown, but this module has no buffer for it. Why: buffers are declared "
          "for the sows of the call given to lb.preallocate/lb.lazy_init, and this call makes "
          "a different one (other method, arguments or branch). Fix: declare it before the "
          "loop with lb.preallocate(model, *args, capacity=..., method=...); buffers already "
          "declared are kept.")
    _buffers.append(buffer, getattr(self, COUNTS_ATTR)[collection][name], [value], label)
    if hasattr(self, "__captures__"):
      # Inside `nnx.capture` (flax 0.12) the value is also handed to the capture, which
      # returns this call's sows alongside the output, as it would without loopbridge.
      _ORIGINAL_SOW(self, variable_type, name, value, reduce_fn, init_fn)
    return True
  return _delegate(self, variable_type, name, value, reduce_fn, init_fn)


def _delegate(self, variable_type, name, value, reduce_fn, init_fn):
  """flax's own `sow`, with its warnings (flax 0.12 deprecates `sow` outside `nnx.capture`)
  attributed to the user's line that called `sow` rather than to this hook."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = _ORIGINAL_SOW(self, variable_type, name, value, reduce_fn, init_fn)
  for w in caught:
    warnings.warn(w.message, w.category, stacklevel=3)
  return result


_install_lock = threading.Lock()


def install_sow_hook() -> None:
  """Replace `nnx.Module.sow` by `_recording_sow` (idempotent; see the module docstring)."""
  with _install_lock:
    if nnx.Module.sow is not _recording_sow:
      nnx.Module.sow = _recording_sow


@contextlib.contextmanager
def _thread_flag(name: str, value: tp.Any):
  old = getattr(_local, name, None)
  setattr(_local, name, value)
  try:
    yield
  finally:
    setattr(_local, name, old)


# ------------------------------------------------------------------- lb.ToNNX during discovery
def _abstract(tree):
  def leaf(x):
    if isinstance(x, (jax.Array, np.ndarray, jax.core.Tracer)):
      return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))
    return x
  return jax.tree.map(leaf, tree)


def _concrete(tree):
  # Only shapes and dtypes reach lb.ToNNX's own (abstract) discovery; zeros stand in.
  return jax.tree.map(
      lambda x: jnp.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x, tree)


def _discovering_bridge_call(self, *args, rngs=None, method=None, mutable=None, **kwargs):
  log = getattr(_local, "log", None)
  if log is None or _compat.is_initializing(self):
    return _ORIGINAL_TONNX_CALL(self, *args, rngs=rngs, method=method, mutable=mutable, **kwargs)
  path = log.bridge_ids.get(id(self))
  if path is None:
    raise TypeError(
        f"lb.preallocate found lb.ToNNX({type(_compat.linen_module_of(self)).__name__}) called "
        "inside an NNX transform (nnx.vmap, nnx.scan, ...) of the model, where it cannot tell "
        "which submodule it is. Fix: call lb.preallocate on that lb.ToNNX directly with the "
        "arguments it receives there.")
  # Declare this call's sites on the throwaway copy (placeholder capacity) so the call can run,
  # and remember which sites they are; the real declaration follows with real capacities.
  _compat.set_data_attribute(self, BUFFERS_ATTR, {})
  _compat.set_data_attribute(self, COUNTS_ATTR, {})
  self.loopbridge__sites = ()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DroppedSowWarning)  # warned once, by the real declaration
    self._loopbridge_declare(args, kwargs, method=method, capacity=1, overflow="drop")
  log.bridge_calls.append((path, _abstract(args), _abstract(kwargs), method,
                           tuple(info.site for info in self.loopbridge__sites)))
  return _ORIGINAL_TONNX_CALL(self, *args, rngs=rngs, method=method, mutable=mutable, **kwargs)


@contextlib.contextmanager
def _observing(log: _Log):
  with _install_lock:
    _to_nnx.ToNNX.__call__ = _discovering_bridge_call
  try:
    with _thread_flag("log", log):
      yield
  finally:
    with _install_lock:
      _to_nnx.ToNNX.__call__ = _ORIGINAL_TONNX_CALL


# ---------------------------------------------------------------------------- state diffing
def _flat_state(state, prefix=()) -> dict[tuple, tp.Any]:
  out = {}
  for key, value in state.items():
    if isinstance(value, tp.Mapping):
      out.update(_flat_state(value, (*prefix, key)))
    else:
      out[(*prefix, key)] = value
  return out


@dataclasses.dataclass(frozen=True)
class NativeSite:
  """One native sow site: where it lives and what one recorded value looks like."""

  module_path: tuple  # path of the sowing module from the root
  collection: str
  name: str
  shape: tuple[int, ...]  # one recorded value, including axes added by nnx.scan / nnx.vmap
  dtype: np.dtype
  stack_axes: int  # leading axes of `shape` added by transforms over stacked modules

  @property
  def site(self) -> SiteKey:
    return (self.collection, *map(str, self.module_path), self.name)


def _stack_axes(path, entry_shape, sows: list[_NativeSow]) -> int:
  candidates = {len(entry_shape) - len(s.shape) for s in sows
                if s.shape is not None and len(s.shape) <= len(entry_shape)
                and tuple(entry_shape[len(entry_shape) - len(s.shape):]) == s.shape}
  if len(candidates) != 1:
    raise SowMismatchError(
        f"native sow site {'/'.join(map(str, path))} holds values of shape {entry_shape}, "
        f"which loopbridge cannot relate to the sown shapes {sorted({s.shape for s in sows})}. "
        "Why: transforms over stacked modules (nnx.scan, nnx.vmap) must add their axes in "
        "front (axis 0), as they do by default. Fix: sow arrays, and stack modules along "
        "axis 0.")
  return candidates.pop()


def _discover(root: nnx.Module, call: tp.Callable, args, kwargs):
  install_sow_hook()
  graphdef, state = nnx.split(root)
  before = _flat_state(state)
  log = _Log()

  def run(state):
    clone = nnx.merge(graphdef, state)
    log.bridge_ids = {id(node): tuple(path) for path, node in _compat.iter_graph(clone)
                      if isinstance(node, _to_nnx.ToNNX)}
    with _observing(log):
      call(clone, *args, **kwargs)
    return nnx.split(clone)[1]

  # Closing over the (concrete) inputs is fine: under eval_shape nothing is executed.
  after = _flat_state(jax.eval_shape(run, state))

  sites, created, stale = [], [], []
  for path, leaf in after.items():
    value = _compat.variable_value(leaf)
    old = before.get(path)
    var_type = _compat.state_leaf_type(leaf)
    collection, name = collection_of(var_type), path[-1]
    sows = [s for s in log.sows if s.collection == collection and s.name == name]
    if isinstance(value, tuple) and sows and all(s.default_reduce for s in sows):
      old_value = _compat.variable_value(old) if old is not None else ()
      entries = value[len(old_value):] if isinstance(old_value, tuple) else value
      if old is not None:
        stale.append(path)
      if not entries:
        continue
      shapes = {(tuple(e.shape), np.dtype(e.dtype)) for e in entries if hasattr(e, "shape")}
      if len(shapes) != 1 or not all(hasattr(e, "shape") for e in entries):
        raise SowMismatchError(
            f"native sow site {'/'.join(map(str, path))} receives values of different "
            "shapes/dtypes or non-array values within one call. Why: one buffer holds one "
            "array shape. Fix: sow each kind of value under its own name, and sow arrays.")
      (shape, dtype), = shapes
      sites.append(NativeSite(path[:-1], collection, name, shape, dtype,
                              _stack_axes(path, shape, sows)))
    elif old is None and not isinstance(value, tuple) and hasattr(value, "shape"):
      created.append((path, var_type, value, sows))
  return sites, created, stale, log.bridge_calls


# --------------------------------------------------------------------------- declaring buffers
def _new_state_variable(var_type, abstract, sows):
  """The Variable a call would create on first use, made before the loop (shape-stable)."""
  custom = [s for s in sows if not s.default_reduce and s.init_fn is not None]
  if custom:  # a custom-reduce sow: start from init_fn(), broadcast to the accumulated shape
    initial = custom[0].init_fn()
    if not hasattr(initial, "__array__") and not isinstance(initial, (int, float, bool)):
      return None
    try:
      return var_type(jnp.broadcast_to(jnp.asarray(initial, abstract.dtype), abstract.shape))
    except ValueError:
      return None
  if collection_of(var_type) in ("perturbations", "Perturbation"):
    return var_type(jnp.zeros(abstract.shape, abstract.dtype))  # as `perturb` creates it
  return None


def _resolve(capacity, native_sites, bridge_calls, bridges, model_name):
  """Capacity per native site and a per-lb.ToNNX capacity spec (exact keys), or their own."""
  bridge_sites = {}
  for path, *_, sites in bridge_calls:
    bridge_sites.setdefault(path, set()).update(sites)
  native_keys = [s.site for s in native_sites]
  if capacity is None:
    native = _capacity.resolve_capacities(None, native_keys, model_name=model_name)
    per_bridge = {path: _to_nnx._thaw_capacity(bridges[path].loopbridge__settings.capacity)
                  for path in bridge_sites}
    return native, per_bridge
  global_keys = {}
  for path, sites in bridge_sites.items():
    for site in sites:
      global_keys[(site[0], *map(str, path), *site[1:])] = (path, site)
  resolved = _capacity.resolve_capacities(capacity, sorted({*native_keys, *global_keys}),
                                          model_name=model_name)
  # Per lb.ToNNX: its own site paths -> capacity (exact keys); each call declares its subset.
  per_bridge: dict = {path: {} for path in bridge_sites}
  for key, (path, site) in global_keys.items():
    per_bridge[path][site] = resolved[key]
  return {k: resolved[k] for k in native_keys}, per_bridge


def _declare_native(module: nnx.Module, site: NativeSite, capacity: int, overflow: str) -> None:
  if not vars(module).get(BUFFERS_ATTR):
    _compat.set_data_attribute(module, BUFFERS_ATTR, {})
    _compat.set_data_attribute(module, COUNTS_ATTR, {})
  buffers, counts = getattr(module, BUFFERS_ATTR), getattr(module, COUNTS_ATTR)
  stack, value = site.shape[:site.stack_axes], site.shape[site.stack_axes:]
  old = buffers.get(site.collection, {}).get(site.name)
  if old is not None:
    old_value = _compat.variable_value(old)
    if (old_value.shape == (*stack, capacity, *value) and old_value.dtype == site.dtype
        and old.overflow == overflow):
      return  # same storage: keep what it recorded
  buffer = _buffers.Buffer(jnp.zeros((*stack, capacity, *value), site.dtype),
                           overflow=overflow, stack_axes=site.stack_axes)
  count = _buffers.Count(jnp.zeros(stack, _buffers.COUNT_DTYPE))
  buffers.setdefault(site.collection, {})[site.name] = buffer
  counts.setdefault(site.collection, {})[site.name] = count
  _compat.set_data_attribute(module, BUFFERS_ATTR, buffers)
  _compat.set_data_attribute(module, COUNTS_ATTR, counts)


def _split_target(model: tp.Any, method: tp.Any, what: str):
  """(root module, function called as fn(root, *args, **kwargs))."""
  if isinstance(model, nnx.Module):
    root = model
    if method is None:
      return root, lambda m, *a, **k: m(*a, **k)
    if isinstance(method, str):
      return root, lambda m, *a, **k: getattr(m, method)(*a, **k)
    if callable(method):
      return root, method
  elif inspect.ismethod(model) and isinstance(model.__self__, nnx.Module):
    if method is not None:
      raise TypeError(f"{what}: pass either a bound method or method=, not both.")
    func = model.__func__
    return model.__self__, lambda m, *a, **k: func(m, *a, **k)
  raise TypeError(
      f"{what} needs an NNX module (or a bound method of one), got {type(model).__name__}. "
      "Fix: wrap Linen modules with lb.ToNNX(module, rngs=nnx.Rngs(0)); pass method= as a "
      "method name or a function taking the module first.")


def preallocate_graph(model: tp.Any, args: tuple, kwargs: dict, *, capacity, overflow,
                      method=None) -> tp.Any:
  """`lb.preallocate` for a root that is not an `lb.ToNNX` (see `preallocate`)."""
  capacity = _capacity.check_capacity_spec(capacity)
  if overflow is not None:
    _capacity.check_overflow(overflow)
  root, call = _split_target(model, method, "lb.preallocate")
  bridges = {tuple(p): n for p, n in _compat.iter_graph(root) if isinstance(n, _to_nnx.ToNNX)}
  for path, node in bridges.items():
    if node.loopbridge__sites is None:
      raise NotInitializedError(
          f"lb.preallocate: the lb.ToNNX at '{'/'.join(map(str, path))}' is not initialized. "
          "Why: its Linen parameters are created from sample inputs. Fix: "
          "lb.lazy_init(model, *sample_args, capacity=...) first (or lazy_init that part).")
  native_sites, created, stale, bridge_calls = _discover(root, call, args, kwargs)
  native_caps, per_bridge = _resolve(capacity, native_sites, bridge_calls, bridges,
                                     type(root).__name__)
  nodes = {tuple(p): n for p, n in _compat.iter_graph(root)}
  for path in stale:  # growing tuples left by earlier un-preallocated calls: buffers replace them
    module = nodes.get(tuple(path[:-1]))
    if isinstance(module, nnx.Module) and path[-1] in vars(module):
      delattr(module, path[-1])
  for site in native_sites:
    module = nodes[tuple(site.module_path)]
    _declare_native(module, site, native_caps[site.site],
                    overflow if overflow is not None else "error")
  for path, var_type, abstract, sows in created:
    module = nodes.get(tuple(path[:-1]))
    variable = _new_state_variable(var_type, abstract, sows)
    if isinstance(module, nnx.Module) and variable is not None:
      setattr(module, path[-1], variable)
  for path, a_args, a_kwargs, method_, sites in bridge_calls:
    node = bridges[path]
    spec = per_bridge[path]
    if capacity is not None:  # resolved over the whole graph: this call's sites only
      spec = {_capacity.site_path_str(site): spec[site] for site in sites} or None
    node._loopbridge_declare(
        _concrete(a_args), _concrete(a_kwargs), method=method_, capacity=spec,
        overflow=overflow if overflow is not None else node.loopbridge__settings.overflow)
  return model


# ------------------------------------------------------------------------------ public entry
def preallocate(module: tp.Any, *sample_args: tp.Any,
                capacity: _capacity.CapacitySpec | None = None, overflow: str | None = None,
                method: tp.Any = None, **kwargs: tp.Any) -> tp.Any:
  """Declare buffers for every sow a call makes, anywhere in an NNX module graph.

  On an `lb.ToNNX` this declares (or re-declares) the buffers of its Linen sows. On any other
  NNX module it runs the call abstractly (no FLOPs) and declares a buffer for every native
  `Module.sow` with the default tuple reduce (any `nnx.Variable` type; inside `nnx.scan` /
  `nnx.vmap` over stacked modules too) and for every `lb.ToNNX` submodule called, so the
  whole model records inside NNX loops under jit without changing its code. Perturbation
  Variables (`Module.perturb`) and custom-reduce sow accumulators the call would create are
  created now (zeros / `init_fn()`), and tuples left by earlier calls are removed. Parameters
  are untouched.

  Args:
    module: an NNX module (or a bound method of one), e.g. an `lb.ToNNX`.
    *sample_args: sample inputs of the call (only shapes and dtypes matter).
    capacity: an int for every site, or a mapping from collection name / `/`-joined path from
      the root inside the collection (e.g. `"layers/h"`, `"llm/Block_0/x"`) / glob to an int.
      Defaults to the capacity given to each `lb.ToNNX`; required for native sows.
    overflow: `"error"` (default), `"drop"` or `"wrap"`.
    method: the method the loop calls: a name, a function taking the module first, or (for
      an `lb.ToNNX`) a Linen method. Default `__call__`.
    **kwargs: keyword arguments of the call.

  Returns:
    `module`.

  Raises:
    CapacityError: a malformed capacity/overflow, a site no key covers, a key matching no site.
    NotInitializedError: an `lb.ToNNX` in the graph was not initialized yet.
    SowMismatchError: a site receives values of different shapes within one call.
    TypeError: `module` is not an NNX module.

  Example:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import nnx
    >>> class Net(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.lin = nnx.Linear(2, 3, rngs=rngs)
    ...   def __call__(self, x):
    ...     h = self.lin(x)
    ...     self.sow(nnx.Intermediate, "h", h)
    ...     return h
    >>> model = lb.preallocate(Net(nnx.Rngs(0)), jnp.ones((1, 2)), capacity=4)
    >>> _ = model(jnp.ones((1, 2)))
    >>> lb.recorded(model)["intermediates"]["h"].shape
    (1, 1, 3)
  """
  if isinstance(module, bridge.ToNNX):
    return _to_nnx.preallocate(module, *sample_args, capacity=capacity, overflow=overflow,
                               method=method, **kwargs)
  return preallocate_graph(module, sample_args, kwargs, capacity=capacity, overflow=overflow,
                           method=method)


def lazy_init(model: tp.Any, *args: tp.Any, capacity: _capacity.CapacitySpec | None = None,
              overflow: str | None = None, **kwargs: tp.Any) -> tp.Any:
  """Initialize bridged parts from sample inputs and preallocate a buffer per sow site.

  On an `lb.ToNNX`: `flax.nnx.bridge.lazy_init` plus buffers for its Linen sows. On any other
  NNX module (or bound method): the call initializes every `lb.ToNNX` it reaches (native sows
  made during this call are not kept), then `lb.preallocate` declares buffers for every sow of
  the same call — native and bridged — with `capacity` resolved over the whole graph.

  Args:
    model: an `lb.ToNNX`, or any NNX module (or bound method of one).
    *args: sample inputs, as for the model's call.
    capacity: as for `lb.preallocate`.
    overflow: `"error"` (default), `"drop"` or `"wrap"`.
    **kwargs: keyword arguments of the call (`method=` included for an `lb.ToNNX`).

  Returns:
    `model`, initialized.

  Raises:
    CapacityError: bad capacity/overflow, a site no key covers, or a key matching no site.
    TypeError: `model` is not an NNX module or method.

  Example:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return nn.Dense(2)(x)
    >>> model = lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), jnp.ones((1, 3)), capacity=5)
    >>> lb.recorded(model)["intermediates"]["x"].shape
    (0, 1, 3)
  """
  if isinstance(model, bridge.ToNNX):
    return _to_nnx.lazy_init(model, *args, capacity=capacity, overflow=overflow, **kwargs)
  capacity = _capacity.check_capacity_spec(capacity)
  if overflow is not None:
    _capacity.check_overflow(overflow)
  install_sow_hook()
  # Bridged parts initialize with a placeholder capacity; the declaration over the whole graph
  # (one capacity spec resolved against every site) follows.
  with _thread_flag("silent", True), warnings.catch_warnings():
    warnings.simplefilter("ignore", DroppedSowWarning)  # warned once, by preallocate below
    _to_nnx.lazy_init(model, *args, capacity=1, overflow="drop", **kwargs)
  return preallocate_graph(model, args, kwargs, capacity=capacity, overflow=overflow)


# ----------------------------------------------------------------- reading stacked buffers
def flat_view(buffer: _buffers.Buffer, count: _buffers.Count
              ) -> tuple[_buffers.Buffer, _buffers.Count]:
  """A stacked native buffer `(*stack, capacity, ...)` seen as `(capacity, *stack, ...)`.

  Every layer of a stack sows once per call, so the counts agree; their maximum is used.
  """
  k = getattr(buffer, "stack_axes", 0) or 0
  if not k:
    return buffer, count
  value = _compat.variable_value(buffer)
  moved = jnp.moveaxis(value, k, 0)
  n = jnp.max(_compat.variable_value(count))
  return _buffers.Buffer(moved, overflow=buffer.overflow), _buffers.Count(n)
