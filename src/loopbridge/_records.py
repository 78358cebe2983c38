"""Reading back and resetting what a model recorded: `recorded`, `counts`, `reset`, `buffers`.

A *recorder* is any graph node holding the two namespaced attributes `loopbridge__buffers` and
`loopbridge__counts` (nested dicts of `Buffer` / `Count` with the same paths, Linen-shaped:
collection first). `lb.ToNNX` is one; other recorders (native NNX modules) can plug in by
holding the same attributes. Called on a recorder, these functions return its Linen-shaped
tree; called on any other module they return one entry per recorder, keyed by its path from
the root. Every module that sows natively is a recorder (see `_recorder`), so the root can be one
and hold recorders below it: its own tree then sits at the top, next to its children's paths.
A native module stacked by `nnx.vmap` keeps its buffers stack axes first (that is how
`nnx.scan` slices a layer); `recorded`/`counts` read them record index first.
"""

from __future__ import annotations

import typing as tp

from flax.nnx import bridge

from . import _buffers, _compat, _recorder
from ._errors import NotDeclaredError
from ._site import SowSite

Model = tp.TypeVar("Model")

_NOT_INITIALIZED = (
  "{what} has not declared its buffers yet, so there is nothing to read. Why: buffers are "
  "created by lb.lazy_init / lb.preallocate from sample inputs. Fix: "
  "lb.lazy_init(model, *sample_args, capacity=N) first."
)


def _describe(path: tuple, node: tp.Any) -> str:
  where = f" at '{'/'.join(map(str, path))}'" if path else ""
  if isinstance(node, bridge.ToNNX):
    return f"lb.ToNNX({type(_compat.linen_module_of(node)).__name__}){where}"
  return f"{type(node).__name__}{where}"


def _map_records(
  model: tp.Any, fn: tp.Callable[[tuple, _buffers.Buffer, _buffers.Count], tp.Any]
) -> dict:
  result: dict = {}
  found = False
  for root_path, recorder in _recorder.iter_recorders(model):
    found = True
    if _recorder.sites_of(recorder) is None:
      raise NotDeclaredError(_NOT_INITIALIZED.format(what=_describe(root_path, recorder)))
    tree: dict = {}
    for path, buffer, count in _recorder.pairs(recorder):
      node = tree
      for key in path[:-1]:
        node = node.setdefault(key, {})
      node[path[-1]] = fn((*root_path, *path), buffer, count)
    _rebuild_pytrees(tree, _recorder.sites_of(recorder) or ())
    if not root_path:  # the root records too (native sows): its tree sits at the top
      result.update(tree)
      continue
    node = result
    for key in root_path[:-1]:
      node = node.setdefault(key, {})
    node[root_path[-1]] = tree
  if not found:
    raise NotDeclaredError(
      f"{type(model).__name__} holds no loopbridge buffers: nothing was declared on it. Why: "
      "buffers are created by lb.lazy_init / lb.preallocate from sample inputs. Fix: wrap "
      "Linen modules with lb.ToNNX and call lb.lazy_init(model, *args, capacity=N), or "
      "lb.preallocate(model, *args, capacity=N) for native NNX sows."
    )
  return result


def _rebuild_pytrees(tree: dict, sites: tp.Sequence[SowSite]) -> None:
  """Put each sown pytree back together from its leaves' entries (one buffer per array leaf).

  The leaves sit under the sow's path keyed by their pytree keys (`{'__call__': {'0': a,
  '1': b}}`); the reader gets the structure that was sown (`{'__call__': (a, b)}`), each leaf
  with the leading record axis, as Linen's `intermediates` would hold it.
  """
  by_sow: dict[tuple[str, ...], list[SowSite]] = {}
  for site in sites:
    if site.treedef is not None:
      by_sow.setdefault(site.sow_key, []).append(site)
  for sow_key, leaves in by_sow.items():
    parent = _recorder.get_nested(tree, sow_key[:-1])
    node = parent.get(sow_key[-1]) if isinstance(parent, dict) else None
    if not isinstance(node, dict):
      continue
    leaves.sort(key=lambda s: s.leaf_index)
    parent[sow_key[-1]] = leaves[0].treedef.unflatten(
      [_recorder.get_nested(node, s.leaf) for s in leaves]
    )


def recorded(model: tp.Any) -> dict:
  """What the model recorded, Linen-shaped: each sow tuple becomes one array, index first.

  For an `lb.ToNNX` the tree is the one `linen.apply(..., mutable=[...])` returns, e.g.
  `{'intermediates': {'x': Array[n, ...], 'ScanBlock_0': {'carry': Array[n, L, ...]}}}`.
  A sown pytree (a block returning `(out, weights)` under `capture_intermediates`, a dict, a
  struct dataclass) reads back as that pytree with a leading `n` axis on every leaf.

  Outside a trace each array holds the `n` values recorded (at most `capacity`), oldest first.
  Inside a trace (jit, loops) shapes must be static, so each array is the whole buffer,
  `(capacity, ...)`, oldest first, with zeros past the count; read `lb.counts(model)` there.

  Args:
    model: an `lb.ToNNX`, or an NNX module holding some (then keyed by path from the root).

  Returns:
    A nested dict of arrays.

  Raises:
    BufferOverflowError: outside a trace, a buffer under `overflow="error"` received more
      values than its capacity.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3)
    >>> for i in range(2):
    ...   _ = model(jnp.full(2, float(i)))
    >>> lb.recorded(model)["intermediates"]["x"].tolist()
    [[0.0, 0.0], [1.0, 1.0]]
  """
  return _map_records(
    model, lambda path, b, c: _buffers.read(*_buffers.flat_view(b, c), "/".join(map(str, path)))
  )


def counts(model: tp.Any) -> dict:
  """How many values each sow site received since the last reset (may exceed capacity).

  Args:
    model: as for `recorded`.

  Returns:
    A nested dict shaped like `recorded(model)` holding int32 scalars.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=1, overflow="drop")
    >>> _ = model(jnp.ones(2)); _ = model(jnp.ones(2))
    >>> int(lb.counts(model)["intermediates"]["x"])
    2
  """
  return _map_records(model, lambda path, b, c: _compat.variable_value(_buffers.flat_view(b, c)[1]))


def buffers(model: tp.Any) -> dict:
  """The raw buffers, `(capacity, *value_shape)` each, shaped like `recorded(model)`.

  Buffers of native modules stacked with `nnx.vmap` are `(*stack, capacity, *value_shape)`.

  Args:
    model: as for `recorded`.

  Returns:
    A nested dict of arrays (no trimming, no reordering).

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=4)
    >>> lb.buffers(model)["intermediates"]["x"].shape
    (4, 2)
  """
  return _map_records(model, lambda path, b, c: _compat.variable_value(b))


def reset(model: Model) -> Model:
  """Set every count back to zero and clear the buffers, in place; shapes never change.

  Usable inside jit and loop bodies (e.g. to record only the last step of each outer step).

  Args:
    model: as for `recorded`.

  Returns:
    `model`.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=4)
    >>> _ = model(jnp.ones(2))
    >>> lb.recorded(lb.reset(model))["intermediates"]["x"].shape
    (0, 2)
  """
  _map_records(model, lambda path, b, c: _buffers.reset(b, c))
  return model
