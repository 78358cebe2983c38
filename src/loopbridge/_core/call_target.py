"""What an entry (`lb.lazy_init`, `lb.preallocate`) calls: the root module and a function of it.

An entry is given the model, a bound method of it, or a partial of either, plus an optional
`method=`; it runs that call on the model itself or on a copy, so the call is rebuilt as
`call(module, *args, **kwargs)` for whichever module it runs on.
"""

from __future__ import annotations

import functools
import inspect
import typing as tp

from flax import linen, nnx
from flax.nnx import bridge

from .. import _compat
from .bridge_settings import is_bridge

# A call rebuilt for any copy of the root: call(module, *args, **kwargs).
Call = tp.Callable[..., object]
# A Linen module's method, as `module.apply(..., method=)` takes it (None: `__call__`).
LinenMethod = str | tp.Callable[..., object] | None


def model_name(root: object) -> str:
  """The model's name in messages: the wrapped Linen class for an `lb.ToNNX`."""
  if is_bridge(root):
    return type(_compat.linen_module_of(tp.cast(bridge.ToNNX, root))).__name__
  return type(root).__name__


def _rebind(fn: object, root: nnx.Module) -> Call:
  """`fn` (the root, a bound method of it, or a partial of either) as `call(module, ...)`."""
  if fn is root:
    return lambda m, *a, **k: m(*a, **k)
  if inspect.ismethod(fn) and fn.__self__ is root:
    func = fn.__func__
    return lambda m, *a, **k: func(m, *a, **k)
  if isinstance(fn, functools.partial):
    inner = _rebind(fn.func, root)
    return lambda m, *a, **k: inner(m, *fn.args, *a, **{**fn.keywords, **k})
  raise TypeError(f"cannot call {fn!r} on a copy of the model")


def root_of(fn: object) -> nnx.Module | None:
  """The module `fn` is (or is a bound method or partial of); None for anything else."""
  if isinstance(fn, nnx.Module):
    return fn
  owner = getattr(fn, "__self__", None)  # bound methods; flax's ToNNX method partials too
  if isinstance(owner, nnx.Module):
    return owner
  if isinstance(fn, functools.partial):
    return root_of(fn.func)
  return None


def target(model: object, method: object, what: str) -> tuple[nnx.Module, Call]:
  """(root module, function called as call(root, *args, **kwargs))."""
  root = root_of(model)
  if root is None:
    raise TypeError(
      f"{what} needs an NNX module (e.g. lb.ToNNX(linen_module, rngs=...)) or a bound method "
      f"of one, got {type(model).__name__}. "
      + (
        "Fix: wrap the Linen module first: lb.ToNNX(module, rngs=nnx.Rngs(0))."
        if isinstance(model, linen.Module)
        else "Fix: pass the model, or a method of it (model.method or method='name')."
      )
    )
  if isinstance(root, bridge.ToNNX) and not is_bridge(root) and model is root:
    raise TypeError(
      f"{what} needs a loopbridge.ToNNX, got a stock flax.nnx.bridge.ToNNX. Why: the stock "
      "wrapper has no buffers. Fix: build it with lb.ToNNX(linen_module, rngs=...) instead."
    )
  call = _rebind(model, root)
  if method is None:
    return root, call
  if model is not root:
    raise TypeError(f"{what}: pass either a bound method or method=, not both.")
  if is_bridge(root):  # a Linen method of the wrapped module
    if not (isinstance(method, str) or callable(method)):
      raise TypeError(
        f"{what}: method= must be the name of a method of the Linen module or the function "
        f"itself (method='decode' or method=MyModule.decode), got {type(method).__name__}."
      )
    return root, lambda m, *a, **k: m(*a, method=method, **k)
  if isinstance(method, str):
    return root, lambda m, *a, **k: getattr(m, method)(*a, **k)
  if callable(method):
    return root, method
  raise TypeError(
    f"{what}: method= must be a method name or a function taking the module "
    f"first, got {type(method).__name__}."
  )
