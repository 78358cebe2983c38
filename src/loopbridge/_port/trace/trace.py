"""What source alone cannot tell: one abstract Linen `init` of the root on each call to port.

Per module instance (by path): its class and field values, the inputs of its first call of
each method, the variables it holds itself, and the line of the user's code that called it
first (which, for an inline `nn.Dense(4)(x)`, is the construction that made it). Input widths,
which construction made which submodule and how many a loop made all come from here.
"""

from __future__ import annotations

import dataclasses
import sys
import typing as tp

import jax
from flax import linen as nn
from flax.core import meta

from ..errors import PortError, trace_defect, trace_failed

# Frames of these packages sit between a module call and the user's line that made it.
_LIBRARY_PREFIXES = ("flax", "jax", "loopbridge", "contextlib", "functools", "typing")


@dataclasses.dataclass
class Instance:
  """One Linen module instance seen in the trace."""

  path: tuple[str, ...]
  cls: type
  module: nn.Module
  inputs: dict[str, tuple[tuple[object, ...], dict[str, object]]]  # method -> (args, kwargs)
  variables: dict[tuple[str, str], object]  # (collection, name) -> abstract value (boxes kept)
  called_at: tuple[str, int] | None  # (file, line) of the user's code that called it first
  lifts: tuple[str, ...] = ()  # Linen lifted transforms around its class, outermost first
  config: int = 0  # 0: the user's configuration; k: the k-th derived one (`configs.py`)

  def field_values(self) -> dict[str, object]:
    return {
      f.name: getattr(self.module, f.name)
      for f in dataclasses.fields(self.module)
      if f.name not in ("parent", "name")
    }

  def width(self, method: str = "__call__", arg: int = 0, axis: int = -1) -> int | None:
    """The size of `axis` of the first call's argument `arg` (None when unknown)."""
    call = self.inputs.get(method)
    if call is None or len(call[0]) <= arg:
      return None
    shape = getattr(call[0][arg], "shape", None)
    if not shape:
      return None
    return size(shape[axis])


def size(dim: object) -> int:
  """An axis size as an int; a symbolic size (`tracing/symbolic.py`) stays an expression of
  the settings, so a width read from a call's shape is one in the symbolic trace too."""
  from jax import export  # an attribute of `jax` only once imported, on older jax

  found: tp.Any = dim
  return tp.cast(int, found) if export.is_symbolic_dim(found) else int(found)


@dataclasses.dataclass
class Trace:
  """Every instance, in the order first called, keyed by path."""

  instances: dict[tuple[str, ...], Instance]

  def children(self, path: tuple[str, ...]) -> list[Instance]:
    return [i for p, i in self.instances.items() if len(p) == len(path) + 1 and p[:-1] == path]

  def of_class(self, cls: type) -> list[Instance]:
    return [i for i in self.instances.values() if i.cls is cls]


def unlifted(cls: type) -> tuple[type, tuple[str, ...]]:
  """The user's class under the subclasses Linen lifts make (`nn.remat(Block)`); the lifts."""
  lifts: list[str] = []
  while cls.__module__.startswith("flax.linen.transforms") and len(cls.__bases__) == 1:
    lifts.append(cls.__name__)
    cls = cls.__bases__[0]
  return cls, tuple(lifts)


def _abstract(tree: object) -> object:
  # Arrays only: a `Mesh` argument (MaxText) has a `shape` and no dtype, and stays as it is.
  return jax.tree.map(
    lambda a: (
      jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") and hasattr(a, "dtype") else a
    ),
    tree,
  )


class _Defect(Exception):
  """The trace's own bookkeeping failed (not the user's model): reported as the drafter's."""


def _user_line() -> tuple[str, int] | None:
  frame = sys._getframe(2)
  while frame is not None:
    name = frame.f_globals.get("__name__", "")
    if name.split(".")[0] not in _LIBRARY_PREFIXES:
      return frame.f_code.co_filename, frame.f_lineno
    frame = frame.f_back
  return None


def rng_streams(streams: tp.Iterable[str]) -> dict[str, jax.Array]:
  """One key per stream the model may draw (`params`, `dropout` and the named ones)."""
  names = {"params", "dropout", *streams}
  return {name: jax.random.fold_in(jax.random.key(0), i) for i, name in enumerate(sorted(names))}


def trace(
  module: nn.Module,
  calls: tp.Sequence[tuple[str | None, tuple[tp.Any, ...], dict[str, tp.Any]]],
  streams: tp.Iterable[str] = (),
  config: int = 0,
) -> Trace:
  """Run an abstract `init` for each `(method, args, kwargs)` and record every module."""
  instances: dict[tuple[str, ...], Instance] = {}

  def interceptor(next_fun, args, kwargs, context):
    mod = context.module
    scope = mod.scope
    if scope is None or context.method_name == "setup":
      return next_fun(*args, **kwargs)
    try:
      path = tuple(str(p) for p in scope.path)
      inst = instances.get(path)
      if inst is None:
        cls, lifts = unlifted(type(mod))
        inst = instances[path] = Instance(path, cls, mod, {}, {}, _user_line(), lifts, config)
      inst.inputs.setdefault(context.method_name, (_abstract(args), _abstract(kwargs)))  # pyright: ignore[reportArgumentType]
    except Exception as e:
      raise _Defect(e) from e
    out = next_fun(*args, **kwargs)
    for col, tree in mod.variables.items():
      for name, value in tree.items():
        if not isinstance(value, tp.Mapping):
          inst.variables.setdefault((col, name), value)
    return out

  rngs = rng_streams(streams)
  for method, args, kwargs in calls:
    try:
      with nn.intercept_methods(interceptor):
        _abstract_init(module, rngs, method, args, kwargs)
    except PortError:
      raise
    except _Defect as e:
      cause = tp.cast(BaseException, e.__cause__)
      raise PortError(trace_defect(type(module), cause)) from cause
    except Exception as e:
      raise PortError(trace_failed(type(module), e)) from e
  return Trace(instances)


def _abstract_init(module: nn.Module, rngs, method, args, kwargs) -> None:
  """`init` under `jax.eval_shape`. Arrays stay closed over (a model may read their values in
  Python); a `ShapeDtypeStruct` argument (symbolic shapes, `tracing/symbolic.py`) is an
  argument of the abstract call."""
  leaves, tree = jax.tree.flatten((args, kwargs))
  at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.ShapeDtypeStruct)]

  def run(*abstract):
    full = list(leaves)
    for i, value in zip(at, abstract):
      full[i] = value
    a, k = jax.tree.unflatten(tree, full)
    return nn.Module.init(module, rngs, *a, method=method, **k)

  jax.eval_shape(run, *(leaves[i] for i in at))


def unboxed_shape(value: object) -> tuple[int, ...]:
  return tuple(meta.unbox(value).shape)  # pyright: ignore[reportAttributeAccessIssue]
