"""Layer stacks: `stack` equal NNX modules into one, `unstack` them, and view `layer(stacked, i)`.

A *stack* is an ordinary NNX module whose every array has a leading layer axis: the layout
`nnx.vmap`-built stacks have and `nnx.scan(in_axes=0)` consumes.
`lb.layers.layer(stacked, i)` returns
the i-th layer as a module of the layer's own class whose Variables read and write the stack at
`i`, so `i` may be a tracer (inside `nnx.fori_loop` / `lb.fori_loop`).
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx import graph as nnx_graph

from .. import _compat
from .._core import memory as _memory
from .._core import recorder
from .._core.errors import StackError

M = tp.TypeVar("M", bound=nnx.Module)

_INTERNAL_PREFIXES = _compat.NNX_INTERNAL_PREFIXES

_ALTERNATIVES = (
  "Stacking needs every layer to have the same structure, Variable types, shapes and dtypes "
  "(each Variable becomes one array with a leading layer axis). Layers that differ cannot "
  "share a stack; instead:\n"
  "  * keep them in a list and loop in Python (`for layer in layers: x = layer(x)`; under jit "
  "the loop is unrolled, fine for a few layers);\n"
  "  * choose among a few distinct layers with a traced index using `nnx.switch` "
  "(every branch must return the same shape);\n"
  "  * group runs of equal layers and stack each group (e.g. stack the equal-width hidden "
  "layers, keep the input and output layers apart)."
)


def _path_str(path: tp.Sequence[tp.Any]) -> str:
  return "/".join(str(p) for p in path) or "<root>"


def _is_internal(path: tp.Sequence[tp.Any]) -> bool:
  return any(isinstance(p, str) and p.startswith(_INTERNAL_PREFIXES) for p in path)


def _graph_nodes(module: tp.Any) -> list[tuple[tuple[tp.Any, ...], tp.Any]]:
  """(path, node) of every node and static attribute of `module`, library internals excluded."""
  return [(tuple(p), n) for p, n in _compat.iter_graph(module) if not _is_internal(p)]


def variables_by_path(module: tp.Any) -> dict[tuple[tp.Any, ...], nnx.Variable]:
  """Every Variable of `module` (the live objects) keyed by its path, in graph order."""
  return {p: n for p, n in _graph_nodes(module) if isinstance(n, nnx.Variable)}


def _describe_value(value: tp.Any) -> str:
  leaves = jax.tree_util.tree_leaves_with_path(value)
  if not leaves:
    return repr(value)
  parts = []
  for key_path, leaf in leaves:
    shape = ",".join(str(d) for d in np.shape(leaf))
    dtype = getattr(leaf, "dtype", type(leaf).__name__)
    suffix = jax.tree_util.keystr(key_path)
    parts.append(f"{dtype}[{shape}]{suffix}")
  return " ".join(parts)


def _signature(node: tp.Any) -> tuple[str, tp.Any]:
  """What must be equal across layers at one path, and a human description of it."""
  if isinstance(node, nnx.Variable):
    value = _compat.variable_value(node)
    leaves, treedef = jax.tree_util.tree_flatten(value)
    shapes = tuple((np.shape(x), jnp.result_type(x)) for x in leaves)
    metadata = {k: v for k, v in node.get_metadata().items() if not callable(v)}
    key = ("variable", type(node), treedef, shapes, tuple(sorted(metadata.items(), key=str)))
    return (f"{type(node).__name__} {_describe_value(value)}", key)
  if node is None:  # e.g. `bias` of a layer built with use_bias=False
    return ("None", ("static", None))
  if isinstance(node, (nnx.Module, list, tuple, dict)) or nnx_graph.is_node(node):
    return (f"a {type(node).__name__}", ("node", type(node)))
  return (f"static {node!r}", ("static", node))


def _same(a: tp.Any, b: tp.Any) -> bool:
  try:
    return bool(a == b)
  except Exception:  # e.g. arrays held as static attributes: compare by identity
    return a is b


def _first_difference(reference: tp.Any, other: tp.Any) -> tuple[str, str, str] | None:
  """(path, description in reference, description in other) of the first difference, or None.

  Variables and sub-modules are compared before static attributes, so that the message shows
  shapes when shapes differ (a different `in_features` comes with a different kernel shape).
  """
  ref_nodes, other_nodes = dict(_graph_nodes(reference)), dict(_graph_nodes(other))
  order = list(ref_nodes) + [p for p in other_nodes if p not in ref_nodes]
  for statics in (False, True):
    for path in order:
      in_ref, in_other = path in ref_nodes, path in other_nodes
      ref_desc = _signature(ref_nodes[path]) if in_ref else ("nothing", None)
      other_desc = _signature(other_nodes[path]) if in_other else ("nothing", None)
      is_static = any(d is not None and d[0] == "static" for d in (ref_desc[1], other_desc[1]))
      if is_static != statics:
        continue
      if not (in_ref and in_other) or not _same(ref_desc[1], other_desc[1]):
        return _path_str(path), ref_desc[0], other_desc[0]
  return None


def stack(modules: tp.Sequence[M]) -> M:
  """Stack equal NNX modules into one module whose every array has a leading layer axis.

  The result has the layout `nnx.vmap`-built stacks have, so it works with
  `nnx.scan(in_axes=0)`, `lb.layers.scan` and `lb.layers.layer`. Values are copied; Variable types
  and metadata are kept. `lb.layers.unstack` is the exact inverse.

  Args:
    modules: two or more (or one) NNX modules of one class with the same structure, Variable
      types, shapes, dtypes and static attributes.

  Returns:
    A new module of the same class as `modules[0]`; each Variable holds
    `jnp.stack([m.<variable> for m in modules])`.

  Raises:
    StackError: `modules` is empty, holds something other than NNX modules, or two members
      differ; the message names the first differing path with both shapes and the
      alternatives (a Python loop, `nnx.switch`, grouping equal layers).

  Examples:
    >>> import loopbridge as lb
    >>> from flax import nnx
    >>> layers = [nnx.Linear(4, 4, rngs=nnx.Rngs(i)) for i in range(3)]
    >>> stacked = lb.layers.stack(layers)
    >>> stacked.kernel.shape
    (3, 4, 4)
  """
  modules = list(modules)
  if not modules:
    raise StackError("lb.layers.stack got no modules: pass a non-empty list of NNX modules.")
  for index, module in enumerate(modules):
    if not isinstance(module, nnx.Module):
      raise StackError(
        f"lb.layers.stack: item {index} is a {type(module).__name__}, not an NNX module. "
        "Pass a list "
        "of NNX modules (for Linen parameter trees use lb.layers.stack_params)."
      )
  graphdef, first_state = nnx.split(modules[0])
  states = [first_state]
  for index, module in enumerate(modules[1:], start=1):
    difference = _first_difference(modules[0], module)
    other_graphdef, state = nnx.split(module)
    if difference is None and other_graphdef != graphdef:
      difference = ("<graph>", "one graph structure", "another (shared references differ?)")
    if difference is not None:
      path, ref_desc, other_desc = difference
      raise StackError(
        f"lb.layers.stack: layer {index} differs from layer 0 at `{path}`: layer 0 has {ref_desc}, "
        f"layer {index} has {other_desc}.\n{_ALTERNATIVES}"
      )
    states.append(state)
  _refuse_host_records(states[0])
  stacked_state = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)
  stacked = nnx.merge(graphdef, stacked_state)
  recorder.shift_stack_axes(stacked, len(modules))
  return stacked


def _refuse_host_records(state: tp.Any) -> None:
  """Records kept in host memory (memory='host') cannot be stacked: `jnp.stack` would move them
  to the device, the memory they were declared to stay out of."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    if getattr(getattr(leaf, "sharding", None), "memory_kind", None) == _memory.HOST_KIND:
      where = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
      raise StackError(
        f"lb.layers.stack: `{where}` is a record kept in host memory (memory='host'). Why: "
        "stacking moves every array to the device, and a stack's layers write their records in "
        "one vectorized step, which XLA does not offload slot by slot. Fix: declare the layers' "
        "records on the device (the default memory) before stacking them."
      )


def _num_layers(stacked: nnx.Module, what: str) -> int:
  if not isinstance(stacked, nnx.Module):
    raise StackError(
      f"{what} expects a stacked NNX module (from lb.layers.stack or nnx.vmap), got "
      f"{type(stacked).__name__}."
    )
  sizes: dict[int, str] = {}
  for path, variable in variables_by_path(stacked).items():
    for key_path, leaf in jax.tree_util.tree_leaves_with_path(_compat.variable_value(variable)):
      where = _path_str(path) + jax.tree_util.keystr(key_path)
      if np.ndim(leaf) == 0:
        raise StackError(
          f"{what}: `{where}` is a scalar, so this module is not a layer stack (every array of "
          "a stack has a leading layer axis). Build stacks with lb.layers.stack or nnx.vmap."
        )
      sizes.setdefault(np.shape(leaf)[0], where)
  if not sizes:
    raise StackError(f"{what}: the module holds no arrays, so it has no layer axis.")
  if len(sizes) > 1:
    (n1, p1), (n2, p2) = list(sizes.items())[:2]
    raise StackError(
      f"{what}: leading axes disagree (`{p1}` has {n1} layers, `{p2}` has {n2}), so this "
      "module is not a layer stack. Build stacks with lb.layers.stack or nnx.vmap."
    )
  return next(iter(sizes))


def unstack(stacked: M) -> list[M]:
  """Split a stacked module into a list of independent modules, one per layer.

  Exact inverse of `lb.layers.stack` (values, Variable types and metadata); also accepts
  stacks built
  with `nnx.vmap`.

  Args:
    stacked: an NNX module whose every array has the same leading layer axis.

  Returns:
    A list of `n` new modules of the same class; module `i` holds `array[i]` of every array.

  Raises:
    StackError: `stacked` is not an NNX module, holds a scalar, or its arrays disagree on the
      number of layers.

  Examples:
    >>> import loopbridge as lb
    >>> from flax import nnx
    >>> linears = [nnx.Linear(4, 4, rngs=nnx.Rngs(i)) for i in range(3)]
    >>> layers = lb.layers.unstack(lb.layers.stack(linears))
    >>> len(layers), layers[0].kernel.shape
    (3, (4, 4))
  """
  n = _num_layers(stacked, "lb.layers.unstack")
  graphdef, state = nnx.split(stacked)
  layers = [nnx.merge(graphdef, jax.tree.map(lambda leaf, i=i: leaf[i], state)) for i in range(n)]
  for one in layers:
    recorder.shift_stack_axes(one, None)
  return layers


def _set_child(owner: tp.Any, key: tp.Any, value: tp.Any) -> None:
  if isinstance(owner, (list, dict)) or (
    not isinstance(owner, nnx.Module) and hasattr(owner, "__setitem__")
  ):
    owner[key] = value
  else:
    setattr(owner, key, value)


def layer(stacked: M, i: int | jax.Array) -> M:
  """The `i`-th layer of a stack, as a module that reads and writes the stack; `i` may be traced.

  The returned module has the layer's own class (an `nnx.Linear` stack gives an `nnx.Linear`),
  so it is called and inspected like the layer. Each of its Variables is a view of the
  stacked Variable at `i`: reads return `stacked_array[i]`, and every write (an assignment, a
  `BatchNorm` statistics update, a recorded sow) updates `stacked_array[i]` in place. This is
  what makes `layers[i]` with a traced `i` work inside `nnx.fori_loop` / `lb.fori_loop`. The
  view's Variables are instances of subclasses of the original Variable types (`isinstance`
  filters such as `nnx.state(view, nnx.Param)` keep working).

  Args:
    stacked: a stack (from `lb.layers.stack` or `nnx.vmap`).
    i: the layer index: a Python int (checked, negative counts from the end) or an integer
      tracer (like `jax.lax.dynamic_index_in_dim`, out-of-range values are clamped).

  Returns:
    A module of the stack's class viewing layer `i`.

  Raises:
    StackError: `stacked` is not a stack (see `lb.layers.unstack`).
    IndexError: a Python int `i` outside `[-n, n)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import loopbridge as lb
    >>> from flax import nnx
    >>> stacked = lb.layers.stack([nnx.Linear(4, 4, rngs=nnx.Rngs(i)) for i in range(3)])
    >>> def body(i, x):
    ...   return lb.layers.layer(stacked, i)(x)
    >>> nnx.fori_loop(0, 3, body, jnp.ones((1, 4))).shape
    (1, 4)
  """
  n = _num_layers(stacked, "lb.layers.layer")
  if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
    if not -n <= i < n:
      raise IndexError(
        f"lb.layers.layer: layer index {i} is out of range for a stack of {n} layers."
      )
    i = int(i) % n
  else:
    if not isinstance(i, (jax.Array, np.ndarray, np.generic)):  # a tracer is a jax.Array
      raise StackError(
        f"lb.layers.layer: the layer index must be an int or an integer scalar array (a "
        f"traced loop index), got {type(i).__name__} {i!r}. Fix: lb.layers.layer(stack, 1), "
        "or the index of nnx.fori_loop / lb.fori_loop."
      )
    i = jnp.asarray(i)
    if i.ndim != 0 or not jnp.issubdtype(i.dtype, jnp.integer):
      raise StackError(
        f"lb.layers.layer: the layer index must be an integer scalar, got "
        f"{i.dtype}[{','.join(map(str, i.shape))}]."
      )
  graphdef, state = nnx.split(stacked)
  view = nnx.merge(
    graphdef,
    jax.tree.map(lambda leaf: jax.lax.dynamic_index_in_dim(leaf, i, 0, keepdims=False), state),
  )
  parents = variables_by_path(stacked)
  nodes = dict(_graph_nodes(view))
  for path, snapshot in variables_by_path(view).items():
    name = path[-1]
    owner = nodes[path[:-1]] if len(path) > 1 else view
    _set_child(owner, name, _compat.layer_view_variable(parents[path], i, snapshot))
  return view
