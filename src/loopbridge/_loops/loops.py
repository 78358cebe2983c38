"""`lb.while_loop` / `lb.fori_loop`: NNX-aware loops that work on every supported flax.

How they work: the carry is flattened into its NNX graph objects (modules, Variables) and its
other leaves (arrays, Python scalars). All graph objects are split *once*, together, in graph
mode, so modules that share a submodule (or the same module passed twice) keep sharing. The
pure state runs through `jax.lax.while_loop` / `jax.lax.fori_loop`; the body merges it back
into fresh objects, calls the user's body, and splits the result. After the loop the caller's
own objects are updated in place (`nnx.update`), as the `nnx` loops do.

Why not `nnx.fori_loop`: on flax 0.10 its bookkeeping of references across the body rejects
two different modules in one carry (e.g. `nnx.fori_loop(0, n, f, (model, model2))`).
Splitting the whole carry as one graph has no
such bookkeeping to get wrong, and a structure change is caught at trace time and explained
with `lb.explain`'s report instead of a GraphDef dump.

Called outside any trace, the loop (split state in, state out) is compiled once per body
function and carry structure and reused, so an eager call does not re-trace the body. A
compiled loop bakes in whatever the body reads from outside its carry, so it is reused only
when the body and condition provably reach no NNX module, Variable or array through their
closures, defaults, bound `self`, `functools.partial` arguments or the globals they name
(`_closure_state`). Otherwise the loop is traced on every call, as `nnx.fori_loop` is, so it
reads the current values; a body that *writes* to a module outside the carry is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import types
import typing as tp

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from flax import errors as flax_errors
from flax import nnx

from .. import _compat
from .._core.errors import ForeignTraceError, StructureChangeError
from .._diagnostics import explain

T = tp.TypeVar("T")
# A fori_loop bound: a Python/NumPy integer (kept static) or an integer array (traced).
_Bound = int | np.integer | jax.Array
# The split state and the carry's other leaves, in and out of one step.
_Carried = tuple[nnx.State, list[object]]
_RunFn = tp.Callable[[nnx.State, list[object], _Bound | None, _Bound | None], _Carried]


class _TreeDef(tp.Protocol):
  """What the loops use of a `jax.tree_util.PyTreeDef` (a jaxlib class the checker cannot see)."""

  def unflatten(self, leaves: tp.Iterable[object], /) -> object: ...


# Compiled eager loops kept alive (each holds its body function); older ones are dropped.
_CACHE_SIZE = 64


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Everything static about one loop: hashable, so an eager call can reuse its compilation."""

  kind: str  # "while" or "fori"
  cond_fn: tp.Callable[..., jax.typing.ArrayLike] | None  # None for fori
  body_fn: tp.Callable[..., object]  # carry -> carry, or (i, carry) -> carry for fori
  graphdef: nnx.GraphDef[list[object]]  # of the carry's graph objects, split together
  treedef: _TreeDef
  node_mask: tuple[bool, ...]
  bounds: tuple[int, int] | None  # fori_loop bounds when both are Python ints (kept static)
  unroll: int | bool | None


def _flatten(carry: object) -> tuple[list[object], _TreeDef, tuple[bool, ...]]:
  leaves, treedef = jax.tree_util.tree_flatten(carry, is_leaf=explain.is_graph_object)
  return leaves, treedef, tuple(explain.is_graph_object(leaf) for leaf in leaves)


def _join(plan: _Plan, nodes: tp.Sequence[object], values: tp.Sequence[object]) -> object:
  nodes_it, values_it = iter(nodes), iter(values)
  return plan.treedef.unflatten(
    [next(nodes_it) if is_node else next(values_it) for is_node in plan.node_mask]
  )


def _avals(tree: object) -> list[tuple[tuple[int, ...], np.dtype]]:
  return [(jnp.shape(x), jax.dtypes.result_type(x)) for x in jax.tree_util.tree_leaves(tree)]


def _structure_error(
  loop_name: str,
  plan: _Plan,
  body: tp.Callable[[object], object],
  state: nnx.State,
  values: tp.Sequence[object],
  detail: str,
) -> StructureChangeError:
  """The readable error: `lb.explain`'s report of one step from the same carry."""
  carry = _join(plan, nnx.merge(plan.graphdef, state), values)
  report = explain.explain_step(body, carry, name=explain._body_name(plan.body_fn))
  text = (
    str(report)
    if not report.ok
    else (
      f"{detail}. (lb.explain found no difference in paths, shapes, dtypes, identity or "
      "sharing, so the difference is in Variable metadata or in the GraphDef itself.)"
    )
  )
  return StructureChangeError(
    f"{loop_name}: the body changes the structure of the loop carry, so the loop cannot carry "
    f"it from one step to the next.\n{text}"
  )


def _step(
  loop_name: str,
  plan: _Plan,
  body: tp.Callable[[object], object],
  state: nnx.State,
  values: list[object],
) -> _Carried:
  """One traced step: merge, call the body, split, and check the structure is unchanged."""
  # On flax 0.12 `merge` puts the state's own Variables into the modules, so the body mutates
  # `state`; keep an untouched copy (new Variable objects around the same arrays) to compare
  # with and to explain from.
  state_in = jax.tree_util.tree_map(lambda leaf: leaf, state)
  carry = _join(plan, nnx.merge(plan.graphdef, state), values)
  out = body(carry)
  state = state_in
  leaves, treedef, node_mask = _flatten(out)
  if treedef != plan.treedef or node_mask != plan.node_mask:
    raise _structure_error(
      loop_name,
      plan,
      body,
      state,
      values,
      f"the carry's pytree changed from {plan.treedef} to {treedef}",
    )
  nodes_out = [leaf for leaf, is_node in zip(leaves, node_mask) if is_node]
  values_out = [leaf for leaf, is_node in zip(leaves, node_mask) if not is_node]
  graphdef_out, state_out = _compat.split_graph(nodes_out)
  if graphdef_out != plan.graphdef:
    raise _structure_error(loop_name, plan, body, state, values, "the GraphDef changed")
  if (
    jax.tree_util.tree_structure(state_out) != jax.tree_util.tree_structure(state)
    or _avals(state_out) != _avals(state)
    or _avals(values_out) != _avals(values)
  ):
    raise _structure_error(
      loop_name,
      plan,
      body,
      state,
      values,
      "a Variable or array changed its structure, shape or dtype",
    )
  return state_out, values_out


def _run(
  plan: _Plan, state: nnx.State, values: list[object], lower: _Bound | None, upper: _Bound | None
) -> _Carried:
  if plan.kind == "while":
    cond_fn = plan.cond_fn
    assert cond_fn is not None  # `while_loop` always passes one

    def cond(val):
      state, values = val
      return cond_fn(_join(plan, nnx.merge(plan.graphdef, state), values))

    def body(val):
      return _step("lb.while_loop", plan, plan.body_fn, *val)

    return jax.lax.while_loop(cond, body, (state, values))

  def fori_body(i, val):
    return _step("lb.fori_loop", plan, lambda carry: plan.body_fn(i, carry), *val)

  if plan.bounds is not None:
    lower, upper = plan.bounds
  return jax.lax.fori_loop(lower, upper, fori_body, (state, values), unroll=plan.unroll)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _compiled(plan: _Plan) -> _RunFn:
  return jax.jit(functools.partial(_run, plan))


_STATIC_ATOMS = (
  type(None),
  bool,
  int,
  float,
  complex,
  str,
  bytes,
  type,
  types.ModuleType,
  types.BuiltinFunctionType,
  np.dtype,
  np.generic,
  enum.Enum,
  range,
)
_WALK_DEPTH = 8
_WALK_WIDTH = 256


@dataclasses.dataclass
class _Reach:
  """What the loop functions reach outside the carry."""

  nodes: list[object] = dataclasses.field(default_factory=list)  # NNX graph objects
  dynamic: bool = False  # arrays, graph objects, or something not looked into


def _closure_state(*fns: object) -> _Reach:
  """The NNX graph objects the functions reach outside their arguments, and whether a
  compiled loop could depend on any value that may change between calls."""
  reach, seen = _Reach(), set()

  def code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions and lambdas read globals too
      if isinstance(const, types.CodeType):
        names |= code_names(const)
    return names

  def walk(obj: object, depth: int) -> None:
    # A tracer kept from an earlier trace (e.g. appended to a list for debugging) is no value
    # a later call could read.
    if isinstance(obj, (*_STATIC_ATOMS, jax.core.Tracer)) or id(obj) in seen:
      return
    seen.add(id(obj))
    if explain.is_graph_object(obj):
      reach.nodes.append(obj)
      reach.dynamic = True
      return
    if isinstance(obj, (jax.Array, np.ndarray)) or depth > _WALK_DEPTH:
      reach.dynamic = True
      return
    children: list[object]
    if isinstance(obj, functools.partial):
      children = [obj.func, *obj.args, *obj.keywords.values()]
    elif isinstance(obj, types.MethodType):
      children = [obj.__func__, obj.__self__]
    elif isinstance(obj, types.FunctionType):
      cells = [
        cell.cell_contents for cell in obj.__closure__ or () if cell.cell_contents is not None
      ]
      globals_ = [
        obj.__globals__[name] for name in code_names(obj.__code__) if name in obj.__globals__
      ]
      children = [
        *cells,
        *(obj.__defaults__ or ()),
        *(obj.__kwdefaults__ or {}).values(),
        *globals_,
      ]
    elif isinstance(obj, (tuple, list, set, frozenset)):
      children = list(obj)
    elif isinstance(obj, dict):
      children = [*obj.keys(), *obj.values()]
    elif hasattr(obj, "__dict__"):  # a plain object, e.g. the `self` of a bound method
      children = list(vars(obj).values())
      # The class's own __call__ function, whose closure and globals are walked: not a test of
      # whether obj is callable.
      call = getattr(type(obj), "__call__", None)  # noqa: B004
      if isinstance(call, types.FunctionType):
        children.append(call)
    else:  # no way to look inside (slots, C extension objects)
      reach.dynamic = True
      return
    if len(children) > _WALK_WIDTH:
      reach.dynamic = True
      return
    for child in children:
      walk(child, depth + 1)

  for fn in fns:
    if fn is not None:
      walk(fn, 0)
  return reach


def _closure_write_error(
  loop_name: str, reach: _Reach, cause: BaseException | None
) -> StructureChangeError:
  names = ", ".join(sorted({type(node).__name__ for node in reach.nodes}))
  detail = f" ({type(cause).__name__}: {str(cause).splitlines()[0]})" if cause else ""
  return StructureChangeError(
    f"{loop_name}: the body writes to a module it reaches outside the loop carry ({names}, "
    f"from its closure, defaults or globals){detail}. Why: the loop carries only the state "
    "in its carry, so a write anywhere else would be lost or leak a traced value. Fix: "
    "pass that module in the carry, e.g. lb.fori_loop(lo, hi, lambda i, c: (c[0], "
    "c[0](c[1])), (model, x)), and read it from the carry inside the body."
  )


def _is_static_int(x: object) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_traced(tree: object) -> bool:
  return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def _check_loop_args(
  kind: str, cond_fn: object, body_fn: object, lower: object, upper: object
) -> None:
  """Refuse what would fail deep inside the trace (a non-function) or run another number of
  steps than the caller meant (a float bound is compared as a float: 0 to 2.5 runs 3 steps)."""
  name = f"lb.{kind}_loop"
  functions = (("cond_fn", cond_fn),) if kind == "while" else ()
  for what, fn in (*functions, ("body_fn", body_fn)):
    if not callable(fn):
      raise TypeError(
        f"{name}: {what} must be a function, got {type(fn).__name__}. Note the order: "
        + (
          "lb.fori_loop(lower, upper, body_fn, carry)."
          if kind == "fori"
          else "lb.while_loop(cond_fn, body_fn, carry)."
        )
      )
  if kind != "fori":
    return
  for what, bound in (("lower", lower), ("upper", upper)):
    dtype = getattr(bound, "dtype", None)
    integer = (
      jnp.issubdtype(dtype, jnp.integer)
      if dtype is not None
      else isinstance(bound, (int, np.integer)) and not isinstance(bound, bool)
    )
    if not integer:
      raise TypeError(
        f"{name}: {what}={bound!r} must be an integer (a Python int or an integer array), "
        f"got {type(bound).__name__}. Why: the bounds count loop steps; a fractional bound "
        f"would run a number of steps you did not write. Fix: pass int({what}) or "
        f"jnp.asarray({what}, jnp.int32)."
      )


def _loop(
  kind: str,
  cond_fn: tp.Callable[..., jax.typing.ArrayLike] | None,
  body_fn: tp.Callable[..., object],
  carry: object,
  # Anything, as the caller passed it: `_check_loop_args` refuses a non-integer, and only
  # Python/NumPy integers are made static with `int()`.
  lower: tp.Any = None,
  upper: tp.Any = None,
  unroll: int | bool | None = None,
) -> tp.Any:  # the caller's carry rebuilt, of the same type (`while_loop`/`fori_loop` say so)
  _check_loop_args(kind, cond_fn, body_fn, lower, upper)
  leaves, treedef, node_mask = _flatten(carry)
  nodes = [leaf for leaf, is_node in zip(leaves, node_mask) if is_node]
  values = [leaf for leaf, is_node in zip(leaves, node_mask) if not is_node]
  graphdef, state = _compat.split_graph(nodes)
  # Python/NumPy integer bounds stay static, as `jax.lax.fori_loop` keeps them (a scan with a
  # known trip count, reverse-differentiable); anything else is traced.
  static_bounds = kind == "fori" and _is_static_int(lower) and _is_static_int(upper)
  plan = _Plan(
    kind,
    cond_fn,
    body_fn,
    graphdef,
    treedef,
    node_mask,
    (int(lower), int(upper)) if static_bounds else None,
    unroll,
  )
  run: _RunFn = functools.partial(_run, plan)
  reach = _closure_state(cond_fn, body_fn)
  # A cached compilation would keep the values it read from outside the carry (e.g. the
  # params of a module the body closes over) after they change; without the cache the loop
  # is traced on each call and reads the current ones.
  if not reach.dynamic and not _is_traced((state, values, lower, upper)):
    # An unhashable body or cond raises TypeError: run the loop without the cache.
    with contextlib.suppress(TypeError):
      run = _compiled(plan)
  outside = [
    v for node in reach.nodes for _, v in _compat.iter_graph(node) if isinstance(v, nnx.Variable)
  ]
  before = [_compat.get_raw_value(v) for v in outside]
  loop_name = f"lb.{kind}_loop"
  try:
    state_out, values_out = run(
      state, values, None if static_bounds else lower, None if static_bounds else upper
    )
  except (
    flax_errors.TraceContextError,
    jax.errors.UnexpectedTracerError,
    ForeignTraceError,
  ) as error:
    if not outside:
      raise
    _restore(outside, before)
    raise _closure_write_error(loop_name, reach, error) from error
  except BaseException:  # e.g. a structure error: leave no traced value outside the carry
    _restore(outside, before)
    raise
  if any(_compat.get_raw_value(v) is not b for v, b in zip(outside, before)):
    _restore(outside, before)  # a traced value written outside the carry (flax 0.10)
    raise _closure_write_error(loop_name, reach, None)
  nnx.update(nodes, state_out)
  return _join(plan, nodes, values_out)


def _restore(variables: list[nnx.Variable], raw_values: list[object]) -> None:
  for variable, raw in zip(variables, raw_values):
    if _compat.get_raw_value(variable) is not raw:
      _compat.set_raw_value(variable, raw, check=False)


def while_loop(
  cond_fn: tp.Callable[[T], jax.typing.ArrayLike], body_fn: tp.Callable[[T], T], carry: T
) -> T:
  """`nnx.while_loop` for any carry of NNX modules and arrays, on every supported flax.

  The carry may mix `lb.ToNNX` models, stock and native NNX modules (several different ones,
  shared submodules, the same module twice), Variables, arrays and Python scalars in nested
  tuples/lists/dicts. The caller's modules are updated in place, as with `nnx.while_loop`.
  The check is on structure (GraphDef, paths, shapes, dtypes), not identity: a body that
  assigns a new Variable of the same type and shape is carried (its value is kept).
  Outside a trace the loop is compiled once per body/condition and carry structure and
  reused when the body and condition reach no NNX module or array outside the carry; when
  they do (a closed-over model, a global array), the loop is traced on every call, as
  `nnx.while_loop` is, so it always reads their current values.

  Args:
    cond_fn: `carry -> bool` scalar; the loop runs while it is true.
    body_fn: `carry -> carry`, keeping the carry's structure.
    carry: the initial carry.

  Returns:
    The final carry (its modules are the caller's objects, updated).

  Raises:
    StructureChangeError: the body changes the carry's structure (paths, shapes, dtypes,
      sharing, sow tuples growing); the message is `lb.explain`'s report with the fix. Or
      the body writes to a module outside the carry (put it in the carry).

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import nnx
    >>> model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    >>> def body(carry):
    ...   model, x, n = carry
    ...   return model, model(x), n + 1
    >>> _, y, n = lb.while_loop(lambda c: c[2] < 3, body, (model, jnp.ones((1, 2)), 0))
    >>> int(n), y.shape
    (3, (1, 2))
  """
  return _loop("while", cond_fn, body_fn, carry)


def fori_loop(
  lower: int | np.integer | jax.Array,
  upper: int | np.integer | jax.Array,
  body_fn: tp.Callable[[jax.Array, T], T],
  carry: T,
  *,
  unroll: int | bool | None = None,
) -> T:
  """`nnx.fori_loop` for any carry of NNX modules and arrays, on every supported flax.

  Works where `nnx.fori_loop` of flax 0.10 fails, e.g. two different models in one carry. The
  carry may mix `lb.ToNNX` models, stock and native NNX modules, shared submodules, Variables,
  arrays and Python scalars; the caller's modules are updated in place. With Python-int bounds
  the trip count is static (as in `jax.lax.fori_loop`). Outside a trace the loop is compiled
  once per body and carry structure and reused, unless the body reaches an NNX module or
  array outside the carry (then it is traced on every call and reads their current values,
  as `nnx.fori_loop` does). As for `while_loop`, the check is on structure, not Variable
  identity.

  Args:
    lower: first index (inclusive).
    upper: last index (exclusive).
    body_fn: `(i, carry) -> carry`, keeping the carry's structure.
    carry: the initial carry.
    unroll: as for `jax.lax.fori_loop`.

  Returns:
    The final carry (its modules are the caller's objects, updated).

  Raises:
    StructureChangeError: the body changes the carry's structure (the message is
      `lb.explain`'s report with the fix), or writes to a module outside the carry.

  Examples:
    >>> import jax, loopbridge as lb
    >>> from flax import nnx
    >>> model = nnx.Linear(2, 2, rngs=nnx.Rngs(jax.random.PRNGKey(0)))
    >>> model2 = nnx.Linear(2, 2, rngs=nnx.Rngs(jax.random.PRNGKey(1)))
    >>> out = lb.fori_loop(0, 10, lambda i, x: x, (model, model2))
    >>> out[0] is model and out[1] is model2
    True
  """
  return _loop("fori", None, body_fn, carry, lower, upper, unroll)
