"""Walking, splitting and cloning NNX graphs (flax 0.12 added the `graph=` switch)."""

from __future__ import annotations

import inspect
import typing as tp

from flax import nnx

Node = tp.TypeVar("Node")


# flax's own per-instance bookkeeping attributes on every NNX module (not graph data):
# `_object__...` up to flax 0.11.0, `_pytree__...` from 0.11.1 on.
NNX_INTERNAL_PREFIXES = ("_pytree__", "_object__")


def iter_graph(node: tp.Any) -> tp.Iterator[tuple[tuple[tp.Any, ...], tp.Any]]:
  """(path, node) for every node of an NNX graph, following shared references once.

  flax 0.12's `nnx.iter_graph` takes `graph=` (tree mode would refuse shared references);
  0.10's has graph semantics only.
  """
  if _ITER_GRAPH_TAKES_GRAPH:
    return nnx.iter_graph(node, graph=True)
  return nnx.iter_graph(node)


_ITER_GRAPH_TAKES_GRAPH = "graph" in inspect.signature(nnx.iter_graph).parameters


# --- loop carries (lb.while_loop, lb.fori_loop, lb.explain) -----------------------------------
_SPLIT_TAKES_GRAPH = "graph" in __import__("inspect").signature(nnx.split).parameters


def split_graph(node: tp.Any) -> tuple[tp.Any, tp.Any]:
  """`nnx.split` with graph semantics: a shared Variable or module is split once and merged back
  shared.

  flax 0.12's `split` takes `graph=` and otherwise follows the configured mode (tree mode
  refuses shared references, and a tree-mode transform may set it); 0.10 has graph mode only.
  """
  if _SPLIT_TAKES_GRAPH:
    return nnx.split(node, graph=True)
  return nnx.split(node)


def graph_children(node: tp.Any) -> dict[tp.Any, tp.Any]:
  """A graph node's children (attributes, or dict/list/tuple entries) without NNX bookkeeping.

  flax 0.12 Pytrees also list `_pytree__state` and `_pytree__nodes`; 0.10 Objects list
  `_object__state`.
  """
  from flax.nnx import graph as graph_lib  # same module and API name in 0.10 and 0.12

  impl = graph_lib.get_node_impl(node)
  if impl is None:
    raise TypeError(f"{type(node).__name__} is not an NNX graph node")
  children = impl.node_dict(node)
  return {
    k: v
    for k, v in children.items()
    if not (isinstance(k, str) and k.startswith(NNX_INTERNAL_PREFIXES))
  }


_CLONE_TAKES_GRAPH = "graph" in __import__("inspect").signature(nnx.clone).parameters


def clone_graph(node: Node) -> Node:
  """A copy of an NNX graph with new Variables (shared references kept shared), arrays shared.

  flax 0.12's `nnx.clone` takes `graph=` (tree mode would refuse shared references); its
  `split`/`merge` round trip keeps the *same* Variables, so it is no copy. flax 0.10's
  `nnx.clone` has graph semantics only and creates new Variables.
  """
  if _CLONE_TAKES_GRAPH:
    return nnx.clone(node, graph=True)
  return nnx.clone(node)
