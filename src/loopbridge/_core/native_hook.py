"""Append stage, native side: record `nnx.Module.sow` calls into a module's buffers.

Why a class attribute: NNX rebuilds module objects from their class inside every transform
(`nnx.merge` in `nnx.scan`, `nnx.vmap`, loops, `jit`), so a per-instance hook would be lost
there. The hook is installed only on the classes of modules that were declared recorders, never
on `nnx.Module` itself, so every other class keeps flax's own `sow` untouched. It passes through
first: an instance without buffers, a custom `reduce_fn`/`init_fn` (an accumulator, which is
state), or an open discovery goes straight to the `sow` the class had before (looked up at call
time, so a later patch of a base class is honoured). Warning filters are never touched.
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
import typing as tp

from flax import nnx

from .. import _compat
from . import buffers as _buffers
from . import discovery_session, recorder, recording_switch, trace_check
from .bridge_settings import is_bridge_class
from .errors import NotDeclaredError

_SOW_PARAMS = inspect.signature(nnx.Module.sow).parameters
DEFAULT_REDUCE = _SOW_PARAMS["reduce_fn"].default
DEFAULT_INIT = _SOW_PARAMS["init_fn"].default

_lock = threading.Lock()

_NO_BUFFER = (
  "{label} was sown, but this module has no buffer for it. Why: buffers are declared for the "
  "sows of the call given to lb.preallocate/lb.lazy_init, and this call makes a different one "
  "(other method, arguments or branch). Fix: declare it before the loop with "
  "lb.preallocate(model, *args, capacity=..., method=...); buffers already declared are kept."
)


@functools.cache
def _collection_of_type(variable_type: type) -> str:
  try:
    return _compat.collection_name(variable_type)
  except ValueError:  # a Variable subclass flax has no registered collection name for
    return variable_type.__name__


def collection_of(variable_type: tp.Any) -> str:
  """Collection name of a `sow` target: a Variable type or (flax 0.12) its registered name."""
  if isinstance(variable_type, str):
    return variable_type
  return _collection_of_type(variable_type)  # cached: it runs on every recorded sow


class _SowHook:
  """The hook as a class attribute: a descriptor that binds like a function but is not itself
  callable, so flax's `nnx.capture(method_outputs=...)`, which wraps every public callable in
  a class's `__dict__` while it runs, leaves it alone (wrapping `sow` would make it recurse)."""

  def __init__(self, fn: tp.Callable[..., tp.Any]):
    self.fn = fn
    self.__doc__ = fn.__doc__

  def __get__(self, obj: tp.Any, owner: tp.Any = None) -> tp.Any:
    return self.fn if obj is None else types.MethodType(self.fn, obj)


def _is_hook(attribute: tp.Any) -> bool:
  return isinstance(attribute, _SowHook)


def install(cls: type) -> None:
  """Make instances of `cls` that carry buffers record their default-reduce sows (idempotent)."""
  if is_bridge_class(cls):
    return  # lb.ToNNX records its Linen sows itself
  with _lock:
    if _is_hook(cls.__dict__.get("sow")):
      return
    own = cls.__dict__.get("sow")  # a sow the class defines itself: chain to exactly that

    def previous(self):
      if own is not None:
        return own.__get__(self, cls)
      # `cls` is the nnx.Module subclass being hooked, known only at run time.
      return super(cls, self).sow  # pyright: ignore[reportAttributeAccessIssue]

    def sow(self, variable_type, name, value, reduce_fn=DEFAULT_REDUCE, init_fn=DEFAULT_INIT):
      buffers = vars(self).get(recorder.BUFFERS_ATTR)
      if (
        buffers is None
        or reduce_fn is not DEFAULT_REDUCE
        or init_fn is not DEFAULT_INIT
        or discovery_session.current() is not None
      ):
        return previous(self)(variable_type, name, value, reduce_fn, init_fn)
      if not recording_switch.is_on():
        return False  # inside `lb.recording(False)`: nothing is stored
      collection = collection_of(variable_type)
      buffer = buffers.get(collection, {}).get(name)
      in_capture = _compat.in_nnx_capture(self)
      if not isinstance(buffer, _buffers.Buffer):
        if in_capture:  # an undeclared sow (e.g. method_outputs=) goes to the capture only
          return previous(self)(variable_type, name, value, reduce_fn, init_fn)
        raise NotDeclaredError(
          _NO_BUFFER.format(label=f"{type(self).__name__}: {collection}/{name}")
        )
      counts = recorder.counts_of(self)
      assert counts is not None  # a buffer was found, so the vector exists
      trace_check.check([counts], f"{type(self).__name__}.sow")
      index = recorder.count_index(self, (collection, name))
      _buffers.append(buffer, counts, index, [value], f"{type(self).__name__}: {collection}/{name}")
      if in_capture:  # the capture also returns this call's sows, as without loopbridge
        previous(self)(variable_type, name, value, reduce_fn, init_fn)
      return True

    sow.__doc__ = (own or nnx.Module.sow).__doc__
    cls.sow = _SowHook(sow)
