"""Reading back and resetting what a model recorded: `recorded`, `counts`, `reset`, `buffers`.

A *recorder* is any graph node holding the namespaced attributes `loopbridge__buffers` (a nested
dict of `Buffer`s, Linen-shaped: collection first) and `loopbridge__counts` (one `Count` vector, an
entry per site; read back per site, shaped like the buffers). `lb.ToNNX` is one; other recorders
(native NNX modules) can plug in by holding the same attributes. Called on a recorder, these
functions return its Linen-shaped tree; called on any other module they return one entry per
recorder, keyed by its path from the root. Every module that sows natively is a recorder (see
`recorder`), so the root can be one and hold recorders below it: its own tree then sits at the top,
next to its children's paths. A native module stacked by `nnx.vmap` keeps its buffers stack axes
first (that is how `nnx.scan` slices a layer); `recorded`/`counts` read them record index first.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
from flax.nnx import bridge

from .. import _compat
from . import buffers as _buffers
from . import recorder as _recorder
from .errors import NotDeclaredError
from .site import SowSite, split_slot

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


_UNKNOWN_SIGNATURE = (
  "signature={signature!r} names no call signature declared on {what}; its signatures: "
  "{labels}. Why: a signature is named by the call it was declared for (its method and the "
  "shapes of its arguments, e.g. '(float32[2,1,32])'). Fix: pass one of those labels, or "
  "signature=None for every signature."
)


def _map_records(
  model: tp.Any,
  fn: tp.Callable[[tuple, _buffers.Buffer, jax.Array], tp.Any],
  signature: str | None = None,
) -> dict:
  """`fn(path from the root, buffer, the site's count)` per site, Linen-shaped (see `recorded`)."""
  result: dict = {}
  found = False
  labels_seen: list[str] = []
  for root_path, recorder in _recorder.iter_recorders(model):
    found = True
    sites = _recorder.sites_of(recorder)
    if sites is None:
      raise NotDeclaredError(_NOT_INITIALIZED.format(what=_describe(root_path, recorder)))
    by_slot: dict[int, dict] = {}
    counts: dict[tuple[int, tuple[str, ...]], jax.Array] = {}
    vector = _recorder.counts_of(recorder)
    for path, buffer, index in _recorder.pairs(recorder):
      assert vector is not None  # a recorder with a buffer has its Count vector
      count = _buffers.site_count(vector, index)
      slot, key = split_slot(path)
      _recorder.set_nested(by_slot.setdefault(slot, {}), key, fn((*root_path, *key), buffer, count))
      counts[slot, key] = count
    for slot, tree in by_slot.items():
      _rebuild_pytrees(tree, [s for s in sites if s.slot == slot])
    labels = _slot_labels(sites)
    labels_seen.extend(labels.values())
    if signature is not None:
      chosen = [slot for slot, name in labels.items() if name == signature]
      if not chosen:
        continue
      tree = by_slot.get(chosen[0], {})
    else:
      tree = _merge_signatures(by_slot, sites, counts, labels)
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
  if signature is not None and signature not in labels_seen:
    raise NotDeclaredError(
      _UNKNOWN_SIGNATURE.format(
        signature=signature,
        what=_describe((), model),
        labels=", ".join(repr(x) for x in dict.fromkeys(labels_seen)) or "none",
      )
    )
  return result


def _slot_labels(sites: tp.Sequence[SowSite]) -> dict[int, str]:
  """Each signature slot of a recorder and its label, in declaration order."""
  return dict(sorted({s.slot: s.signature for s in sites}.items()))


def _merge_signatures(
  by_slot: dict[int, dict],
  sites: tp.Sequence[SowSite],
  counts: dict[tuple[int, tuple[str, ...]], jax.Array],
  labels: dict[int, str],
) -> dict:
  """One Linen-shaped tree over every signature of a recorder (`signature=None`).

  A sow declared for one signature reads as that signature's value. A sow declared for
  several reads as the one signature that holds records, or, when several do (or inside a
  trace, where counts are not known), as `{label: value}` in declaration order.
  """
  if len(by_slot) <= 1:
    return next(iter(by_slot.values()), {})
  slots_of: dict[tuple[str, ...], list[SowSite]] = {}
  for site in sites:
    slots_of.setdefault(site.sow_key, []).append(site)
  merged: dict = {}
  for sow_key, its_sites in slots_of.items():
    slots = sorted({s.slot for s in its_sites})
    values = {slot: _recorder.get_nested(by_slot.get(slot, {}), sow_key) for slot in slots}
    if len(slots) > 1:
      holding = []
      for slot in slots:
        site = next(s for s in its_sites if s.slot == slot)
        n = counts[slot, split_slot(site.key)[1]]
        if _buffers.is_traced(n):
          holding = slots  # inside a trace: every signature, by label
          break
        if int(jnp.max(n)) > 0:
          holding.append(slot)
      if len(holding) > 1:
        _recorder.set_nested(merged, sow_key, {labels[slot]: values[slot] for slot in holding})
        continue
      slots = holding or [slots[-1]]  # no records anywhere: the latest signature's (empty)
    _recorder.set_nested(merged, sow_key, values[slots[0]])
  return merged


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


def recorded(model: tp.Any, *, signature: str | None = None) -> dict:
  """What the model recorded, Linen-shaped: each sow tuple becomes one array, index first.

  For an `lb.ToNNX` the tree is the one `linen.apply(..., mutable=[...])` returns, e.g.
  `{'intermediates': {'x': Array[n, ...], 'ScanBlock_0': {'carry': Array[n, L, ...]}}}`.
  A sown pytree (a block returning `(out, weights)` under `capture_intermediates`, a dict, a
  struct dataclass) reads back as that pytree with a leading `n` axis on every leaf.

  Outside a trace each array holds the `n` values recorded (at most `capacity`), oldest first.
  Inside a trace (jit, loops) shapes must be static, so each array is the whole buffer,
  `(capacity, ...)`, oldest first, with zeros past the count; read `lb.counts(model)` there.

  A stack of layers (`nnx.vmap`, `lb.layers.stack`) reads as `[n, layers, ...]`. Each layer
  keeps its own count: a layer run alone (`lb.layers.layer(stack, i)(...)`) advances only
  its own, and while the layers' counts differ the stack does not read as one array
  (StackError naming them); read a layer with `lb.recorded(lb.layers.layer(stack, i))`.

  A model declared for several call signatures (a prompt and one-token decode steps) keeps
  each signature's records apart. With `signature=None` a sow reads as today when one
  signature holds its records; when several do (or inside a trace, for a sow declared for
  several), it reads as `{label: value}` in declaration order, labels such as
  `"(float32[2,3,32])"`. `signature=label` reads that signature alone, Linen-shaped.

  Args:
    model: an `lb.ToNNX`, or an NNX module holding some (then keyed by path from the root).
    signature: the label of one declared call signature (see `lb.sow_sites`), or None.

  Returns:
    A nested dict of arrays.

  Raises:
    BufferOverflowError: outside a trace, a buffer under `overflow="error"` received more
      values than its capacity.
    StackError: outside a trace, the layers of a stack recorded different numbers of values.

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
    model,
    lambda path, b, c: _buffers.read(*_buffers.flat_view(b, c), "/".join(map(str, path))),
    signature,
  )


def counts(model: tp.Any, *, signature: str | None = None) -> dict:
  """How many values each sow site received since the last reset (may exceed capacity).

  Args:
    model: as for `recorded`.
    signature: as for `recorded`.

  Returns:
    A nested dict shaped like `recorded(model, signature=signature)` holding int32 scalars;
    for a stacked module (`nnx.vmap`, `lb.layers.stack`) one count per layer, shape
    `(*stack,)`: a layer run alone (`lb.layers.layer(stack, i)`) advances its own.

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
  return _map_records(model, lambda path, b, c: _buffers.flat_view(b, c)[1], signature)


def buffers(model: tp.Any, *, signature: str | None = None) -> dict:
  """The raw buffers, `(capacity, *value_shape)` each, shaped like `recorded(model)`.

  Buffers of native modules stacked with `nnx.vmap` are `(*stack, capacity, *value_shape)`.
  A record kept in host memory (`memory="host"`) is that array in host memory; under
  `overflow="error"`/`"drop"` it has one more slot at the end, which the writes past its
  capacity go to (`lb.recorded` never returns it).

  Args:
    model: as for `recorded`.
    signature: as for `recorded`.

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
  return _map_records(model, lambda path, b, c: _compat.variable_value(b), signature)


def reset(model: Model) -> Model:
  """Set every count back to zero and clear the buffers (of every signature), in place.

  Shapes never change.

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
  _map_records(model, lambda path, b, c: _buffers.clear(b))
  for _, recorder in _recorder.iter_recorders(model):
    vector = _recorder.counts_of(recorder)
    if vector is not None:
      _buffers.reset_counts(vector)
  return model
