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
import itertools
import re
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
from .._core.errors import CompareError, first_line
from .._core.observe_native import subclass_with
from .._core.site import linen_key

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
  """One module call of one side, with its output (concrete arrays)."""

  path: str  # the module's path: '/'-joined, '' for the top level (no layer index)
  key: str  # the match key: list indices and layers written Linen-style, layers/0 -> layers_0
  output: object
  kind: str = ""  # the module's class name, Linen names mapped to their NNX counterparts
  module_type: str = ""  # the module's own class name
  stack: str = ""  # the layer stack this call belongs to ('' for none): a path
  layer: int | None = None  # its layer in that stack
  scanned: bool = False  # recorded inside a transform body (the layer is not in the path)
  index: int = 0  # position in this side's call order
  leaves: list[tuple[str, object]] = dataclasses.field(default_factory=list)
  signature: tuple[tuple[int, ...], ...] = ()
  # A few values at fixed positions (alignment tie-break); `compare_align.prepare` fills it.
  sample: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))

  @property
  def shown(self) -> str:
    """The path as the report prints it: a layer of a scanned stack as `stack[layer]/rest`."""
    if not self.scanned or self.layer is None:
      return self.path
    rest = self.path[len(self.stack) :] if self.path.startswith(self.stack) else ""
    return f"{self.stack}[{self.layer}]{rest}"


def _join(*parts: str) -> str:
  return "/".join(p for p in parts if p)


def path_strings(path: tp.Sequence[object]) -> tuple[str, str]:
  """(display path, Linen-style match key) of an NNX graph path."""
  return "/".join(map(str, path)), "/".join(linen_key(path))


def has_tracer(tree: object) -> bool:
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree))


# The attribute carrying a module's path on the instrumented copy: a static attribute, so the
# module objects NNX transforms rebuild inside `nnx.scan`/`nnx.vmap` carry it too. It also
# holds a number new for every run: a jitted function (`nnx.jit`) sees another graph each time
# and traces again, so its calls reach this run's recorder, not the callbacks of an earlier one.
_PATH_ATTRIBUTE = "loopbridge__compare_path"
_RUNS = itertools.count()


@dataclasses.dataclass
class _Body:
  """One run of a transform body: the outermost traced call and the calls inside it.

  Its path is the outermost traced call's, or, when the body's own module is not seen being
  called (an NNX block run through its class's function, `nnx.remat(Block.__call__)`), the
  longest path its top-level calls share (`encoderblock` for `encoderblock/LayerNorm_0`,
  `encoderblock/MlpBlock_0`): the stack they are layers of.
  """

  path: str
  key: str
  pending: list[_Pending] = dataclasses.field(default_factory=list)
  called: bool = True  # its own module's call was seen (it then has a call at `path`)

  def widen(self, path: str, key: str) -> None:
    """Take in another top-level call of this body: path and key become the shared prefix."""
    self.path, self.key, self.called = _shared(self.path, path), _shared(self.key, key), False


def _shared(a: str, b: str) -> str:
  """The longest module path both '/'-joined paths lie under ('' for none)."""
  parts = []
  for x, y in zip(a.split("/"), b.split("/")):
    if x != y:
      break
    parts.append(x)
  return "/".join(parts)


@dataclasses.dataclass
class _Pending:
  """A call made under a trace: its output arrives per iteration through a callback."""

  path: str
  key: str
  kind: str
  module_type: str
  body: _Body
  values: list[object] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Frame:
  path: str
  key: str
  nnx: bool  # an NNX module (Linen calls inside a bridge are named under it)
  body: _Body | None  # the transform body this call runs in (None: not traced)
  # The transform bodies begun directly under this call, with the jax trace each ran in:
  # traced calls made under it in one trace are one body's top-level calls, so a body whose
  # own module's call is not seen still becomes one run of layers, not one per submodule.
  bodies: list[tuple[object, _Body]] = dataclasses.field(default_factory=list)


class Recorder:
  """The module calls of one run, in the order they return (see `finish`)."""

  def __init__(self) -> None:
    self._entries: list[Call | _Pending] = []
    self.not_recorded: list[str] = []
    self._frames: list[_Frame] = []  # modules being called, innermost last

  def enter(self, path: str, key: str, inputs: object, *, nnx_module: bool) -> _Frame:
    parent = self._frames[-1] if self._frames else None
    body = parent.body if parent is not None else None
    if body is None and has_tracer(inputs):
      body = self._body(parent, path, key)  # the outermost call inside a transform
    frame = _Frame(path, key, nnx_module, body)
    self._frames.append(frame)
    return frame

  def exit(self) -> None:
    self._frames.pop()

  @staticmethod
  def _body(parent: _Frame | None, path: str, key: str) -> _Body:
    """The body a traced call directly under `parent` (untraced) begins or belongs to.

    Calls under one parent call in one jax trace are one run of one body: the trace they run
    in (compared as NNX compares a Variable's trace) is how that is known.
    """
    if parent is None:
      return _Body(path, key)
    trace = _compat.current_trace()
    for seen, body in parent.bodies:
      if seen == trace:
        body.widen(path, key)
        return body
    body = _Body(path, key)
    parent.bodies.append((trace, body))
    return body

  def add(self, frame: _Frame, output: object, module: object) -> None:
    if has_tracer(output) and _in_broadcast_pass(output):
      # Linen `nn.scan`'s broadcast pass: its staged part never runs, so a callback there
      # delivers nothing, and on jax 0.11 an ordered one makes flax call the broadcast
      # variables data-dependent on the body. The real scan traces the body again.
      return
    name = type(module).__name__
    kind = _SAME_LAYER.get(name, name)
    body = frame.body
    if body is None and has_tracer(output):
      body = self._body(self._frames[-1] if self._frames else None, frame.path, frame.key)
    if body is None:
      self._entries.append(Call(frame.path, frame.key, output, kind, name))
      return
    pending = _Pending(frame.path, frame.key, kind, name, body)
    if _values_per_iteration(output, pending.values):
      body.pending.append(pending)
      self._entries.append(pending)
    else:
      self.not_recorded.append(frame.path)

  def linen_frame(self, module: nn.Module, inputs: object) -> _Frame | None:
    """Enter a Linen call (None for a bridge's top-level call: recorded as the bridge)."""
    names = tuple(module.scope.path) if module.scope is not None else ()
    outer = next((f for f in reversed(self._frames) if f.nnx), None)
    if not names and self._frames:
      # A bridge's top-level call (recorded as the bridge), or a submodule applied on its own
      # inside the model's call (`self.lm_head.apply({"params": ...}, x)`, HF's tied heads):
      # a root of its own, part of its caller's call, not a module of the model's tree.
      return None
    shown, key = (outer.path, outer.key) if outer is not None else ("", "")
    return self.enter(_join(shown, *names), _join(key, *names), inputs, nnx_module=False)

  def finish(self, *, linen: bool) -> list[Call]:
    """The calls in order, each run of a transform body expanded into its layers."""
    jax.effects_barrier()  # every callback of the run has delivered its values
    calls: list[Call] = []
    run: list[_Pending] = []
    for entry in [*self._entries, None]:
      if isinstance(entry, _Pending) and (not run or entry.body is run[0].body):
        run.append(entry)
        continue
      calls.extend(_layers(run))
      run = [entry] if isinstance(entry, _Pending) else []
      if isinstance(entry, Call):
        calls.append(entry)
    _name_layer_stacks(calls, linen)
    return calls


def _in_broadcast_pass(output: object) -> bool:
  # Only traced outputs get here: an eager call (most of a run) walks no stack frames.
  leaves = jax.tree_util.tree_leaves(output)
  return any(map(_compat.is_partial_eval_tracer, leaves)) or _compat.in_linen_scan_broadcast_pass()


def _values_per_iteration(output: object, into: list[object]) -> bool:
  """Have each value the traced `output` takes (per iteration, per mapped element) appended.

  `jax.debug.callback` runs on the host once per iteration of a scan and once per element of
  a vmap, in order (ordered where the transform allows). False when no callback can be placed.
  """
  leaves, treedef = jax.tree_util.tree_flatten(output)
  arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, (jax.Array, np.ndarray))]
  sent = []
  for i in arrays:
    leaf = leaves[i]
    if jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    sent.append(leaf)

  def receive(*values: np.ndarray) -> None:
    filled = list(leaves)
    for i, value in zip(arrays, values):
      filled[i] = np.asarray(value)
    into.append(jax.tree_util.tree_unflatten(treedef, filled))

  for ordered in (True, False):
    try:
      jax.debug.callback(receive, *sent, ordered=ordered)
      return True
    except Exception:  # a transform that takes no (ordered) callback: try the next way
      continue
  return False


def _layers(run: list[_Pending]) -> list[Call]:
  """The calls of one transform body, as many times as it ran, layer by layer.

  A body traced but never run (jax traces some bodies twice) delivered nothing and is
  dropped. A body run once (`nn.remat`, `jax.jit`) gives plain calls; a body run L times
  (`nn.scan`, `nnx.scan`, a vmap) gives L layers, each holding every call of the body in
  trace order; a call run k times per layer (a nested loop) gives its k calls in that layer.
  """
  if not run:
    return []
  body = run[0].body
  if body.called:
    length = len(next((p for p in run if p.path == body.path), run[-1]).values)
  else:
    # Without the body's own call, each top-level call runs once per layer (a call in a
    # nested loop runs more often): the fewest values delivered is the number of layers.
    length = min((len(p.values) for p in run if p.values), default=0)
  if length == 0:
    return []
  entries = []
  for order, pending in enumerate(run):
    per_layer = len(pending.values) // length if len(pending.values) % length == 0 else 0
    for occurrence, value in enumerate(pending.values):
      layer = occurrence // per_layer if per_layer else None
      entries.append((layer if layer is not None else length, order, occurrence, pending, value))
  entries.sort(key=lambda e: e[:3])
  calls = []
  for layer, _, _, pending, value in entries:
    call = Call(pending.path, pending.key, value, pending.kind, pending.module_type)
    if length > 1 and layer < length:
      call.stack, call.layer, call.scanned = body.path, layer, True
      if body.key and (pending.key == body.key or pending.key.startswith(body.key + "/")):
        call.key = f"{body.key}_{layer}{pending.key[len(body.key) :]}"
    calls.append(call)
  return calls


_NUMBERED = re.compile(r"(.+)_(\d+)")


def _name_layer_stacks(calls: list[Call], linen: bool) -> None:
  """Give calls in a list of layers (`blocks/2/...`, Linen `layers_2/...`) their stack.

  An NNX list index is a layer; in a Linen model a name `prefix_N` is one when the module at
  it is not of the class `prefix` (Linen names unnamed submodules `Dense_0`, `Dense_1` by
  class).
  """
  types = {c.path: c.module_type for c in calls if not c.scanned}
  for call in calls:
    if call.stack:
      continue
    parts = call.path.split("/") if call.path else []
    for at, part in enumerate(parts):
      if part.isdigit() and at > 0:
        call.stack, call.layer = "/".join(parts[:at]), int(part)
        break
      match = _NUMBERED.fullmatch(part) if linen else None
      here = "/".join(parts[: at + 1])
      if match and here in types and types[here] != match.group(1):
        call.stack, call.layer = "/".join([*parts[:at], match.group(1)]), int(match.group(2))
        break


def _linen_interceptor(next_fun, args, kwargs, context):
  recorder = _RECORDER.get()
  if recorder is None or context.method_name != "__call__":
    return next_fun(*args, **kwargs)
  frame = recorder.linen_frame(context.module, (args, kwargs))
  if frame is None:
    return next_fun(*args, **kwargs)
  try:
    output = next_fun(*args, **kwargs)
  finally:
    recorder.exit()
  recorder.add(frame, output, context.module)
  return output


def _defines_call(cls: type) -> bool:
  return any("__call__" in vars(base) for base in cls.__mro__ if base is not object)


def _call_recorder(cls: type) -> dict[str, object]:
  def __call__(self, *args, **kwargs):
    recorder = _RECORDER.get()
    if recorder is None:  # the copy escaped the compare (it never should): behave as cls
      return cls.__call__(self, *args, **kwargs)  # pyright: ignore[reportCallIssue]
    # A module built during the call without a graph path (it never should) shows its class.
    where = getattr(self, _PATH_ATTRIBUTE, None)
    path, key = where.split("\n")[:2] if isinstance(where, str) else (f"<{cls.__name__}>",) * 2
    frame = recorder.enter(path, key, (args, kwargs), nnx_module=True)
    try:
      output = cls.__call__(self, *args, **kwargs)  # pyright: ignore[reportCallIssue]
    finally:
      recorder.exit()
    recorder.add(frame, output, self)
    return output

  return {"__call__": __call__}


def _instrumented_copy(model: nnx.Module) -> nnx.Module:
  """A copy of `model` whose callable modules record their calls under their paths."""
  copy = _compat.clone_graph(model)
  run = str(next(_RUNS))
  seen: set[int] = set()
  for path, node in _compat.iter_graph(copy):
    if isinstance(node, nnx.Module) and id(node) not in seen:
      seen.add(id(node))
      object.__setattr__(node, _PATH_ATTRIBUTE, "\n".join((*path_strings(path), run)))
      if _defines_call(type(node)):
        object.__setattr__(node, "__class__", subclass_with(type(node), "compare", _call_recorder))
  return copy


def bridged_linen(model: bridge.ToNNX) -> tuple[nn.Module, dict[str, tp.Any]]:
  """The Linen module a bridge wraps and its variables as a Linen variables dict."""
  return _compat.linen_module_of(model), bridge_variables.nnx_attrs_to_linen_vars(
    linen_vars.attrs(model)
  )


LINEN, NNX = "linen", "nnx"  # the two kinds of model a side can be

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
    return LINEN, (module, dict(variables))
  if isinstance(obj, bridge.ToNNX):
    return LINEN, bridged_linen(obj)
  if isinstance(obj, nnx.Module):
    return NNX, obj
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


def record(
  role: str, kind: str, subject: tp.Any, args: tuple, kwargs: dict, method: str | None = None
) -> tuple[list[Call], list[str]]:
  """Run one side on the inputs (its `method`, None for `__call__`): its calls in order, and
  the paths it could not record."""
  if kind == LINEN:
    module, variables = subject
    # Sows and captured values from earlier calls (a stock bridge keeps them) would be
    # appended to, not replaced; no run needs them.
    variables = {k: v for k, v in variables.items() if k != "intermediates"}
    # Every collection but params is mutable (batch statistics, caches, sows update as the
    # model wants); params stay immutable so a missing one is an error, not a fresh init.
    mutable = sorted((set(variables) - {"params"}) | {"intermediates"})
    recorder = Recorder()

    def run_linen():
      return nn.Module.apply(module, variables, *args, mutable=mutable, method=method, **kwargs)

    run = run_linen
  else:
    copy = _instrumented_copy(subject)
    recorder = Recorder()

    def run_nnx():
      return (copy if method is None else getattr(copy, method))(*args, **kwargs)

    run = run_nnx

  token = _RECORDER.set(recorder)
  try:
    with nn.intercept_methods(_linen_interceptor):
      run()
  except Exception as e:
    hint = ""
    if kind == LINEN and not subject[1]:
      hint = (
        " It has no variables: initialize an lb.ToNNX with lb.lazy_init(model, *args) "
        "(or pass (module, module.init(key, *args)))."
      )
    elif kind == LINEN and "params" not in subject[1]:
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
  return recorder.finish(linen=kind == LINEN), recorder.not_recorded
