"""Which Linen variable goes into which NNX Variable: found by running both models once.

A *unit* is one module that owns variables, in one layer: Linen `Dense_0`, or layer 2 of an
`nn.scan` stack's `Dense_0`; NNX `proj`, or layer 2 of an `nnx.vmap`-stacked `blocks.lin`.
Both models run once abstractly (`jax.eval_shape`, nothing is computed or updated) while every
module call is logged with the variables the module sees *inside* the call. Inside `nn.scan` /
`nnx.scan` a module sees one layer, so comparing those shapes with the stored ones tells which
units are stacks and which axes can be their layer axis.

A Linen `nn.scan` stack's layer axis is read from the `variable_axes` it was made with; where
that cannot be read and the stored shapes fit several axes (as many layers as a width), every
fitting axis stays a candidate (`Unit.axis_options`) and running the models decides
(`convert_evidence`).
The pairing of units is `convert_match`'s job. Value-less Variables (flax 0.10's
`nnx.Linear(use_bias=False)` keeps `bias = nnx.Param(None)`) hold nothing and are skipped.
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

# (collection, *module path, variable name): one stored array on either side.
Key = tuple[str, ...]
# (collection, variable name): one variable of one unit.
LeafName = tuple[str, str]
Shape = tuple[int, ...]
# One stored array (numpy when read from some checkpoints).
Value = jax.Array | np.ndarray

# Values that are not model state: recorded activations, rng streams, and decode caches
# (Linen's `cache` collection, `nnx.Cache`): per-sequence state each side sizes by its own
# init on the full length, often in its own layout, which a plain sample call never reads,
# so no evidence could check a pairing. Each side keeps its own; neither is converted, but
# where the sample call is a decode step (the Linen call creates a `cache` and one is given:
# flax's `has_variable('cache', ...)` idiom), the given cache is state that call reads, so it
# is converted and checked like the rest (`CACHE`).
SKIPPED_COLLECTIONS = frozenset({"intermediates", "cache"})
CACHE = "cache"


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
  # The Linen stack this unit belongs to, and per collection the layer axes that fit its
  # stored shapes when more than one does (the leaves carry the first; evidence decides).
  stack: tuple[str, ...] | None = None
  axis_options: tuple[tuple[str, tuple[int, ...]], ...] = ()

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


# --- logging the calls ----------------------------------------------------------------------


@dataclasses.dataclass
class _Call:
  entry: int
  inside: dict[LeafName, tuple[Shape, jnp.dtype]]
  module: object = None  # Linen: the module unbound (applied alone by the evidence check)
  # Linen `nn.scan` / `nn.vmap` modules: the layer axis per collection, as declared.
  variable_axes: dict[str, int] | None = None


def _remember(log: dict[tuple[str, ...], _Call], path: tuple[str, ...]) -> _Call:
  if path not in log:
    log[path] = _Call(len(log), {})
  return log[path]


def _linen_calls(
  module: nn.Module,
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> tuple[dict[tuple[str, ...], _Call], dict[Key, jax.ShapeDtypeStruct], set[str]]:
  """Every Linen module call of one abstract `init`, the variables `init` stores (no
  skipped collection) and the collections it creates."""
  log: dict[tuple[str, ...], _Call] = {}
  pending: list[tuple[str | None, dict[str, int]]] = []

  def interceptor(next_fun, args, kwargs, context):
    scope = context.module.scope
    if scope is None:
      return next_fun(*args, **kwargs)
    # A lifted `nn.scan` module is intercepted (under another method name, in a scope of its
    # own) just before the module it wraps, which has its name: the declared axes go there.
    declared = _compat.linen_variable_axes(context.module)
    if declared is not None:
      pending[:] = [(context.module.name, declared)]
      return next_fun(*args, **kwargs)
    path = tuple(str(p) for p in scope.path)
    call = _remember(log, path)
    if call.module is None and context.method_name == "__call__":
      call.module = context.module.clone(parent=None)
    if pending and path[-1:] == (pending[0][0],):
      call.variable_axes = pending.pop()[1]
    out = next_fun(*args, **kwargs)
    # Read after the call: the call creates the variables. Inside nn.scan, one layer's view.
    for col, tree in linen_meta.unbox(context.module.variables).items():
      for name, value in tree.items():
        if (
          not isinstance(value, tp.Mapping)
          and col not in SKIPPED_COLLECTIONS
          and hasattr(value, "shape")  # not the axis names `param_with_axes` stores
        ):
          call.inside.setdefault((col, name), (tuple(value.shape), jnp.dtype(value.dtype)))
    return out

  key = jax.random.key(0)
  rngs = {"params": key, "dropout": key}
  try:
    with nn.intercept_methods(interceptor):
      stored = jax.eval_shape(
        lambda: nn.Module.init(module, rngs, *sample_args, method=method, **(sample_kwargs or {}))
      )
  except Exception as e:
    raise CheckpointError(
      f"running the Linen module {type(module).__name__} on the sample arguments failed "
      f"({type(e).__name__}: {e}). Pass the arguments a forward call takes (e.g. one batch)."
    ) from e
  return log, tp.cast(dict[Key, jax.ShapeDtypeStruct], flatten(stored)), set(stored)


def flatten(
  tree: tp.Mapping[str, object], prefix: tuple[str, ...] = (), keep: tp.Container[str] = ()
) -> dict[Key, Value]:
  """Nested Linen variables as `{(collection, *path, name): value}` (boxes removed; the
  skipped collections left out but those in `keep`)."""
  flat: dict[Key, Value] = {}
  for key, value in linen_meta.unbox(tree).items():
    if not prefix and key in SKIPPED_COLLECTIONS and key not in keep:
      continue
    if not prefix and not jax.tree_util.tree_leaves(value):
      # A collection without a single array holds no variable to convert:
      # `flax.linen.partitioning.param_with_axes` (flaxformer, t5x) stores axis names in
      # `params_axes` as `AxisMetadata` leaves. (Deeper, an array-less leaf is an optax
      # placeholder, `MaskedNode()`, and is kept.)
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
            if col not in SKIPPED_COLLECTIONS and hasattr(array, "shape"):
              call.inside.setdefault((col, name), (tuple(array.shape), jnp.dtype(array.dtype)))
      return cls.__call__(self, *args, **kwargs)

    logging_cls = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__})
    _LOGGING_CLASSES[cls] = logging_cls
  return _LOGGING_CLASSES[cls]


def nnx_variables(port: nnx.Module, cache: bool = False) -> dict[Key, nnx.Variable]:
  """The port's Variables as `{(collection, *path, name): Variable}` (no rng streams; its
  decode caches only with `cache`)."""
  found: dict[Key, nnx.Variable] = {}
  keep = (CACHE,) if cache else ()
  for path, node in _compat.iter_graph(port):
    if isinstance(node, nnx.Variable) and not isinstance(node, nnx.RngState):
      col = _compat.collection_name(type(node))
      skipped = col in SKIPPED_COLLECTIONS and col not in keep
      # A value-less Param (flax 0.10: `nnx.Linear(use_bias=False).bias`) holds nothing.
      if not skipped and _compat.variable_value(node) is not None:
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
    # The axis the Linen transform declares (`variable_axes`), where it can be read and fits
    # the shapes; otherwise every fitting axis stays a candidate for the evidence.
    declared = next(
      (
        c.variable_axes
        for p, c in sorted(calls.items(), key=lambda kv: -len(kv[0]))
        if c.variable_axes and module.path[: len(p)] == p
      ),
      {},
    )
    for col, axis in declared.items():
      if axis in shared.get(col, set()):
        shared[col] = {axis}
    made = [leaves(m, {c: shared[c] or axes for c, axes in m.axes.items()}) for m in group]
    options = tuple(
      (col, tuple(sorted(tp.cast(set[int], axes))))
      for col, axes in sorted(shared.items())
      if len(axes) > 1 and None not in axes and linen
    )
    for layer in range(module.depth):
      units.extend(Unit(m.path, layer, ls, root, options) for m, ls in zip(group, made))
  return units


def linen_units(
  module: nn.Module,
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
  cache: tp.Mapping[str, object] | None = None,
) -> tuple[list[Unit], dict[Key, jax.ShapeDtypeStruct], dict[tuple[str, ...], nn.Module]]:
  """The Linen module's units, the abstract variables its `init` stores, and each called
  module unbound by path (to apply one alone). A given decode `cache` joins them when the
  call creates one (a decode step reads it), with the given shapes (sized by an `init` on
  the full length, not by this call's)."""
  calls, stored, created = _linen_calls(module, sample_args, sample_kwargs, method)
  if cache is not None and CACHE in created:
    given = flatten({CACHE: cache}, keep=(CACHE,))
    stored.update({k: jax.ShapeDtypeStruct(np.shape(v), v.dtype) for k, v in given.items()})
  modules = {p: tp.cast(nn.Module, c.module) for p, c in calls.items() if c.module is not None}
  return _units(calls, stored, linen=True), stored, modules


def nnx_units(
  port: nnx.Module,
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
  cache: bool = False,
) -> list[Unit]:
  """The NNX port's units (its decode caches among them with `cache`)."""
  calls = _nnx_calls(port, sample_args, sample_kwargs, method)
  stored = {k: _compat.variable_value(v) for k, v in nnx_variables(port, cache).items()}
  return _units(calls, stored, linen=False)
