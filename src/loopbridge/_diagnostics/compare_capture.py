"""Recording the module calls of one run, for `lb.compare`: a Linen model or an NNX port.

Both sides run eagerly while every module call's output is recorded in call order. A call is
recorded when it returns, so a block comes after the layers inside it and the first recorded
difference is the innermost module whose output changed.

* Linen modules are recorded through `flax.linen.intercept_methods`, Flax's own method hook:
  active only for the duration of one run and only on the calling thread, chained to any
  interceptor the user installed.
* NNX modules are recorded on a copy of the model (`_compat.clone_graph`) whose module
  instances each get a recording subclass of their own class (`obj.__class__ = ...`). No
  function or class attribute is replaced for the process; the user's model, its Variables
  and its classes are untouched. A bridged Linen part inside an NNX model (a `ToNNX`
  submodule) is recorded through the same Linen hook, under the bridge's path.

The recorder travels in a ContextVar, so compares in other threads never see it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import typing as tp

import flax.linen as nn
import jax
import jax.core
import numpy as np
from flax import nnx
from flax.nnx import bridge
from flax.nnx.bridge import variables as bridge_variables

from .. import _compat
from .._core import linen_vars
from .._core.errors import CompareError
from .._core.observe_native import subclass_with

# Linen layers whose NNX counterpart has another class name (an alignment tie-break).
_SAME_LAYER = {
  "Dense": "Linear",
  "DenseGeneral": "LinearGeneral",
  "MultiHeadDotProductAttention": "MultiHeadAttention",
  "SelfAttention": "MultiHeadAttention",
  "MultiHeadAttention": "MultiHeadAttention",
}

_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
  "loopbridge_compare_recorder", default=None
)


@dataclasses.dataclass
class Call:
  path: str  # display path: '/'-joined, '' for the top level
  key: str  # the same with list indices written Linen-style: layers/0 -> layers_0
  output: tp.Any
  index: int = 0  # position in this side's call order
  leaves: list[tuple[str, tp.Any]] = dataclasses.field(default_factory=list)
  signature: tuple[tuple[int, ...], ...] = ()
  # A few values at fixed positions (alignment tie-break); `_prepare` fills it.
  sample: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
  kind: str = ""  # the module's class name, Linen names mapped to their NNX counterparts


def _join(*parts: str) -> str:
  return "/".join(p for p in parts if p)


def path_strings(path: tp.Sequence[tp.Any]) -> tuple[str, str]:
  """(display path, Linen-style match key) of an NNX graph path."""
  shown, key = [], []
  for part in path:
    shown.append(str(part))
    if isinstance(part, int) and key:
      key[-1] = f"{key[-1]}_{part}"
    else:
      key.append(str(part))
  return "/".join(shown), "/".join(key)


def has_tracer(tree: tp.Any) -> bool:
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree))


class Recorder:
  """The module calls of one run, in the order they return."""

  def __init__(self, nnx_paths: dict[int, tuple[str, str]]):
    self.calls: list[Call] = []
    self.not_recorded: list[str] = []
    self._nnx_paths = nnx_paths
    self._stack: list[tuple[str, str]] = []  # NNX modules being called, innermost last

  def add(self, path: str, key: str, output: tp.Any, module: tp.Any) -> None:
    if has_tracer(output):
      self.not_recorded.append(path)
    else:
      name = type(module).__name__
      self.calls.append(Call(path, key, output, kind=_SAME_LAYER.get(name, name)))

  def enter(self, module: tp.Any) -> tuple[str, str]:
    where = self._nnx_paths.get(id(module))
    if where is None:  # a module built during the call (e.g. by a transform): no graph path
      name = f"<{type(module).__name__}>"
      where = (name, name)
    self._stack.append(where)
    return where

  def exit(self) -> None:
    self._stack.pop()

  def linen_call(self, module: nn.Module, output: tp.Any) -> None:
    names = tuple(module.scope.path) if module.scope is not None else ()
    if not names and self._stack:
      return  # a bridge's top-level Linen call: recorded as the bridge module's own call
    shown, key = self._stack[-1] if self._stack else ("", "")
    self.add(_join(shown, *names), _join(key, *names), output, module)


def _linen_interceptor(next_fun, args, kwargs, context):
  output = next_fun(*args, **kwargs)
  recorder = _RECORDER.get()
  if recorder is not None and context.method_name == "__call__":
    recorder.linen_call(context.module, output)
  return output


def _defines_call(cls: type) -> bool:
  return any("__call__" in vars(base) for base in cls.__mro__ if base is not object)


def _call_recorder(cls: type) -> dict[str, tp.Any]:
  def __call__(self, *args, **kwargs):
    recorder = _RECORDER.get()
    if recorder is None:  # the copy escaped the compare (it never should): behave as cls
      return cls.__call__(self, *args, **kwargs)  # pyright: ignore[reportCallIssue]
    where = recorder.enter(self)
    try:
      output = cls.__call__(self, *args, **kwargs)  # pyright: ignore[reportCallIssue]
    finally:
      recorder.exit()
    recorder.add(*where, output, self)
    return output

  return {"__call__": __call__}


def _instrumented_copy(model: nnx.Module) -> tuple[nnx.Module, dict[int, tuple[str, str]]]:
  """A copy of `model` whose callable modules record their calls, and each module's path."""
  copy = _compat.clone_graph(model)
  paths: dict[int, tuple[str, str]] = {}
  for path, node in _compat.iter_graph(copy):
    if isinstance(node, nnx.Module) and id(node) not in paths:
      paths[id(node)] = path_strings(path)
      if _defines_call(type(node)):
        object.__setattr__(node, "__class__", subclass_with(type(node), "compare", _call_recorder))
  return copy, paths


def bridged_linen(model: bridge.ToNNX) -> tuple[nn.Module, dict[str, tp.Any]]:
  """The Linen module a bridge wraps and its variables as a Linen variables dict."""
  return _compat.linen_module_of(model), bridge_variables.nnx_attrs_to_linen_vars(
    linen_vars.attrs(model)
  )


_LINEN, _NNX = "linen", "nnx"

_KINDS_HELP = (
  "a Linen module with its variables as `(module, variables)` (e.g. "
  "`(module, module.init(key, *args))`), an initialized `lb.ToNNX`, or an NNX module"
)


def describe(obj: tp.Any) -> str:
  if isinstance(obj, type):
    return f"the class {obj.__name__}"
  if isinstance(obj, tuple):
    return f"a tuple of {len(obj)} ({', '.join(type(o).__name__ for o in obj)})"
  return f"a {type(obj).__name__}"


def subject(obj: tp.Any, role: str) -> tuple[str, tp.Any]:
  """('linen', (module, variables)) or ('nnx', module); CompareError for anything else."""
  if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], nn.Module):
    module, variables = obj
    if not isinstance(variables, tp.Mapping):
      raise CompareError(
        f"lb.compare: the {role} is (Linen module, {type(variables).__name__}), but the "
        "second item must be the module's variables, a dict like `module.init(key, *args)` "
        "returns ({'params': ...})."
      )
    return _LINEN, (module, dict(variables))
  if isinstance(obj, bridge.ToNNX):
    return _LINEN, bridged_linen(obj)
  if isinstance(obj, nnx.Module):
    return _NNX, obj
  if isinstance(obj, nn.Module):
    raise CompareError(
      f"lb.compare: the {role} is a Linen module without its variables, so it cannot run. "
      f"Pass `({type(obj).__name__}(...), variables)` with the variables from "
      "`module.init(key, *args)` or a checkpoint, or an initialized lb.ToNNX."
    )
  if isinstance(obj, type) and issubclass(obj, (nn.Module, nnx.Module)):
    raise CompareError(
      f"lb.compare: the {role} is {describe(obj)}, not a model: build an instance (and "
      f"initialize it). The {role} must be {_KINDS_HELP}."
    )
  raise CompareError(f"lb.compare: the {role} is {describe(obj)}; it must be {_KINDS_HELP}.")


def record(role: str, kind: str, subject: tp.Any, args: tuple, kwargs: dict) -> Recorder:
  """Run one side on the inputs and return its recorded calls."""
  if kind == _LINEN:
    module, variables = subject
    # Sows and captured values from earlier calls (a stock bridge keeps them) would be
    # appended to, not replaced; no run needs them.
    variables = {k: v for k, v in variables.items() if k != "intermediates"}
    # Every collection but params is mutable (batch statistics, caches, sows update as the
    # model wants); params stay immutable so a missing one is an error, not a fresh init.
    mutable = sorted((set(variables) - {"params"}) | {"intermediates"})
    recorder = Recorder({})

    def run():
      return module.apply(variables, *args, mutable=mutable, **kwargs)
  else:
    copy, paths = _instrumented_copy(subject)
    recorder = Recorder(paths)

    def run():
      return copy(*args, **kwargs)

  token = _RECORDER.set(recorder)
  try:
    with nn.intercept_methods(_linen_interceptor):
      run()
  except Exception as e:
    hint = ""
    if kind == _LINEN and not subject[1]:
      hint = (
        " It has no variables: initialize an lb.ToNNX with lb.lazy_init(model, *args) "
        "(or pass (module, module.init(key, *args)))."
      )
    elif kind == _LINEN and "params" not in subject[1]:
      hint = (
        f" Its variables have no 'params' collection (keys: {sorted(subject[1])}): pass "
        "the whole dict `module.init` returns, {'params': ...}, not the params alone."
      )
    raise CompareError(
      f"lb.compare: running the {role} on the given inputs failed: {type(e).__name__}: "
      f"{first_line(e).rstrip('.')}.{hint} Both models are called with the same *args and "
      "**kwargs; check that the inputs fit both."
    ) from e
  finally:
    _RECORDER.reset(token)
  return recorder


def first_line(error: BaseException, limit: int = 400) -> str:
  lines = str(error).strip().splitlines()
  line = lines[0] if lines else ""
  return line if len(line) <= limit else line[: limit - 3] + "..."
