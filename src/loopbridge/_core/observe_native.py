"""Discover stage, native side: which `nnx.Module.sow` calls one call of a graph makes.

Two sources, as for Linen:
- The graph's state after the call, compared with before: flax's own `sow` leaves a Variable
  holding a tuple on the sowing module (stacked along leading axes when `nnx.scan`/`nnx.vmap`
  run over stacked modules). That tells where each site lives and what Linen-style entries it
  holds; other new Variables (custom-reduce accumulators, `perturb`) are state to create.
- A log of the calls themselves, for the sown shape (to tell stack axes from value axes) and
  whether the default tuple reduce was used.

How the calls are logged without touching any class: while the call runs, each module object
of the graph gets a subclass of its own class (made once per class) whose `sow` logs into the
current context's log and then calls the class's own `sow`. Objects that NNX transforms rebuild
from the graph inside the call are of that subclass too, so sows inside `nnx.scan` are seen.
The objects get their classes back when the call ends (the abstract run works on a throwaway
clone; `lazy_init` runs the model's own objects and restores them in a `finally`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
import typing as tp
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .. import _compat
from .bridge_settings import is_bridge
from .errors import NotDeclaredError
from .native_hook import DEFAULT_INIT, DEFAULT_REDUCE, collection_of
from .observe_linen import PRNG_KEY_SOWN, is_array_value
from .site import SowCall, SowSite

_LOG: contextvars.ContextVar[list[SowCall] | None] = contextvars.ContextVar(
  "loopbridge_native_sow_log", default=None
)

_SUBCLASSES: weakref.WeakKeyDictionary[type, dict[str, type]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _shape_dtype(value: object) -> tuple[tuple[int, ...] | None, str | None]:
  if is_array_value(value):
    return tuple(jnp.shape(value)), str(jnp.result_type(value))
  return None, None


def subclass_with(cls: type, role: str, methods: tp.Callable[[type], dict[str, object]]) -> type:
  """A subclass of `cls` with `methods(cls)` added, made once per class and role and cached.

  The subclass keeps the name, module and class keywords of `cls`, so an object whose
  `__class__` is swapped to it (for one call, or on a throwaway copy) behaves and prints as
  before; nothing `cls` or flax defines is modified. `__loopbridge_<role>__` marks it.
  """
  with _lock:
    by_role = _SUBCLASSES.setdefault(cls, {})
    sub = by_role.get(role)
    if sub is None:
      namespace = {
        **methods(cls),
        "__slots__": (),  # the same object layout, so `__class__` can be swapped both ways
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        f"__loopbridge_{role}__": True,
      }
      sub = type(cls)(cls.__name__, (cls,), namespace, **_compat.subclass_options(cls))
      by_role[role] = sub
    return sub


def _sow_logger(cls: type) -> dict[str, object]:
  def sow(self, variable_type, name, value, reduce_fn=DEFAULT_REDUCE, init_fn=DEFAULT_INIT):
    log = _LOG.get()
    if log is not None:
      log.append(
        SowCall(
          collection_of(variable_type),
          (),
          name,
          *_shape_dtype(value),
          default_reduce=reduce_fn is DEFAULT_REDUCE and init_fn is DEFAULT_INIT,
          module_type=cls.__name__,
          init_fn=init_fn,
        )
      )
    return cls.sow(self, variable_type, name, value, reduce_fn, init_fn)  # pyright: ignore[reportAttributeAccessIssue]

  return {"sow": sow}


def _observing_class(cls: type) -> type:
  return subclass_with(cls, "observer", _sow_logger)


def _observable(node: object) -> bool:
  return (
    isinstance(node, nnx.Module)
    and not is_bridge(node)
    and not getattr(type(node), "__loopbridge_observer__", False)
  )


def observable_modules(root: nnx.Module) -> list[nnx.Module]:
  """The modules of `root`'s graph whose native sows `observe` would log (not `lb.ToNNX`)."""
  return [node for _, node in _compat.iter_graph(root) if _observable(node)]


@contextlib.contextmanager
def observe(modules: tp.Sequence[nnx.Module]) -> tp.Iterator[list[SowCall]]:
  """Log every native `sow` the given modules (and NNX's copies of them) make in the block."""
  swapped = []
  try:
    for node in modules:
      original = type(node)
      object.__setattr__(node, "__class__", _observing_class(original))
      swapped.append((node, original))
    log: list[SowCall] = []
    token = _LOG.set(log)
    try:
      yield log
    finally:
      _LOG.reset(token)
  finally:
    for node, original in swapped:
      object.__setattr__(node, "__class__", original)


def flat_state(state: tp.Any, prefix: tuple = ()) -> dict[tuple, tp.Any]:
  out = {}
  for key, value in state.items():
    if isinstance(value, tp.Mapping):
      out.update(flat_state(value, (*prefix, key)))
    else:
      out[(*prefix, key)] = value
  return out


@dataclasses.dataclass
class NativeFindings:
  """Native sow sites of one call, by sowing-module path, plus state the call would create."""

  sites: dict[tuple, list[SowSite]]  # module path -> its sites (key: (collection, name))
  tuple_paths: list[tuple]  # state paths of the tuples flax's sow left (to remove)
  created: list[tuple[tuple, type, tp.Any, list[SowCall]]]  # (path, Variable type, value, calls)


def _stack_axes(path, entry_shape, calls: list[SowCall]) -> int:
  candidates = {
    len(entry_shape) - len(c.shape)
    for c in calls
    if c.shape is not None
    and len(c.shape) <= len(entry_shape)
    and tuple(entry_shape[len(entry_shape) - len(c.shape) :]) == c.shape
  }
  if len(candidates) != 1:
    shapes = sorted({c.shape for c in calls if c.shape is not None})
    raise NotDeclaredError(
      f"native sow site {'/'.join(map(str, path))} holds values of shape {entry_shape}, "
      f"which loopbridge cannot relate to the sown shapes {shapes}. "
      "Why: transforms over stacked modules (nnx.scan, nnx.vmap) must add their axes in "
      "front (axis 0), as they do by default. Fix: sow arrays, and stack modules along "
      "axis 0."
    )
  return candidates.pop()


def _is_typed_key(value: tp.Any) -> bool:
  return hasattr(value, "dtype") and jnp.issubdtype(value.dtype, jax.dtypes.prng_key)


def diff(
  before: dict[tuple, tp.Any], after: dict[tuple, tp.Any], calls: list[SowCall]
) -> NativeFindings:
  """Compare a graph's flat state before and after one call (concrete or abstract leaves)."""
  sites: dict[tuple, list[SowSite]] = {}
  tuple_paths, created = [], []
  by_name: dict[tuple[str, str], list[SowCall]] = {}
  for c in calls:
    by_name.setdefault((c.collection, c.name), []).append(c)
  for path, leaf in after.items():
    value = _compat.variable_value(leaf)
    old = before.get(path)
    var_type = _compat.state_leaf_type(leaf)
    collection, name = collection_of(var_type), path[-1]
    these = by_name.get((collection, name), [])
    if isinstance(value, tuple) and these and all(c.default_reduce for c in these):
      old_value = _compat.variable_value(old) if old is not None else ()
      entries = value[len(old_value) :] if isinstance(old_value, tuple) else value
      tuple_paths.append(path)
      if not entries:
        continue
      key = next((e for e in entries if _is_typed_key(e)), None)
      if key is not None:
        raise NotDeclaredError(
          PRNG_KEY_SOWN.format(
            where="native ", site="/".join(map(str, (collection, *path))), dtype=key.dtype
          )
        )
      shapes = {(tuple(e.shape), np.dtype(e.dtype)) for e in entries if hasattr(e, "shape")}
      if len(shapes) != 1 or not all(hasattr(e, "shape") for e in entries):
        raise NotDeclaredError(
          f"native sow site {'/'.join(map(str, path))} receives values of different "
          "shapes/dtypes or non-array values within one call. Why: one buffer holds one "
          "array shape, and native sows of a pytree (tuple, dict) are not recorded leaf by "
          "leaf yet (Linen sows and captures through lb.ToNNX are). Fix: sow each kind of "
          "value under its own name, and sow arrays (one `sow` per leaf of a pytree)."
        )
      ((shape, dtype),) = shapes
      stack = _stack_axes(path, shape, these)
      sown = next((c.shape for c in these if c.shape is not None), None)
      sites.setdefault(tuple(path[:-1]), []).append(
        SowSite(collection, (name,), shape, str(dtype), sown, len(entries), stack_axes=stack)
      )
    elif old is None and not isinstance(value, tuple) and hasattr(value, "shape"):
      created.append((path, var_type, value, these))
  return NativeFindings(sites, tuple_paths, created)


def new_state_variable(
  var_type: type, abstract: tp.Any, calls: list[SowCall]
) -> nnx.Variable | None:
  """The Variable a call would create on first use, made before the loop (shape-stable)."""
  custom = [c.init_fn for c in calls if not c.default_reduce and c.init_fn is not None]
  if custom:  # a custom-reduce sow: start from init_fn(), broadcast to the accumulated shape
    initial = custom[0]()
    if not hasattr(initial, "__array__") and not isinstance(initial, (int, float, bool)):
      return None
    try:
      return var_type(jnp.broadcast_to(jnp.asarray(initial, abstract.dtype), abstract.shape))
    except ValueError:
      return None
  if collection_of(var_type) in ("perturbations", "Perturbation"):
    return var_type(jnp.zeros(abstract.shape, abstract.dtype))  # as `perturb` creates it
  return None
