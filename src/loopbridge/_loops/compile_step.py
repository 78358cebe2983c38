"""`lb.compile_step`: split a model once, then call one `jax.jit` executable on its state.

Why it exists: `nnx.jit` walks the whole module graph on every call (split before, update after),
which costs hundreds of microseconds even on a tiny model — many times the compiled step — and
unless told to donate it copies every record buffer the step writes (a whole-buffer copy per
call, O(capacity)). `compile_step` walks the graph once, when built: it keeps the GraphDef and
the flat list of the model's Variables. A call reads the leaves straight out of those Variables,
runs one `jax.jit` executable and stores the changed leaves back into the same Variables, so the
model stays the source of truth between calls. The leaves the function changes (buffers,
counts, rng counters, ...) are donated: XLA updates them in place. Leaves the function never
reads for the current argument types (e.g. the key of an rng stream nothing draws from) are not
passed at all: on a small model each argument costs about as much as a small op.

"Changes" is decided on the function's jaxpr, not on object identity: a loop (flax 0.10's
`nnx.fori_loop` carries every Variable) hands back a new tracer for a param it never writes.
`_forwarded` follows such values through `jit`, `while` and `scan` bodies, so a leaf that
comes out equal to the one that went in is not donated (the caller's arrays, e.g. Linen
variables given to `lb.checkpoint.load_linen_variables`, stay valid). The jaxpr is read by
`_compat.jaxpr_reading`: where JAX renamed what it reads (jax 0.11 did), a leaf counts as
written (donated, and stored from the step's result), which is slower but still correct.
"""

from __future__ import annotations

import collections
import typing as tp

import jax
import jax.core
import numpy as np
from flax import nnx

from .. import _compat
from .._core import recorder
from .._core.errors import ForeignTraceError, StructureChangeError

Out = tp.TypeVar("Out")
_get_raw, _set_raw = _compat.raw_value_accessors()


def _no_key_accessor(variable: nnx.Variable) -> tp.NoReturn:
  raise AttributeError("this jax has no typed-key accessors; keys are passed as they are")


# The key's PRNG implementation is a private jax type (`PRNGImpl`): no public name to give it.
def _key_accessors() -> tuple[
  tp.Callable[[nnx.Variable], jax.Array], tp.Callable[[nnx.Variable], tp.Any]
]:
  """(raw key data, PRNG implementation) getters of a typed-key Variable.

  Only used when keys were found. Asked per use (a cached call), not bound at import:
  probing them starts the JAX backend (see `_compat.key_data_accessors`).
  """
  return _compat.key_data_accessors() or (_no_key_accessor, _no_key_accessor)


_TRACER = jax.core.Tracer
# Runs an iterator to its end in C (here: `map` of a setter), without a Python-level loop.
_consume = collections.deque(maxlen=0).extend


# The caller's keyword arguments go to the jitted function as one keyword argument: passed
# as they are, a name could meet a parameter of the jitted function (`flat`: a bare
# AssertionError in jax 0.10) or of jax's own dispatch (`fun`, `jit_info` in jax 0.5).
_KWARGS = "loopbridge__kwargs"


def _packed(kwargs: dict[str, object]) -> dict[str, object]:
  return {_KWARGS: kwargs} if kwargs else kwargs


STEP_IN_OUTER_TRACE = (
  "a step made by lb.compile_step was called inside a traced function (jax.jit, jax.vmap, a "
  "jax.lax loop body, ...) while its model lives outside it: the values the step updates "
  "(records, counts, rng counters) would be tracers of that trace, which cannot be stored in "
  "the model. Why: the step updates the model in place from Python, and JAX keeps only what "
  "a traced function returns (flax 0.10 lost the records and left tracers in the model; "
  "flax 0.12 raised TraceContextError). Fix: call the step from Python, it is already "
  "compiled, and put the loop inside the function given to lb.compile_step:\n"
  "    step = lb.compile_step(lambda m, x, n: nnx.fori_loop(0, n, body, (m, x))[1], model)\n"
  "or, inside your own traced function, call the model itself under nnx.jit (which carries "
  "its state), or build the step inside it from the model it was given."
)


class _NewReads(Exception):
  """Raised while tracing when the function reads leaves that the calls no longer pass."""


class _NewWrites(Exception):
  """Raised while tracing when the function writes leaves not yet marked as written."""

  def __init__(self, indices: frozenset[int]):
    super().__init__(sorted(indices))
    self.indices = indices


def _forwarded(jaxpr: tp.Any, n_inputs: int | None = None) -> list[int | None]:
  """For each output of `jaxpr`, the index of the input it provably equals (or None).

  Read by `_compat.forwarded_inputs`, which answers None (not forwarded: donate it and store
  what the step returns) wherever JAX's jaxpr params are not what it knows.
  """
  return _compat.forwarded_inputs(jaxpr, n_inputs)


# The key entries are jaxlib classes (DictKey, SequenceKey, ...) the checker cannot see.
def _path_keys(path: tp.Sequence[tp.Any]) -> tuple[tp.Hashable, ...]:
  """The NNX graph path of a state leaf (dict keys; the trailing `.value` attribute dropped)."""
  keys: list[tp.Hashable] = []
  for key in path:
    if isinstance(key, jax.tree_util.DictKey):
      keys.append(key.key)
    elif isinstance(key, jax.tree_util.SequenceKey):
      keys.append(key.idx)
  return tuple(keys)


class CompiledStep(tp.Generic[Out]):
  """A `jax.jit`-compiled function of an NNX model that updates the model in place.

  Built by `lb.compile_step`; calling it runs `fn(model, *args, **kwargs)` compiled and returns
  its output. See `compile_step` for the rules.

  Args:
    fn: `fn(model, *args, **kwargs)` returning a pytree of arrays (not the model).
    model: an NNX module, e.g. an initialized `lb.ToNNX` or a module holding some.
    donate: donate the values `fn` changes (default True). With False each call copies them.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import nnx
    >>> model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    >>> step = lb.compile_step(lambda m, x: m(x), model)
    >>> isinstance(step, lb.CompiledStep), step(jnp.ones((1, 2))).shape
    (True, (1, 2))
  """

  def __init__(self, fn: tp.Callable[..., Out], model: nnx.Module, *, donate: bool = True):
    if not isinstance(model, nnx.Module):
      raise TypeError(
        f"lb.compile_step needs an NNX module (e.g. an lb.ToNNX), got {type(model).__name__}. "
        "Fix: wrap Linen modules with lb.ToNNX(module, rngs=...) and lb.lazy_init them first."
      )
    self._fn = fn
    self._model = model
    self._donate = donate
    self._split()

  # ---------------------------------------------------------------- the one graph traversal
  def _split(self) -> None:
    model = self._model
    graphdef, state = nnx.split(model)
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    by_path = {
      tuple(path): node
      for path, node in _compat.iter_graph(model)
      if isinstance(node, nnx.Variable)
    }
    variables = []
    for path, leaf in flat:
      variable = by_path.get(_path_keys(path))
      if variable is None or _compat.get_raw_value(variable) is not leaf:
        raise TypeError(
          f"lb.compile_step cannot follow the state leaf at {jax.tree_util.keystr(path)}: "
          "it is not the single array held by one Variable. Why: the compiled step reads and "
          "writes Variables directly to skip the per-call graph traversal. Fix: keep one "
          "array per Variable, or use nnx.jit for this model."
        )
      variables.append(variable)
    self._generation = recorder.generation()
    old = getattr(self, "_variables", None)
    if (
      old is not None
      and len(old) == len(variables)
      and all(a is b for a, b in zip(old, variables))
      and self._treedef == treedef
      and self._graphdef == graphdef
    ):
      self._mark_ready()
      return  # a declaration elsewhere left this model as it was: keep the executable
    self._graphdef = graphdef
    self._treedef = treedef
    self._variables = tuple(variables)
    # `lb.preallocate` / `lb.lazy_init` re-declare buffers by replacing Variables (on any
    # module of the graph, native ones included); each declaration bumps the generation.
    self._unchanged: frozenset[int] = frozenset()  # new objects, provably the same values
    self._dropped: frozenset[int] = frozenset()  # kept leaves the function never reads
    self._set_written(frozenset())
    self._analysed = False
    self._mark_ready()

  def _mark_ready(self) -> None:
    """Let calls take the short path while the generation stays `_ready` (see `__call__`).

    Only an analysed step without typed keys qualifies: a key Variable can be given a key of
    another PRNG implementation between calls, which the long path checks.
    """
    ready = self._analysed and not self._key_vars
    self._ready = self._generation if ready else -1

  def _set_written(self, written: frozenset[int]) -> None:
    self._written = written
    self._moved_idx = tuple(sorted(written))
    kept = [i for i in range(len(self._variables)) if i not in written | self._dropped]
    # Kept typed PRNG keys (an `nnx.Rngs` key) go last among the kept leaves and travel as
    # their uint32 data (see `_compat.key_data_accessors`); `_pure` wraps them back.
    keys = [
      i
      for i in kept
      if _compat.key_data_accessors() is not None
      and _compat.is_concrete_typed_key(_compat.get_raw_value(self._variables[i]))
    ]
    self._kept_idx = tuple([i for i in kept if i not in keys] + keys)
    self._moved_vars = tuple(self._variables[i] for i in self._moved_idx)
    self._plain_vars = tuple(self._variables[i] for i in self._kept_idx[: len(kept) - len(keys)])
    self._key_vars = tuple(self._variables[i] for i in keys)
    self._key_impls = self._current_key_impls()
    # The leaves whose raw values go as they are: the plain kept ones, then the written ones.
    self._raw_vars = self._plain_vars + self._moved_vars
    # Every leaf is its own positional argument (jax's C++ dispatch handles those faster than
    # the leaves of a list): plain kept, written (donated), then the kept keys' data; the
    # caller's positional arguments follow and its keyword arguments stay keywords (wrapping
    # them in an (args, kwargs) pair costs about half a microsecond per call). They travel
    # as one keyword `_KWARGS` (see `_packed`), so no name of theirs meets a parameter name.
    n_plain, n_moved = len(self._plain_vars), len(self._moved_idx)
    self._n_leaves = len(self._raw_vars) + len(self._key_vars)

    # A new function object per layout: jax caches traces by function (a bound method of this
    # step compares equal to every other) and argument types, and two layouts can pass the
    # same types (e.g. one read-only leaf dropped instead of another of the same shape).
    def pure(*flat, **packed):
      return self._pure(flat, packed.get(_KWARGS, {}))

    self._jitted = jax.jit(
      pure, donate_argnums=tuple(range(n_plain, n_plain + n_moved)) if self._donate else ()
    )

  def _current_key_impls(self) -> tuple[tp.Any, ...] | None:
    try:
      return tuple(map(_key_accessors()[1], self._key_vars)) if self._key_vars else ()
    except AttributeError:  # no longer a typed key: None differs from any recorded impls
      return None

  def _refresh(self) -> None:
    """Follow re-declared buffers, and keys of another PRNG implementation stored meanwhile."""
    if self._stale():
      self._split()
    if self._key_vars and self._current_key_impls() != self._key_impls:
      self._set_written(self._written)

  def _stale(self) -> bool:
    return self._generation != recorder.generation()

  # ---------------------------------------------------------------- traced
  # `flat`: the model's leaves (arrays, typed keys' data) then the caller's arguments.
  def _pure(self, flat: tuple[tp.Any, ...], kwargs: dict[str, object]):
    n_plain, n_moved = len(self._plain_vars), len(self._moved_idx)
    moved = flat[n_plain : n_plain + n_moved]
    args = flat[self._n_leaves :]
    assert self._key_impls is not None  # set by _set_written before the first trace
    key_data = flat[n_plain + n_moved : self._n_leaves]
    kept = [
      *flat[:n_plain],
      *(jax.random.wrap_key_data(d, impl=impl) for d, impl in zip(key_data, self._key_impls)),
    ]
    leaves: list[object] = [None] * len(self._variables)
    for i, leaf in zip(self._kept_idx, kept):
      leaves[i] = leaf
    for i, leaf in zip(self._moved_idx, moved):
      leaves[i] = leaf
    if self._dropped:
      out, new_leaves, changed = self._trace_without_dropped(leaves, args, kwargs)
    else:
      out, new_leaves, changed = self._trace(leaves, args, kwargs)
    if not changed <= self._written | self._unchanged:
      raise _NewWrites(changed)
    return out, [new_leaves[i] for i in self._moved_idx]

  def _trace_without_dropped(self, leaves, args, kwargs):
    """`_trace` for a call that does not pass the dropped leaves (see `_analyse`).

    The function is traced to a jaxpr that takes every leaf (the dropped ones at their current
    values, which only give shapes and dtypes); if it now reads a dropped leaf (new argument
    shapes can change what it reads) `_NewReads` asks the caller to analyse again.
    """
    for i in self._dropped:
      leaves[i] = _compat.get_raw_value(self._variables[i])
    seen: dict[str, frozenset[int]] = {}

    def state_fn(leaves, args, kwargs):
      out, new_leaves, seen["changed"] = self._trace(leaves, args, kwargs)
      return new_leaves, out

    flat, _ = jax.tree_util.tree_flatten((leaves, args, kwargs))
    closed, shapes = jax.make_jaxpr(state_fn, return_shape=True)(leaves, args, kwargs)
    n = len(self._variables)  # the outputs are the new leaves, then the result (as in _analyse)
    outputs = [i in self._written for i in range(n)] + [True] * (len(closed.jaxpr.outvars) - n)
    used = _compat.used_inputs(closed.jaxpr, outputs, len(flat))
    if used is None or any(used[i] for i in self._dropped):
      raise _NewReads()  # (None: this jax's jaxpr cannot be read; analysed again, none dropped)
    results = _compat.eval_jaxpr(closed, *flat)
    new_leaves, out = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), results)
    return out, new_leaves, seen["changed"]

  def _analyse(self, args, kwargs) -> None:
    """Learn which leaves the function writes, from its jaxpr (see the module docstring)."""
    seen: dict[str, frozenset[int]] = {}

    def state_fn(leaves, args, kwargs):
      out, new_leaves, seen["changed"] = self._trace(leaves, args, kwargs)
      return new_leaves, out

    leaves = [_compat.get_raw_value(v) for v in self._variables]
    n_flat = len(jax.tree_util.tree_leaves((leaves, args, kwargs)))
    closed = jax.make_jaxpr(state_fn)(leaves, args, kwargs)
    # The leaves are the first inputs and the first outputs.
    forwarded = _forwarded(closed.jaxpr, n_flat)
    same = frozenset(i for i in seen["changed"] if i < len(forwarded) and forwarded[i] == i)
    self._unchanged = (self._unchanged | same) - (seen["changed"] - same)
    written = self._written | (seen["changed"] - same)
    # Kept leaves that no output (the result, the written leaves) depends on are not passed:
    # on a small model each argument costs about as much as a small op (e.g. an unused rng key).
    n = len(self._variables)
    outputs = [i in written for i in range(n)] + [True] * (len(closed.jaxpr.outvars) - n)
    used = _compat.used_inputs(closed.jaxpr, outputs, n_flat)
    self._dropped = frozenset(
      () if used is None else (i for i in range(n) if not used[i] and i not in written)
    )
    self._set_written(written)
    self._analysed = True
    self._mark_ready()

  def _trace(self, leaves, args, kwargs):
    model = nnx.merge(self._graphdef, jax.tree_util.tree_unflatten(self._treedef, leaves))
    out = self._fn(model, *args, **kwargs)
    if any(
      isinstance(x, nnx.Module)
      for x in jax.tree_util.tree_leaves(out, is_leaf=lambda x: isinstance(x, nnx.Module))
    ):
      raise TypeError(
        "the function given to lb.compile_step returned an NNX module. Why: the step updates "
        "the model in place and returns arrays only. Fix: return the outputs (arrays) and "
        "read the model itself after the call."
      )
    new_leaves, new_treedef = jax.tree_util.tree_flatten(nnx.state(model))
    if new_treedef != self._treedef or any(
      np.shape(a) != np.shape(b) or a.dtype != b.dtype for a, b in zip(leaves, new_leaves)
    ):
      raise StructureChangeError(
        "the function given to lb.compile_step changed the model's structure (added or "
        "removed a Variable, or changed a shape or dtype). Why: the compiled step keeps the "
        "model's state layout fixed, as NNX loops do. Fix: create every Variable before "
        "building the step (lb.lazy_init / lb.preallocate) and keep shapes fixed."
      )
    changed = frozenset(i for i, (a, b) in enumerate(zip(leaves, new_leaves)) if a is not b)
    return out, new_leaves, changed

  # ---------------------------------------------------------------- calling
  def _inputs(self) -> list[object]:
    """The leaves to call `_jitted` with (kept, written, key data), from the model's Variables.

    Read after `_refresh` and `_analyse`: both can change which Variables go where.
    """
    return [*map(_get_raw, self._raw_vars), *map(_key_accessors()[0], self._key_vars)]

  def __call__(self, /, *args: object, **kwargs: object) -> Out:
    """Run the compiled function on the model's current state; store what it changed."""
    # The usual call (no declaration since the last one, analysed, no typed keys) is kept to
    # one comparison and a few C-level loops: on a small model, Python work here costs as much
    # as jax's own dispatch (benchmarks/bench_recording.py, "D dispatch"). The generation is
    # read as a module attribute (no Python frame, unlike `recorder.generation()`).
    if self._ready != recorder._current_generation:
      return self._checked_call(args, kwargs)
    try:
      out, new = self._jitted(
        *map(_get_raw, self._raw_vars), *args, **({_KWARGS: kwargs} if kwargs else kwargs)
      )
    except (_NewWrites, _NewReads):  # new argument shapes changed what it does: learn again
      self._analyse(args, kwargs)
      return self._checked_call(args, kwargs)
    if new and isinstance(new[0], _TRACER):
      self._store(new)
    else:  # concrete results (called from Python): no trace-level check needed
      _consume(map(_set_raw, self._moved_vars, new))
    return out

  def _checked_call(self, args: tuple[object, ...], kwargs: dict[str, object]) -> Out:
    """A call that first follows re-declarations, checks the keys and analyses if needed."""
    self._refresh()
    if not self._analysed:  # first call: learn which leaves are written, then donate them
      self._analyse(args, kwargs)
    try:
      out, new = self._jitted(*self._inputs(), *args, **_packed(kwargs))
    except (_NewWrites, _NewReads):
      self._analyse(args, kwargs)
      return self._checked_call(args, kwargs)
    self._store(new)
    return out

  def _store(self, new: tp.Sequence[object]) -> None:
    """Write the changed leaves back into their Variables."""
    if new and isinstance(new[0], _TRACER):
      # Under an outer trace the per-Variable trace-level check runs; concrete results (the
      # usual case: called from Python) cannot belong to another trace, so it is skipped.
      # Checked for all Variables before any is written, so a refused call changes nothing.
      trace = _compat.current_trace()
      if any(_compat.written_in_another_trace(v, trace) for v in self._moved_vars):
        raise ForeignTraceError(STEP_IN_OUTER_TRACE)
      for variable, value in zip(self._moved_vars, new):
        _compat.set_raw_value(variable, value)
    else:
      _consume(map(_set_raw, self._moved_vars, new))

  # A `jax.stages.Lowered`, left loose: on CPU/GPU callers chain `.compile().memory_analysis()`,
  # which jax types as Optional.
  def lower(self, /, *args: object, **kwargs: object) -> tp.Any:
    """`jax.stages.Lowered` of a call with these arguments (e.g. `.compile().memory_analysis()`)."""
    self._refresh()
    while True:
      if not self._analysed:
        self._analyse(args, kwargs)
      try:
        return self._jitted.lower(*self._inputs(), *args, **_packed(kwargs))
      except (_NewWrites, _NewReads):
        self._analyse(args, kwargs)


def compile_step(
  fn: tp.Callable[..., Out], model: nnx.Module, *, donate: bool = True
) -> CompiledStep[Out]:
  """Compile `fn(model, *args, **kwargs)` with `jax.jit`, splitting the model only once.

  The fast way to call a model (or a whole loop over it) many times from Python: `nnx.jit`
  traverses the module graph on every call, this does it once when built. Each call reads
  the model's current values, runs the compiled function and writes the values it changed
  back into the model's Variables (records, counts, rng counters, caches...). Those values are
  donated, so record buffers are updated in place with no per-call copy; arrays previously
  read from them (e.g. `lb.buffers(model)`) are invalid after a call — read again instead.
  Inside `fn` the model is an ordinary NNX module: call it, loop over it with
  `nnx.while_loop`/`nnx.fori_loop`/`lb.while_loop`, read `lb.recorded(model)`. Arguments
  are traced (arrays, Python numbers, pytrees of them; close over static settings in `fn`),
  so repeated calls with the same argument shapes reuse one executable. The first call traces
  `fn` twice (once to learn which values it changes, so that only those are donated).

  Args:
    fn: `fn(model, *args, **kwargs)` returning a pytree of arrays (not the model).
    model: an NNX module, e.g. an initialized `lb.ToNNX` or a module holding some.
    donate: donate the values `fn` changes (default True). With False each call copies them.

  Returns:
    A `CompiledStep`: call it with `*args, **kwargs`; `.lower(*args, **kwargs)` lowers it.

  Raises:
    TypeError: `model` is not an NNX module, `fn` returns a module, or a Variable holds more
      than one array.
    StructureChangeError: `fn` adds or removes Variables or changes their shapes.

  The step follows the Variables the model held when it was built; it notices buffers
  re-declared by `lb.preallocate` or moved by `lb.sharding.shard_buffers`. After replacing
  Variables any other way, build a new step.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x + 1
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.zeros((2,)), capacity=8)
    >>> def run(model, x, n):
    ...   return nnx.fori_loop(0, n, lambda i, c: (c[0], c[0](c[1])), (model, x))[1]
    >>> run_fast = lb.compile_step(run, model)
    >>> run_fast(jnp.zeros((2,)), 3)
    Array([3., 3.], dtype=float32)
    >>> lb.recorded(model)["intermediates"]["x"][:, 0]
    Array([0., 1., 2.], dtype=float32)
  """
  return CompiledStep(fn, model, donate=donate)
