"""`lb.explain`'s snapshot of a loop carry: every path through its pytree and the NNX graphs it
holds, with each node's kind, type, shape/dtype, identity and the kind of module owning it."""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
from flax import nnx
from flax.nnx import bridge
from flax.nnx import graph as graph_lib

from .. import _compat
from .._core.bridge_settings import is_bridge

# Kinds of snapshot items: graph objects (modules, Rngs), pytree containers (dict/list/tuple),
# Variables, arrays, and static (non-array) attributes.
_MODULE, _CONTAINER, _VARIABLE = "module", "container", "variable"
_ARRAY, _STATIC = "array", "static"

# Owner flavors: which kind of module holds a path (chooses the fix we suggest).
_LB, _BRIDGE, _NNX = "lb.ToNNX", "flax.nnx.bridge.ToNNX", "nnx"


def is_graph_object(x: object) -> bool:
  """A Variable or an NNX graph node (module, Rngs, ...): split as graph, not as a pytree."""
  return isinstance(x, nnx.Variable) or graph_lib.is_graph_node(x)


def is_array_like(x: object) -> bool:
  """A value a JAX loop can carry: an array (or tracer) or a Python/NumPy scalar."""
  return (hasattr(x, "shape") and hasattr(x, "dtype")) or isinstance(x, (bool, int, float, complex))


# ----------------------------------------------------------------------------- snapshots
@dataclasses.dataclass
class _Item:
  path: str
  parent: str | None
  kind: str
  type_name: str
  owner: str
  ident: int | None = None  # modules and Variables: object identity
  shape: tuple[int, ...] | None = None
  dtype: str | None = None
  tuple_len: int | None = None  # a Variable holding a tuple: how sows store their values
  static: object = None


class _Snapshot:
  """Every path of a carry (through its NNX graphs) with its kind, type, shape/dtype, identity."""

  def __init__(self) -> None:
    self.items: dict[str, _Item] = {}
    self.paths_of: dict[int, list[str]] = {}
    self._alive: list[object] = []  # keeps objects alive so their ids stay unique
    self.treedef: tp.Any = None

  def note(self, obj: object, path: str) -> bool:
    """Record that `obj` is reachable at `path`; True the first time it is seen."""
    paths = self.paths_of.setdefault(id(obj), [])
    paths.append(path)
    if len(paths) == 1:
      self._alive.append(obj)
      return True
    return False

  def counts(self) -> dict[str, int]:
    """How many distinct modules and Variables, and how many arrays, the snapshot holds."""
    out = {"modules": 0, "variables": 0, "arrays": 0}
    for item in self.items.values():
      first = item.ident is not None and self.paths_of[item.ident][0] == item.path
      if item.kind == _MODULE and first:
        out["modules"] += 1
      elif item.kind == _VARIABLE and first:
        out["variables"] += 1
      elif item.kind == _ARRAY:
        out["arrays"] += 1
    return out


def _flavor(module: object) -> str:
  if is_bridge(module):
    return _LB
  if isinstance(module, bridge.ToNNX):
    return _BRIDGE
  return _NNX


def _key_text(node: object, key: object) -> str:
  if isinstance(node, (dict, list, tuple)) or not (isinstance(key, str) and key.isidentifier()):
    return f"[{key!r}]"
  return f".{key}"


def _aval(x: tp.Any) -> tuple[tuple[int, ...], str]:
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return tuple(x.shape), str(x.dtype)
  return (), str(jax.dtypes.result_type(x))


def _leaf_item(leaf: object, path: str, parent: str | None, owner: str) -> _Item:
  if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
    shape, dtype = _aval(leaf)
    return _Item(path, parent, _ARRAY, type(leaf).__name__, owner, shape=shape, dtype=dtype)
  return _Item(path, parent, _STATIC, type(leaf).__name__, owner, static=leaf)


def _walk(snap: _Snapshot, obj: object, path: str, parent: str | None, owner: str) -> None:
  if isinstance(obj, nnx.Variable):
    item = _Item(path, parent, _VARIABLE, type(obj).__name__, owner, ident=id(obj))
    snap.items[path] = item
    if not snap.note(obj, path):
      return
    value = _compat.variable_value(obj)
    if isinstance(value, tuple):
      item.tuple_len = len(value)
    for keypath, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
      if not keypath:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
          item.shape, item.dtype = _aval(leaf)
        else:
          item.static = leaf
        continue
      sub = path + jax.tree_util.keystr(keypath)
      snap.items[sub] = _leaf_item(leaf, sub, path, owner)
    return
  if graph_lib.is_graph_node(obj) or graph_lib.is_node(obj):
    is_object = graph_lib.is_graph_node(obj)  # modules are objects; dicts/lists/tuples are not
    snap.items[path] = _Item(
      path,
      parent,
      _MODULE if is_object else _CONTAINER,
      type(obj).__name__,
      owner,
      ident=id(obj) if is_object else None,
    )
    if is_object:
      owner = _flavor(obj)
      if not snap.note(obj, path):
        return  # a shared reference: its contents are listed under its first path
    children = _compat.graph_children(obj)
    if not is_object:
      snap.items[path].tuple_len = _compat.stock_sow_tuple_length(obj, children)
    for key, child in children.items():
      _walk(snap, child, path + _key_text(obj, key), path, owner)
    return
  snap.items[path] = _leaf_item(obj, path, parent, owner)


def snapshot(carry: object) -> _Snapshot:
  """A snapshot of `carry`: every path through its pytree and the NNX graphs it holds."""
  snap = _Snapshot()
  leaves, snap.treedef = jax.tree_util.tree_flatten_with_path(carry, is_leaf=is_graph_object)
  for keypath, leaf in leaves:
    _walk(snap, leaf, "carry" + jax.tree_util.keystr(keypath), None, _NNX)
  return snap
