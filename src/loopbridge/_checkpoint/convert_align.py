"""Which Linen variable goes into which NNX Variable: found by running both models once.

A *unit* is one module that owns variables, in one layer: Linen `Dense_0`, or layer 2 of an
`nn.scan` stack's `Dense_0`; NNX `proj`, or layer 2 of an `nnx.vmap`-stacked `blocks.lin`.
Both models run once abstractly (`jax.eval_shape`, nothing is computed or updated) while every
module call is logged with the variables the module sees *inside* the call. Inside `nn.scan` /
`nnx.scan` a module sees one layer, so comparing those shapes with the stored ones tells which
units are stacks and along which axis (Linen `variable_axes`), without reading any transform.

The units of each side, expanded layer by layer in call order, are then paired: first the
ones `mapping=` names, then by equal path, then by call order among units with the same
parameter shapes. A unit left unpaired on either side is an error listing it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.linen import meta as linen_meta

from .. import _compat
from .._core.errors import CheckpointError
from .._core.site import linen_key

# (collection, *module path, variable name): one stored array on either side.
Key = tuple[str, ...]
# (collection, variable name): one variable of one unit.
LeafName = tuple[str, str]
Shape = tuple[int, ...]
# One stored array (numpy when read from some checkpoints).
Value = jax.Array | np.ndarray

# Values that are not model state: recorded activations, rng streams.
_SKIPPED_COLLECTIONS = frozenset({"intermediates"})


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One variable of a unit: its per-layer shape and dtype, and where its layer axis is."""

  shape: Shape
  dtype: jnp.dtype
  axis: int | None  # layer axis of the stored array; None: one array for the unit


@dataclasses.dataclass(frozen=True)
class Unit:
  """One module that owns variables, in one layer (`layer` is None outside stacks)."""

  path: tuple[str, ...]
  layer: int | None
  leaves: dict[LeafName, Leaf]

  @property
  def name(self) -> str:
    where = "/".join(self.path) or "<root>"
    return where if self.layer is None else f"{where}[layer {self.layer}]"

  def signature(self) -> tuple[tuple[str, Shape], ...]:
    return tuple(sorted((col, leaf.shape) for (col, _), leaf in self.leaves.items()))

  def describe(self) -> str:
    inner = ", ".join(
      f"{col}/{name} {leaf.dtype}{list(leaf.shape)}"
      for (col, name), leaf in sorted(self.leaves.items())
    )
    return f"`{self.name}` ({inner})"


@dataclasses.dataclass(frozen=True)
class Pair:
  """A Linen unit, the NNX unit that holds the same numbers, and how they were paired."""

  linen: Unit
  nnx: Unit
  how: str  # "mapping", "name" or "order"
  leaves: tuple[tuple[LeafName, LeafName], ...]


# --- logging the calls ----------------------------------------------------------------------


@dataclasses.dataclass
class _Call:
  entry: int
  inside: dict[LeafName, tuple[Shape, jnp.dtype]]


def _remember(log: dict[tuple[str, ...], _Call], path: tuple[str, ...]) -> _Call:
  if path not in log:
    log[path] = _Call(len(log), {})
  return log[path]


def _linen_calls(
  module: nn.Module,
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> tuple[dict[tuple[str, ...], _Call], dict[Key, jax.ShapeDtypeStruct]]:
  """Every Linen module call of one abstract `init`, and the variables `init` stores."""
  log: dict[tuple[str, ...], _Call] = {}

  def interceptor(next_fun, args, kwargs, context):
    scope = context.module.scope
    if scope is None:
      return next_fun(*args, **kwargs)
    call = _remember(log, tuple(str(p) for p in scope.path))
    out = next_fun(*args, **kwargs)
    # Read after the call: the call creates the variables. Inside nn.scan, one layer's view.
    for col, tree in linen_meta.unbox(context.module.variables).items():
      for name, value in tree.items():
        if not isinstance(value, tp.Mapping) and col not in _SKIPPED_COLLECTIONS:
          call.inside.setdefault((col, name), (tuple(value.shape), jnp.dtype(value.dtype)))
    return out

  key = jax.random.key(0)
  rngs = {"params": key, "dropout": key}
  try:
    with nn.intercept_methods(interceptor):
      stored = jax.eval_shape(
        lambda: module.init(rngs, *sample_args, method=method, **(sample_kwargs or {}))
      )
  except Exception as e:
    raise CheckpointError(
      f"running the Linen module {type(module).__name__} on the sample arguments failed "
      f"({type(e).__name__}: {e}). Pass the arguments a forward call takes (e.g. one batch)."
    ) from e
  return log, tp.cast(dict[Key, jax.ShapeDtypeStruct], flatten(stored))


def flatten(tree: tp.Mapping[str, object], prefix: tuple[str, ...] = ()) -> dict[Key, Value]:
  """Nested Linen variables as `{(collection, *path, name): value}` (boxes removed)."""
  flat: dict[Key, Value] = {}
  for key, value in linen_meta.unbox(tree).items():
    if not prefix and key in _SKIPPED_COLLECTIONS:
      continue
    if isinstance(value, tp.Mapping):
      flat.update(flatten(value, (*prefix, str(key))))
    else:
      flat[(*prefix, str(key))] = tp.cast(Value, value)
  return flat


def unflatten(flat: tp.Mapping[Key, object]) -> dict[str, object]:
  """The inverse of `flatten`: nested plain dicts."""
  tree: dict[str, object] = {}
  for key, value in flat.items():
    node = tree
    for part in key[:-1]:
      node = tp.cast(dict[str, object], node.setdefault(part, {}))
    node[key[-1]] = value
  return tree


# The log of the NNX calls in progress (None outside `_nnx_calls`): the logging subclasses
# below do nothing elsewhere, so a copy escaping the discovery behaves as the original.
_NNX_LOG: contextvars.ContextVar[dict[tuple[str, ...], _Call] | None] = contextvars.ContextVar(
  "loopbridge_convert_nnx_log", default=None
)
_PATH_ATTR = "_loopbridge_convert_path"
_LOGGING_CLASSES: dict[type, type] = {}


def _logging_class(cls: type[nnx.Module]) -> type:
  """A subclass of `cls` whose `__call__` logs the call (made once per class)."""
  if cls not in _LOGGING_CLASSES:

    def __call__(self, *args, **kwargs):
      log = _NNX_LOG.get()
      if log is not None:
        call = _remember(log, getattr(self, _PATH_ATTR))
        for name, value in vars(self).items():
          if isinstance(value, nnx.Variable) and not isinstance(value, nnx.RngState):
            col = _compat.collection_name(type(value))
            array = _compat.variable_value(value)
            if col not in _SKIPPED_COLLECTIONS and hasattr(array, "shape"):
              call.inside.setdefault((col, name), (tuple(array.shape), jnp.dtype(array.dtype)))
      return cls.__call__(self, *args, **kwargs)

    logging_cls = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__})
    _LOGGING_CLASSES[cls] = logging_cls
  return _LOGGING_CLASSES[cls]


def nnx_variables(port: nnx.Module) -> dict[Key, nnx.Variable]:
  """The port's Variables as `{(collection, *path, name): Variable}` (no rng streams)."""
  found: dict[Key, nnx.Variable] = {}
  for path, node in _compat.iter_graph(port):
    if isinstance(node, nnx.Variable) and not isinstance(node, nnx.RngState):
      col = _compat.collection_name(type(node))
      # flax 0.10's layers keep `bias = Param(None)` without a bias: nothing to convert.
      if col not in _SKIPPED_COLLECTIONS and _compat.variable_value(node) is not None:
        found[(col, *(str(p) for p in path))] = node
  return found


def _nnx_calls(
  port: nnx.Module,
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> dict[tuple[str, ...], _Call]:
  """Every NNX module call of one abstract forward call of a copy of the port."""
  copy = _compat.clone_graph(port)
  for path, node in _compat.iter_graph(copy):
    if isinstance(node, nnx.Module):
      node.__class__ = _logging_class(type(node))
      # A static attribute: merged copies (inside nnx.scan / nnx.vmap) keep it.
      setattr(node, _PATH_ATTR, tuple(str(p) for p in path))
  graphdef, state = _compat.split_graph(copy)

  def forward(state):
    merged = nnx.merge(graphdef, state)
    getattr(merged, method or "__call__")(*sample_args, **(sample_kwargs or {}))

  log: dict[tuple[str, ...], _Call] = {}
  token = _NNX_LOG.set(log)
  try:
    jax.eval_shape(forward, state)
  except Exception as e:
    raise CheckpointError(
      f"running the NNX port {type(port).__name__} on the sample arguments failed "
      f"({type(e).__name__}: {e}). The port must take the same sample arguments as the Linen "
      "module."
    ) from e
  finally:
    _NNX_LOG.reset(token)
  return log


# --- units ----------------------------------------------------------------------------------


def _layer_axis(stored: Shape, inside: Shape, linen: bool) -> set[int | None]:
  """The axes whose removal turns the stored shape into the shape seen inside the call."""
  if stored == inside:
    return {None}
  if len(stored) != len(inside) + 1:
    return set()
  axes = range(len(stored)) if linen else range(1)  # nnx.vmap stacks: axis 0
  return {a for a in axes if stored[:a] + stored[a + 1 :] == inside}


def _first_axis(axes: set[int | None]) -> int | None:
  return min(axes, key=lambda a: -1 if a is None else a)


@dataclasses.dataclass
class _Module:
  """One module owning variables, before it is expanded into units."""

  entry: int
  path: tuple[str, ...]
  shapes: dict[LeafName, Shape]  # stored
  axes: dict[str, set[int | None]]  # per collection: the layer axes that fit every variable
  depth: int | None = None


def _units(
  calls: dict[tuple[str, ...], _Call],
  stored: tp.Mapping[Key, jax.ShapeDtypeStruct | jax.Array],
  *,
  linen: bool,
) -> list[Unit]:
  """The units of one model, expanded layer by layer, in call order."""
  owned: dict[tuple[str, ...], dict[LeafName, Shape]] = {}
  for key, value in stored.items():
    owned.setdefault(key[1:-1], {})[(key[0], key[-1])] = tuple(value.shape)
  modules: list[_Module] = []
  never_called = len(calls)
  for path, shapes in owned.items():
    call = calls.get(path)
    if call is None:  # never called (or owned by a parent's method): one array per variable
      never_called += 1
    inside = {} if call is None else call.inside
    module = _Module(never_called if call is None else call.entry, path, shapes, {})
    for (col, name), shape in shapes.items():
      here = inside.get((col, name), (shape, None))[0]
      found = _layer_axis(shape, here, linen)
      module.axes[col] = found if col not in module.axes else module.axes[col] & found
      if not module.axes[col]:
        raise CheckpointError(
          f"`{'/'.join((col, *path))}` has stored shapes "
          f"{ {n: list(v) for (c, n), v in shapes.items() if c == col} } that are not one "
          "layer axis away from the shapes its module sees inside its call. Nested scans and "
          "stacks along different axes are not supported; convert the stack with "
          "lb.layers.stack_params / unstack_params first."
        )
    for col, axes in module.axes.items():
      axis = _first_axis(axes)
      if axis is not None:
        module.depth = next(v[axis] for (c, _), v in shapes.items() if c == col)
    modules.append(module)
  modules.sort(key=lambda m: m.entry)

  # A stack's layers run one after the other: its units are ordered layer by layer, at the
  # place of the stack's first call. The stack is the widest module holding only modules
  # stacked to the same depth.
  def stack_root(module: _Module) -> tuple[str, ...]:
    for n in range(1, len(module.path) + 1):
      if all(m.depth == module.depth for m in modules if m.path[:n] == module.path[:n]):
        return module.path[:n]
    return module.path

  def leaves(module: _Module, axes: dict[str, set[int | None]]) -> dict[LeafName, Leaf]:
    made = {}
    for (col, name), shape in module.shapes.items():
      axis = _first_axis(axes[col])
      dtype = jnp.dtype(stored[(col, *module.path, name)].dtype)
      if axis is not None:
        shape = shape[:axis] + shape[axis + 1 :]
      made[(col, name)] = Leaf(shape, dtype, axis)
    return made

  units: list[Unit] = []
  done: set[tuple[str, ...]] = set()
  for module in modules:
    if module.depth is None:
      units.append(Unit(module.path, None, leaves(module, module.axes)))
      continue
    root = stack_root(module)
    if root in done:
      continue
    done.add(root)
    group = [m for m in modules if m.path[: len(root)] == root]
    # One stack stores each collection along one axis (Linen `variable_axes`): where a module's
    # shapes fit several axes (as many layers as a width), the stack's other modules decide.
    shared: dict[str, set[int | None]] = {}
    for m in group:
      for col, axes in m.axes.items():
        shared[col] = axes if col not in shared else shared[col] & axes
    made = [leaves(m, {c: shared[c] or axes for c, axes in m.axes.items()}) for m in group]
    for layer in range(module.depth):
      units.extend(Unit(m.path, layer, ls) for m, ls in zip(group, made))
  return units


def linen_units(
  module: nn.Module,
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> tuple[list[Unit], dict[Key, jax.ShapeDtypeStruct]]:
  """The Linen module's units and the abstract variables its `init` stores."""
  calls, stored = _linen_calls(module, sample_args, sample_kwargs, method)
  return _units(calls, stored, linen=True), stored


def nnx_units(
  port: nnx.Module,
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> list[Unit]:
  """The NNX port's units."""
  calls = _nnx_calls(port, sample_args, sample_kwargs, method)
  stored = {k: _compat.variable_value(v) for k, v in nnx_variables(port).items()}
  return _units(calls, stored, linen=False)


# --- pairing --------------------------------------------------------------------------------


def _under(path: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
  return path[: len(prefix)] == prefix


def _split(text: str) -> tuple[str, ...]:
  return tuple(p for p in text.replace(".", "/").split("/") if p)


def _pair_leaves(lu: Unit, nu: Unit) -> tuple[tuple[LeafName, LeafName], ...] | None:
  """Leaves by equal (collection, name), then in order among equal shapes; None if any is left."""
  pairs = [(k, k) for k in lu.leaves if k in nu.leaves]
  rest_l = [k for k in lu.leaves if k not in nu.leaves]
  rest_n = [k for k in nu.leaves if k not in lu.leaves]
  for k in rest_l:
    match = next(
      (j for j in rest_n if j[0] == k[0] and nu.leaves[j].shape == lu.leaves[k].shape),
      None,
    )
    if match is None:
      return None
    rest_n.remove(match)
    pairs.append((k, match))
  return None if rest_n else tuple(pairs)


def _rel(unit: Unit, prefix: tuple[str, ...]) -> tuple[str, int | None]:
  """The unit's name below `prefix`; an NNX list entry `layers/0` is named like Linen's
  `layers_0`, as `lb.compare` names them."""
  below = (int(p) if p.isdigit() else p for p in unit.path[len(prefix) :])
  return "/".join(linen_key(tuple(below))), unit.layer


_MAPPING_HELP = (
  "Fix: if a port module is built with other widths, dtypes or depth, build it like the Linen "
  "one; if the modules exist on both sides but pair wrongly, pass mapping={{linen_path: "
  "nnx_path}} (module paths joined with '/', e.g. mapping={{'Dense_0': 'proj'}}; a prefix "
  "maps a whole subtree, e.g. {{'ScanBlock_0': 'blocks'}})."
)


def align(
  lunits: list[Unit], nunits: list[Unit], mapping: tp.Mapping[str, str] | None
) -> list[Pair]:
  """Pair every Linen unit with an NNX unit; raise listing whatever stays unpaired."""
  mapping = dict(mapping or {})
  for k, v in mapping.items():
    if not isinstance(k, str) or not isinstance(v, str):
      raise CheckpointError(
        f"mapping={mapping!r}: keys and values are module paths as strings ('a/b'), got "
        f"{k!r}: {v!r}."
      )
    if not any(_under(u.path, _split(k)) for u in lunits):
      raise CheckpointError(
        f"mapping key {k!r} names no Linen module that holds variables; the Linen modules "
        f"are {sorted({'/'.join(u.path) for u in lunits})}."
      )
    if not any(_under(u.path, _split(v)) for u in nunits):
      raise CheckpointError(
        f"mapping value {v!r} names no NNX module that holds Variables; the port's modules "
        f"are {sorted({'/'.join(u.path) for u in nunits})}."
      )
  # Each unit belongs to the longest mapping prefix it is under ('' maps the rest).
  groups = sorted(((_split(k), _split(v)) for k, v in mapping.items()), key=lambda g: -len(g[0]))
  groups.append(((), ()))
  pairs: list[Pair] = []
  free_l, free_n = list(lunits), list(nunits)
  for lp, np_ in groups:
    how = "mapping" if lp or np_ else None
    mine_l = [u for u in free_l if _under(u.path, lp)]
    mine_n = [u for u in free_n if _under(u.path, np_)]
    by_name = {_rel(u, np_): u for u in mine_n}
    for lu in list(mine_l):
      nu = by_name.get(_rel(lu, lp))
      leaves = None if nu is None or nu not in mine_n else _pair_leaves(lu, nu)
      if nu is not None and leaves is not None and lu.signature() == nu.signature():
        pairs.append(Pair(lu, nu, how or "name", leaves))
        mine_l.remove(lu)
        mine_n.remove(nu)
    for lu in list(mine_l):
      for nu in mine_n:
        leaves = _pair_leaves(lu, nu) if lu.signature() == nu.signature() else None
        if leaves is not None:
          pairs.append(Pair(lu, nu, how or "order", leaves))
          mine_l.remove(lu)
          mine_n.remove(nu)
          break
    placed_l = {id(p.linen) for p in pairs}
    placed_n = {id(p.nnx) for p in pairs}
    free_l = [u for u in free_l if id(u) not in placed_l]
    free_n = [u for u in free_n if id(u) not in placed_n]
  if free_l or free_n:
    lines = [f"  Linen {u.describe()}" for u in free_l[:20]]
    lines += [f"  NNX {u.describe()}" for u in free_n[:20]]
    more = max(0, len(free_l) - 20) + max(0, len(free_n) - 20)
    raise CheckpointError(
      "cannot place every variable: these modules found no counterpart with the same "
      "variable names and shapes (matched by path, then by call order and shapes):\n"
      + "\n".join(lines)
      + (f"\n  ... and {more} more" if more else "")
      + "\n"
      + _MAPPING_HELP.format()
    )
  return pairs
