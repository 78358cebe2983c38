"""Running one side of a conversion for the evidence, recording each module's first concrete call.

Linen runs `apply` on flat variables, the port a copy holding the candidate's values; each
side's run is compiled with `jax.jit` (only its output and the recorded calls' arrays come
out), eager where a model cannot be a static argument or reads a value in Python."""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from .. import _compat
from .._core.buffers import is_traced
from .._core.errors import CheckpointError
from .._diagnostics.compare_elementwise import compare_arrays
from .._diagnostics.compare_tolerance import ToleranceChoice, is_float
from .convert_align import CACHE, Key, Value, nnx_variables, unflatten

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Record:
  """One concrete module call: its inputs and output."""

  args: tuple[object, ...]
  kwargs: dict[str, object]
  out: object


RNG_HELP = (
  "If a model draws random numbers on these sample arguments (dropout in training mode), "
  "make the sample call deterministic (e.g. sample_kwargs={'train': False}) so both models "
  "compute the same."
)


def fixed_rngs() -> dict[str, jax.Array]:
  key = jax.random.key(0)
  return {"params": key, "dropout": key}


def _linen_apply(
  module: nn.Module,
  variables: tp.Mapping[str, tp.Any],
  args: tuple[object, ...],
  kwargs: tp.Mapping[str, tp.Any],
  method: tp.Any,
) -> Ran:
  """Linen `apply`, recording each module's first `__call__` whose values are recordable
  (concrete when eager, the jit body's own under `jax.jit`; never a loop's). Where modules
  share a scope (`nn.share_scope`: a feed-forward's einsums under its own path), the path's
  call is the outermost one, the module that owns the path, not a submodule called inside."""
  records: dict[Path, Record] = {}
  active: list[Path] = []

  def interceptor(next_fun, args, kwargs, context):
    scope = context.module.scope
    if scope is None or context.method_name != "__call__":
      return next_fun(*args, **kwargs)
    path = tuple(str(p) for p in scope.path)
    active.append(path)
    try:
      out = next_fun(*args, **kwargs)
    finally:
      active.pop()
    inner = path in active  # a call inside another module's call at the same path
    if not inner and path not in records and _recordable((args, kwargs, out)):
      records[path] = Record(tuple(args), dict(kwargs), out)
    return out

  with nn.intercept_methods(interceptor):
    out, _ = nn.Module.apply(
      module,
      tp.cast(dict, variables),
      *args,
      method=method,
      mutable=True,
      rngs=fixed_rngs(),
      **kwargs,
    )
  return out, records


@dataclasses.dataclass(frozen=True)
class _LinenCall:
  """The Linen side of a compiled run (a jit static argument: hashable where the module is)."""

  module: nn.Module
  method: tp.Any

  def run(self, variables: tp.Any, args: tuple, kwargs: dict) -> Ran:
    return _linen_apply(self.module, variables, args, kwargs, self.method)


def linen_run(
  module: nn.Module,
  variables: tp.Mapping[Key, Value],
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> tuple[object, dict[Path, Record]]:
  """Linen `apply` on flat variables under `jax.jit`, recording each module's first call
  outside loops (inputs and output); eager where the call cannot be compiled."""
  tree = unflatten(variables)
  args, kwargs = tuple(sample_args), dict(sample_kwargs or {})
  try:
    ran = None
    if all(_is_array(x) for x in jax.tree.leaves(tree)):
      ran = _compiled_run(_LinenCall(module, method), tree, args, kwargs)
    if ran is None:
      ran = _linen_apply(module, tree, args, kwargs, method)
  except Exception as e:
    with_cache = any(k[0] == CACHE for k in variables)
    raise CheckpointError(
      f"running the Linen module {type(module).__name__} with the converted variables failed "
      f"({type(e).__name__}: {e})." + (CACHE_RUN_HELP if with_cache else "")
    ) from e
  return ran


CACHE_RUN_HELP = (
  " The given `cache` collection ran as this call's decode state (the call creates a cache, "
  "so it reads one). Fix: pass a sample call the model takes with this cache (one decode "
  "step, e.g. one token), or leave `cache` out of the variables to convert the rest (the "
  "port then keeps its own cache)."
)


_RECORDS: contextvars.ContextVar[dict[Path, Record] | None] = contextvars.ContextVar(
  "loopbridge_convert_records", default=None
)


# Under `jax.jit` (the port's run): the jit body's own trace. A call whose values belong to
# it is recorded (its values come out of the jitted function); one inside a loop (`nnx.scan`)
# has another trace and is not, as an eager run does not record calls that see tracers.
_OUTER_TRACE: contextvars.ContextVar[object | None] = contextvars.ContextVar(
  "loopbridge_convert_outer_trace", default=None
)


def _recordable(tree: object) -> bool:
  outer = _OUTER_TRACE.get()
  leaves = jax.tree.leaves(tree)
  if outer is None:
    return not any(is_traced(x) for x in leaves)
  return all(not is_traced(x) or _compat.trace_of(x) is outer for x in leaves)


_PATH_ATTR = "_loopbridge_evidence_path"


_RECORDING_CLASSES: dict[type, type] = {}


def _recording_class(cls: type) -> type:
  """A subclass of `cls` whose `__call__` records its first concrete call (made once)."""
  if cls not in _RECORDING_CLASSES:

    def __call__(self, *args, **kwargs):
      out = cls.__call__(self, *args, **kwargs)
      records = _RECORDS.get()
      path = getattr(self, _PATH_ATTR, None)
      fresh = records is not None and path is not None and path not in records
      if fresh and _recordable((args, kwargs, out)):
        tp.cast(dict, records)[path] = Record(tuple(args), dict(kwargs), out)
      return out

    _RECORDING_CLASSES[cls] = type(
      cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__}
    )
  return _RECORDING_CLASSES[cls]


def copy_with(node: nnx.Module, values: tp.Mapping[Key, Value] | None, prefix: Path) -> nnx.Module:
  """A copy of an NNX graph (new Variables, arrays shared) holding `values` (keys below
  `prefix`); the original is left as it is, whatever the copy's call updates."""
  copy = _compat.clone_graph(node)
  if values:
    for key, variable in nnx_variables(copy, cache=True).items():
      full = (key[0], *prefix, *key[1:])
      if full in values:
        _compat.set_variable_value(variable, values[full])
  return copy


def _recording_copy(port: nnx.Module, values: tp.Mapping[Key, Value] | None) -> nnx.Module:
  """A copy of the port holding `values` whose modules record their calls by path."""
  copy = copy_with(port, values, ())
  for path, node in _compat.iter_graph(copy):
    if isinstance(node, nnx.Module) and callable(type(node)) and "__call__" in dir(type(node)):
      node.__class__ = _recording_class(type(node))
      setattr(node, _PATH_ATTR, tuple(str(p) for p in path))
  return copy


def _is_array(leaf: object) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray))


@dataclasses.dataclass(frozen=True)
class _PortCall:
  """The port side of a compiled run (a jit static argument: hashable where its graph is)."""

  graphdef: tp.Any
  method: str

  def run(self, state: tp.Any, args: tuple, kwargs: dict) -> Ran:
    model = nnx.merge(self.graphdef, state)
    records: dict[Path, Record] = {}
    token = _RECORDS.set(records)
    try:
      out = getattr(model, self.method)(*args, **kwargs)
    finally:
      _RECORDS.reset(token)
    return out, records


# What a compiled run's records hold besides arrays (Python scalars, None, ...), by the jit's
# static arguments and the shapes it ran on: filled when jax traces, read on every call.
_SKELETONS: dict[object, tuple[tp.Any, tuple[object, ...], tuple[bool, ...]]] = {}


# What runs eagerly but cannot be traced: a Python conversion or branch on a value (a call
# given a tuple of arrays where Linen's `Dense` takes one, `float(x)`, boolean indexing).
# Such a call runs eagerly, as it did before the evidence was compiled.
_NOT_COMPILABLE = (
  jax.errors.ConcretizationTypeError,
  jax.errors.NonConcreteBooleanIndexError,
  jax.errors.TracerArrayConversionError,
  jax.errors.TracerIntegerConversionError,
)


def _signature(side, static, treedef, state, dynamic) -> object:
  shapes = tuple((np.shape(x), str(jnp.result_type(x))) for x in jax.tree.leaves((state, dynamic)))
  return (side, static, treedef, shapes)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _jitted_call(side, static, treedef, state, dynamic):
  """One side's call under `jax.jit`: only its output and the recorded calls' arrays come
  out. Eager on flax 0.10, both sides' stacks return their weights as new arrays (a second
  copy): `nnx.scan` over an `nnx.vmap` stack returns the stack's state, and Linen's `nn.scan`
  applied with `mutable=True` returns its `params`. Compiled, nothing but the outputs is
  materialized (what the run returns and we drop is never computed)."""
  dyn = iter(dynamic)
  leaves = [next(dyn) if is_dyn else value for is_dyn, value in static]
  args, kwargs = jax.tree.unflatten(treedef, leaves)
  outer = _OUTER_TRACE.set(_compat.trace_of(jax.tree.leaves(state)[0]))
  try:
    out, records = side.run(state, args, kwargs)
  finally:
    _OUTER_TRACE.reset(outer)
  flat, record_def = jax.tree.flatten(
    {path: (r.args, r.kwargs, r.out) for path, r in records.items()}, is_leaf=lambda x: x is None
  )
  is_arr = tuple(is_traced(x) or _is_array(x) for x in flat)
  key = _signature(side, static, treedef, state, dynamic)
  _SKELETONS[key] = (record_def, tuple(None if a else x for a, x in zip(is_arr, flat)), is_arr)
  return out, [x for a, x in zip(is_arr, flat) if a]


def _compiled_run(
  side: _PortCall | _LinenCall, state: tp.Any, args: tuple, kwargs: dict
) -> Ran | None:
  """`side.run` under `jax.jit`; None where it cannot be (a static value that cannot be
  hashed, no array to trace, a value read in Python): the caller runs it eagerly."""
  if not jax.tree.leaves(state):
    return None
  leaves, treedef = jax.tree.flatten((args, kwargs))
  static = tuple((True, None) if _is_array(x) else (False, x) for x in leaves)
  dynamic = [x for x in leaves if _is_array(x)]
  try:  # static arguments: a module holding a list, a dict or a config object cannot be hashed
    hash((side, static))
  except TypeError:
    return None
  try:
    out, arrays = _jitted_call(side, static, treedef, state, dynamic)
  except _NOT_COMPILABLE:
    return None
  skeleton = _SKELETONS.get(_signature(side, static, treedef, state, dynamic))
  if skeleton is None:  # jax reused a compilation our key had not seen: run eagerly
    return None
  record_def, fixed, is_arr = skeleton
  it = iter(arrays)
  flat = [next(it) if a else x for a, x in zip(is_arr, fixed)]
  tree = jax.tree.unflatten(record_def, flat)
  return out, {path: Record(tuple(a), dict(k), o) for path, (a, k, o) in tree.items()}


def nnx_run(
  port: nnx.Module,
  values: tp.Mapping[Key, Value] | None,
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> tuple[object, dict[Path, Record]]:
  """A copy of the port holding `values` (None: its own) called once under `jax.jit`,
  recording each module's first call outside loops (its inputs and output)."""
  copy = _recording_copy(port, values)
  try:
    graphdef, state = _compat.split_graph(copy)
    ran = _compiled_run(
      _PortCall(graphdef, method or "__call__"),
      state,
      tuple(sample_args),
      dict(sample_kwargs or {}),
    )
    if ran is not None:
      return ran
    records: dict[Path, Record] = {}
    token = _RECORDS.set(records)
    try:
      out = getattr(copy, method or "__call__")(*sample_args, **(sample_kwargs or {}))
    finally:
      _RECORDS.reset(token)
  except Exception as e:
    raise CheckpointError(
      f"running the NNX port {type(port).__name__} with the converted values failed "
      f"({type(e).__name__}: {e})."
    ) from e
  return out, records


def node_at(root: object, path: Path) -> object | None:
  for p, node in _compat.iter_graph(root):
    if tuple(str(x) for x in p) == path:
      return node
  return None


def _as_numpy(leaf: object) -> np.ndarray:
  dtype = getattr(leaf, "dtype", None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(tp.cast(jax.Array, leaf))
  return np.asarray(leaf)


def agreement(reference: object, candidate: object, tol: ToleranceChoice) -> float | None:
  """The max abs difference when `candidate` agrees with `reference` within tolerance;
  None when it does not (or the two have other structures or shapes)."""
  ref, cand = jax.tree.leaves(reference), jax.tree.leaves(candidate)
  if len(ref) != len(cand):
    return None
  worst = 0.0
  for a, b in zip(ref, cand):
    x, y = _as_numpy(a), _as_numpy(b)
    if x.shape != y.shape:
      return None
    if not (is_float(x.dtype) or is_float(y.dtype)):
      if not np.array_equal(x, y):
        return None
      continue
    # The rule of lb.compare: atol a fraction of the source output's robust scale, mask
    # values (finfo.min, -1e9, infinities equal on both sides) matched exactly.
    result = compare_arrays(x, y, tol)
    if not result.within:
      return None
    worst = max(worst, result.max_abs)
  return worst


# One run of a model on one input: its output and the calls it recorded.
Ran = tuple[object, dict[Path, Record]]
