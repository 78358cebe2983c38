"""`lb.ToNNX`: a `flax.nnx.bridge.ToNNX` whose state never changes shape.

Stock `ToNNX.__call__` rebuilds a new Variable for every updated collection value and appends
every `sow` to a growing tuple, so NNX loops (which require the same Variables and the same
structure before and after the body) reject it. This subclass:
- keeps the Linen variables where stock `ToNNX` keeps them (same attribute paths, same types),
  but writes updates into the *existing* Variables;
- moves each call's sown values into preallocated `Buffer`s (one per sow site) and advances a
  `Count`, so the structure is identical after every call.
The design note in `src/loopbridge/README.md` explains the choices.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import typing as tp
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen
from flax import nnx
from flax import traverse_util
from flax.core import meta
from flax.nnx import bridge
from flax.nnx.bridge import variables as bridge_variables

from . import _buffers
from . import _capacity
from . import _compat
from . import _discovery
from . import _sharding
from ._capacity import SiteKey, site_label
from ._errors import (DroppedSowWarning, NotInitializedError, SowMismatchError,
                      StructureChangeError)

# Attribute names: namespaced, because `ToNNX.__getattr__` forwards unknown names to the Linen
# module and users' Linen variables become attributes too.
BUFFERS_ATTR = _buffers.BUFFERS_ATTR
COUNTS_ATTR = _buffers.COUNTS_ATTR
DROPPED_ATTR = "loopbridge__dropped"  # sows Linen discarded (static: tuple of SowCall)


@dataclasses.dataclass(frozen=True)
class SiteInfo:
  """Static description of one declared sow site (kept in the GraphDef, hashable)."""

  collection: str
  path: tuple[str, ...]  # inside the collection
  shape: tuple[int, ...]  # one recorded value
  dtype: str
  per_call: int  # values one call of the declared signature sows here
  capacity: int
  overflow: str
  sown_shape: tuple[int, ...] | None  # shape passed to `sow` (differs when lifted by nn.scan/vmap)
  lifts: tuple[_discovery.Lift, ...] = ()  # enclosing Linen lifted transforms, outermost first

  @property
  def site(self) -> SiteKey:
    return (self.collection, *self.path)


@dataclasses.dataclass(frozen=True)
class _Settings:
  capacity: tp.Any  # hashable form of the capacity spec (int, tuple of items, or None)
  overflow: str
  capture_intermediates: tp.Any = False  # Linen apply(capture_intermediates=...): bool or filter


def _freeze_capacity(capacity):
  if isinstance(capacity, tp.Mapping):
    return tuple(sorted(capacity.items()))
  return capacity


def _thaw_capacity(capacity):
  if isinstance(capacity, tuple):
    return dict(capacity)
  return capacity


# Capacity/overflow handed from `lb.lazy_init(root, ...)` to every lb.ToNNX initialized inside
# it (the root may be any NNX module holding bridged parts).
_PENDING_DECLARATION: contextvars.ContextVar[tuple[tp.Any, tp.Any] | None] = (
    contextvars.ContextVar("loopbridge_pending_declaration", default=None))


@contextlib.contextmanager
def pending_declaration(capacity, overflow):
  token = _PENDING_DECLARATION.set((capacity, overflow))
  try:
    yield
  finally:
    _PENDING_DECLARATION.reset(token)


def _get_nested(tree: tp.Any, path: tp.Sequence[str]) -> tp.Any:
  for key in path:
    if not isinstance(tree, tp.Mapping) or key not in tree:
      return None
    tree = tree[key]
  return tree


def _set_nested(tree: dict, path: tp.Sequence[str], value: tp.Any) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _unbox(value: tp.Any) -> tp.Any:
  if isinstance(value, meta.AxisMetadata):
    return value.unbox()
  if isinstance(value, bridge_variables.NNXMeta):
    return value.value
  return value


def _merge_mutable(user_mutable: tp.Any, record_cols: tp.Collection[str]) -> tp.Any:
  """The Linen `mutable=` filter for apply: the user's choice plus every recorded collection."""
  if user_mutable is True or not record_cols:
    return user_mutable if user_mutable is not None else False
  if user_mutable in (None, False):
    return sorted(record_cols)
  if isinstance(user_mutable, str):
    return sorted({user_mutable, *record_cols})
  if isinstance(user_mutable, linen.module.DenyList):
    deny = user_mutable.deny
    deny = {deny} if isinstance(deny, str) else set(deny)
    return linen.module.DenyList(tuple(sorted(deny - set(record_cols))))
  if isinstance(user_mutable, (list, tuple, set, frozenset)):
    return sorted({*user_mutable, *record_cols})
  # A callable filter: Linen filters are `str | Sequence | bool | DenyList | callable`.
  return lambda col: col in record_cols or user_mutable(col)


class ToNNX(bridge.ToNNX):
  """A loop-stable `flax.nnx.bridge.ToNNX`: records every `sow` into preallocated buffers.

  Wrap a Linen module, call `lazy_init` with sample inputs and a `capacity`, and the result is
  an NNX module whose state keeps the same Variables, shapes and structure on every call, so
  it runs inside `nnx.while_loop`, `nnx.fori_loop` and `nnx.scan` under jit.

  Args:
    module: the Linen module to wrap.
    rngs: `nnx.Rngs` or a key, as for `flax.nnx.bridge.ToNNX`.
    capacity: default capacity for `lazy_init` (an int for every sow site or a mapping from a
      collection name, a `/`-joined sow path or a glob to an int). `lazy_init(capacity=...)`
      overrides it.
    overflow: default overflow policy: `"error"`, `"drop"` or `"wrap"`.
    capture_intermediates: Linen's `apply(capture_intermediates=...)`: `True` records every
      submodule's `__call__` output (`'intermediates'/<path>/__call__`), a filter
      `fn(module, method_name) -> bool` chooses; recorded with capacity like any sow.

  Raises:
    TypeError: `module` is not a Linen module.
    CapacityError: a malformed `capacity` or `overflow`.

  Example:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     h = nn.Dense(3)(x)
    ...     self.sow("intermediates", "h", h)
    ...     return h
    >>> model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
    >>> _ = lb.lazy_init(model, jnp.ones((1, 2)), capacity=4)
    >>> _ = model(jnp.ones((1, 2)))
    >>> lb.recorded(model)["intermediates"]["h"].shape
    (1, 1, 3)
  """

  def __init__(self, module: linen.Module, rngs: tp.Any = None, *,
               capacity: _capacity.CapacitySpec | None = None, overflow: str = "error",
               capture_intermediates: bool | tp.Callable[[linen.Module, str], bool] = False):
    if not isinstance(module, linen.Module):
      raise TypeError(
          f"lb.ToNNX wraps a Linen module (an instance of flax.linen.Module), got "
          f"{type(module).__name__}. "
          + ("It is an NNX module: it needs no bridge; use lb.preallocate on it directly."
             if isinstance(module, nnx.Module) else
             "Fix: pass an instance, e.g. lb.ToNNX(MyLinenModule(...), rngs=nnx.Rngs(0))."
             if isinstance(module, type) else
             "Fix: pass a Linen module instance.")
      )
    capacity = _capacity.check_capacity_spec(capacity)
    overflow = _capacity.check_overflow(overflow)
    super().__init__(module, rngs)
    self.loopbridge__settings = _Settings(_freeze_capacity(capacity), overflow,
                                          capture_intermediates)
    self.loopbridge__sites: tuple[SiteInfo, ...] | None = None
    self.loopbridge__dropped: tuple[_discovery.SowCall, ...] = ()
    _compat.set_data_attribute(self, BUFFERS_ATTR, {})
    _compat.set_data_attribute(self, COUNTS_ATTR, {})

  # ------------------------------------------------------------------ initialization
  def lazy_init(self, *args: tp.Any, capacity: _capacity.CapacitySpec | None = None,
                overflow: str | None = None, **kwargs: tp.Any) -> "ToNNX":
    """Initialize the Linen variables from sample inputs and declare the sow buffers.

    Same as `lb.lazy_init(self, *args, capacity=..., overflow=..., **kwargs)`.
    """
    return lazy_init(self, *args, capacity=capacity, overflow=overflow, **kwargs)

  def _loopbridge_initialize(self, args, kwargs, rngs, method):
    """What `__call__` does while `bridge.lazy_init` runs: Linen init, then declare buffers."""
    module = _compat.linen_module_of(self)
    init_rngs = _compat.bridge_call_rngs(rngs if rngs is not None else _compat.rngs_of(self),
                                         initializing=True)
    kwargs = {k: v for k, v in kwargs.items() if k != "mutable"}
    with _discovery.observe_sows() as init_sows:
      out, variables = module.init_with_output(init_rngs, *args, method=method, **kwargs)
    # Values sown with the default tuple reduce during init (collections other than
    # 'intermediates' are mutable at init) are records, not state: keep them out of the
    # Variables, or they would grow on every later call.
    tuple_paths = _discovery.tuple_sow_paths(init_sows)
    flat = {p: v for p, v in traverse_util.flatten_dict(dict(variables)).items()
            if p not in tuple_paths}
    variables = traverse_util.unflatten_dict(flat)
    for name, value in bridge_variables.linen_vars_to_nnx_attrs(variables).items():
      _compat.set_data_attribute(self, name, value)
    _compat.set_linen_attribute_names(
        self, set(_compat.linen_attribute_names(self)) | set(self._loopbridge_top_names(variables)))

    pending = _PENDING_DECLARATION.get()
    settings = self.loopbridge__settings
    capacity, overflow = pending if pending is not None else (None, None)
    if capacity is None:
      capacity = _thaw_capacity(settings.capacity)
    if overflow is None:
      overflow = settings.overflow
    self._loopbridge_declare(args, kwargs, method=method, capacity=capacity, overflow=overflow)
    return out

  @staticmethod
  def _loopbridge_top_names(variables):
    names = set()
    for col in variables.values():
      names.update(col.keys())
    return names

  def _loopbridge_linen_attrs(self) -> dict[str, tp.Any]:
    return {name: getattr(self, name) for name in _compat.linen_attribute_names(self)}

  def _loopbridge_declare(self, args, kwargs, *, method, capacity, overflow) -> None:
    """Discover the sow sites of `apply(*args, **kwargs)` and (re)declare their buffers."""
    _check_method(_compat.linen_module_of(self), method)
    capacity = _capacity.check_capacity_spec(capacity)
    overflow = _capacity.check_overflow(overflow)
    module = _compat.linen_module_of(self)
    kwargs = {k: v for k, v in kwargs.items() if k != "mutable"}
    variables = bridge_variables.nnx_attrs_to_linen_vars(self._loopbridge_linen_attrs())
    rng_source = _compat.rngs_of(self)
    # Placeholder keys with the same stream names: discovery must not advance the model's
    # streams (that would shift every later random draw against a plain Linen reference).
    rng_names = [n for n, _ in rng_source.items()] if isinstance(rng_source, nnx.Rngs) else []
    if isinstance(rng_source, jax.Array) or "params" not in rng_names:
      rng_names.append("params")
    rngs = {name: jax.random.key(0) for name in rng_names if name != "default"}
    found = _discovery.discover(
        module, variables, tuple(args), dict(kwargs), method=method, rngs=rngs,
        capture_intermediates=self.loopbridge__settings.capture_intermediates)
    for call in found.dropped:
      # Name the transform that drops it when discovery saw it (innermost non-carrying one).
      culprit = next((f"nn.{t.kind} at '{'/'.join(t.path) or '<root>'}'"
                      for t in reversed(call.lifts) if not t.carries),
                     "lifted transform (nn.scan, nn.vmap, ...)")
      warnings.warn(
          f"{call.module_type} at Linen path '{'/'.join(call.module_path) or '<root>'}' sows "
          f"'{call.name}' into collection '{call.collection}', but Linen discarded it: an "
          f"enclosing {culprit} does not carry the "
          f"'{call.collection}' collection, so the value is silently lost. Fix: add "
          f"'{call.collection}': 0 to that transform's `variable_axes` (e.g. "
          f"nn.scan(..., variable_axes={{'params': 0, '{call.collection}': 0}})).",
          DroppedSowWarning, stacklevel=4)
    # Kept for lb.sow_sites; without init_fn, so the static attribute stays plain data.
    known = {c.site for c in self.loopbridge__dropped}
    self.loopbridge__dropped = self.loopbridge__dropped + tuple(
        dataclasses.replace(c, init_fn=None) for c in found.dropped if c.site not in known)

    self._loopbridge_add_accumulators(found.accumulators, found.accumulator_shapes, variables)
    sites = sorted(found.sites)
    capacities = _capacity.resolve_capacities(capacity, sites,
                                              model_name=type(module).__name__)
    old_sites = {info.site: info for info in (self.loopbridge__sites or ())}
    buffers = getattr(self, BUFFERS_ATTR)
    counts = getattr(self, COUNTS_ATTR)
    new_infos = dict(old_sites)
    shardings = _sharding.infer_buffer_shardings(
        args, kwargs, {s: (found.sites[s].shape, found.sites[s].sown_shape) for s in sites})
    for site in sites:
      f = found.sites[site]
      info = SiteInfo(site[0], site[1:], f.shape, str(f.dtype), f.per_call, capacities[site],
                      overflow, f.sown_shape, f.lifts)
      old = old_sites.get(site)
      same_storage = old is not None and (old.shape, old.dtype, old.capacity, old.overflow) == (
          info.shape, info.dtype, info.capacity, info.overflow)
      if not same_storage:
        _set_nested(buffers, site, _buffers.new_buffer(info.capacity, info.shape, f.dtype,
                                                       overflow, shardings.get(site)))
        _set_nested(counts, site, _buffers.new_count())
      new_infos[site] = info
    _compat.set_data_attribute(self, BUFFERS_ATTR, buffers)
    _compat.set_data_attribute(self, COUNTS_ATTR, counts)
    self.loopbridge__sites = tuple(new_infos[s] for s in sorted(new_infos))

  def _loopbridge_add_accumulators(self, accumulators, shapes, variables) -> None:
    """Give custom-reduce sows their `init_fn()` value now, so no call creates a Variable.

    Linen's `sow` starts an accumulator from `init_fn()` when it does not exist yet; storing
    that value before the first call is therefore equivalent, and keeps the structure fixed.
    Inside `nn.scan`/`nn.vmap` Linen stores the accumulator stacked, so the initial value is
    broadcast to the shape discovery saw.
    """
    missing = {site: call for site, call in accumulators.items()
               if _get_nested(variables, site) is None}
    if not missing:
      return
    for site, call in missing.items():
      target = shapes.get(site)

      def fit(init, want, site=site):
        init = jnp.asarray(init)
        if want is None or init.shape == tuple(want.shape):
          return init
        try:
          return jnp.broadcast_to(init, want.shape).astype(want.dtype)
        except ValueError:
          raise StructureChangeError(
              f"the accumulator sown at '{site_label(site)}' starts as init_fn() of shape "
              f"{init.shape} but Linen stores it as {tuple(want.shape)} (a lifted transform "
              "stacks it on a non-leading axis). Why: loopbridge must create it before the "
              "loop. Fix: stack it on axis 0 (variable_axes={'intermediates': 0}) or sow it "
              "outside the transform.") from None

      initial = call.init_fn()
      if target is not None:
        initial = jax.tree.map(fit, initial, target)
      _set_nested(variables, site, initial)
    only_new: dict = {}  # convert just the new accumulators; existing Variables stay as they are
    for site in missing:
      _set_nested(only_new, site, _get_nested(variables, site))
    for name, value in bridge_variables.linen_vars_to_nnx_attrs(only_new).items():
      existing = getattr(self, name, None) if name in _compat.linen_attribute_names(self) else None
      if isinstance(existing, dict) and isinstance(value, dict):
        merged = traverse_util.unflatten_dict({**traverse_util.flatten_dict(existing),
                                               **traverse_util.flatten_dict(value)})
        _compat.set_data_attribute(self, name, merged)
      else:
        _compat.set_data_attribute(self, name, value)
    _compat.set_linen_attribute_names(
        self, set(_compat.linen_attribute_names(self)) | {s[1] for s in missing})

  # ------------------------------------------------------------------ calling
  def __call__(self, *args: tp.Any, rngs: tp.Any = None, method: tp.Any = None,
               mutable: tp.Any = None, **kwargs: tp.Any) -> tp.Any:
    """Apply the Linen module, recording its sows in place. Same signature as stock ToNNX.

    Recording rule: collections that hold declared sow sites, and `intermediates`, are always
    applied as mutable (that is how values reach the buffers, and how a sow without a buffer
    is reported rather than lost), whatever `mutable` says; `mutable` keeps its
    Linen meaning for every other collection (`batch_stats`, `cache`, ...). Only the output
    is returned, as in stock `ToNNX`.
    """
    _check_method(_compat.linen_module_of(self), method)
    if _compat.is_initializing(self):
      return self._loopbridge_initialize(args, kwargs, rngs, method)
    sites = self.loopbridge__sites
    if sites is None:
      raise NotInitializedError(
          f"lb.ToNNX({type(_compat.linen_module_of(self)).__name__}) was called before it was "
          "initialized. Why: the Linen variables and the sow buffers are created from sample "
          "inputs. Fix: lb.lazy_init(model, *sample_args, capacity=N) first (or "
          "model.lazy_init(...)).")
    module = _compat.linen_module_of(self)
    attrs = self._loopbridge_linen_attrs()
    variables = bridge_variables.nnx_attrs_to_linen_vars(attrs)
    # 'intermediates' (where `sow` writes by default) is always recorded too, so a sow this
    # call makes without a declared buffer is reported instead of silently dropped.
    record_cols = {info.collection for info in sites} | {"intermediates"}
    if mutable is None:
      mutable = _compat.current_bridge_mutable()
    apply_mutable = _merge_mutable(mutable, record_cols)
    call_rngs = _compat.bridge_call_rngs(rngs if rngs is not None else _compat.rngs_of(self),
                                         initializing=False)
    result = module.apply(variables, *args, rngs=call_rngs, method=method,
                          mutable=apply_mutable,
                          capture_intermediates=self.loopbridge__settings.capture_intermediates,
                          **kwargs)
    if apply_mutable is False:
      return result
    out, updates = result
    self._loopbridge_absorb(updates, attrs, variables)
    return out

  def _loopbridge_absorb(self, updates, attrs, variables_in) -> None:
    """Write one call's updates into the existing Variables and buffers."""
    buffers = getattr(self, BUFFERS_ATTR)
    counts = getattr(self, COUNTS_ATTR)
    flat_in = traverse_util.flatten_dict(dict(variables_in))
    for path, value in traverse_util.flatten_dict(dict(updates)).items():
      if isinstance(value, tuple):
        buffer = _get_nested(buffers, path)
        if not isinstance(buffer, _buffers.Buffer):
          raise SowMismatchError(
              f"this call sowed into '{site_label(path)}', a site with no buffer. Why: buffers "
              "are declared for the sows of the call signature given to lazy_init/preallocate, "
              "and this call makes a different one (other method, arguments or branch). Fix: "
              "declare it before the loop with lb.preallocate(model, *args, capacity=..., "
              "method=..., **kwargs); buffers already declared are kept.")
        _buffers.append(buffer, _get_nested(counts, path), value, site_label(path))
        continue
      if path in flat_in and flat_in[path] is value:
        continue  # unchanged (e.g. params under mutable=True): nothing to write
      variable = _get_nested(attrs, path[1:])
      if not isinstance(variable, nnx.Variable):
        raise StructureChangeError(
            f"this call created the variable '{'/'.join(path)}', which did not exist after "
            "lazy_init. Why: NNX loops need every Variable to exist before the loop starts; a "
            "call that adds one changes the model's structure. Fix: make lazy_init create it "
            "(initialize with the same method and arguments the loop uses, or call "
            "lb.preallocate with them), or keep the value out of Linen variables.")
      new = _unbox(value)
      old = _compat.variable_value(variable)
      if np.shape(new) != np.shape(old) or jnp.result_type(new) != jnp.result_type(old):
        raise StructureChangeError(
            f"this call changed '{'/'.join(path)}' from shape {np.shape(old)} "
            f"{jnp.result_type(old)} to {np.shape(new)} {jnp.result_type(new)}. Why: NNX loops "
            "need every Variable to keep its shape and dtype. Fix: keep the collection's "
            "shapes fixed (e.g. preallocate a cache at its full length).")
      _compat.set_variable_value(variable, new)


def _check_method(module: linen.Module, method: tp.Any) -> None:
  """A `method=` name must name a method of the Linen module (Linen's own error says less)."""
  if not isinstance(method, str) or callable(getattr(type(module), method, None)):
    return
  methods = sorted(n for n, v in vars(type(module)).items()
                   if callable(v) and (not n.startswith("_") or n == "__call__")
                   and n != "setup")
  raise AttributeError(
      f"method={method!r} is not a method of the Linen module {type(module).__name__} "
      f"(its methods: {', '.join(methods) or 'none'}). Why: lb.ToNNX calls the Linen module "
      "with module.apply(..., method=...), which needs a method defined on its class. Fix: "
      "pass one of those names, or the function itself (e.g. method=MyModule.decode).")


def _as_bridge_model(model: tp.Any, what: str) -> ToNNX:
  if isinstance(model, ToNNX):
    return model
  if isinstance(model, bridge.ToNNX):
    raise TypeError(
        f"{what} needs a loopbridge.ToNNX, got a stock flax.nnx.bridge.ToNNX. Why: the stock "
        "wrapper has no buffers. Fix: build it with lb.ToNNX(linen_module, rngs=...) instead.")
  raise TypeError(f"{what} needs a loopbridge.ToNNX model, got {type(model).__name__}.")


def lazy_init(model: tp.Any, *args: tp.Any, capacity: _capacity.CapacitySpec | None = None,
              overflow: str | None = None, **kwargs: tp.Any) -> tp.Any:
  """`lb.lazy_init` for an `lb.ToNNX` (the public entry point, with docs, is `_native.lazy_init`).

  Runs the Linen init through `__call__` in initializing mode, handing `capacity`/`overflow` to
  every `lb.ToNNX` initialized by the call.
  """
  capacity = _capacity.check_capacity_spec(capacity)
  if overflow is not None:
    _capacity.check_overflow(overflow)
  if isinstance(model, bridge.ToNNX) and not isinstance(model, ToNNX):
    _as_bridge_model(model, "lb.lazy_init")
  if isinstance(model, nnx.Module):
    root = model
  elif hasattr(model, "__self__") and isinstance(model.__self__, nnx.Module):
    root = model.__self__
  else:
    raise TypeError(
        f"lb.lazy_init needs an NNX module (e.g. lb.ToNNX(linen_module, rngs=...)) or a bound "
        f"method of one, got {type(model).__name__}. "
        + ("Fix: wrap the Linen module first: lb.ToNNX(module, rngs=nnx.Rngs(0))."
           if isinstance(model, linen.Module) else ""))
  with pending_declaration(capacity, overflow):
    _compat.set_initializing(root, True)
    try:
      model(*args, **kwargs)
    finally:
      _compat.set_initializing(root, False)
  return model


def preallocate(model: tp.Any, *args: tp.Any, capacity: _capacity.CapacitySpec | None = None,
                overflow: str | None = None, method: tp.Any = None, **kwargs: tp.Any) -> tp.Any:
  """`lb.preallocate` for an `lb.ToNNX` (the public entry point, with docs, is `_native.preallocate`).

  Re-runs discovery for this call signature; sites it makes get new buffers when their shape,
  dtype, capacity or overflow changed, every other site keeps its buffer and values.
  """
  model = _as_bridge_model(model, "lb.preallocate")
  if model.loopbridge__sites is None:
    raise NotInitializedError(
        "lb.preallocate needs an initialized model. Fix: lb.lazy_init(model, *sample_args, "
        "capacity=...) first; preallocate then declares buffers for other call signatures.")
  settings = model.loopbridge__settings
  model._loopbridge_declare(
      args, kwargs, method=method,
      capacity=capacity if capacity is not None else _thaw_capacity(settings.capacity),
      overflow=overflow if overflow is not None else settings.overflow)
  return model
