"""The declaration pipeline: `lb.lazy_init`, `lb.preallocate` and `from_linen_variables`.

The two general entries build the declaration spec (`capacity`/`overflow`) once, open one
discovery session for the root, run one call of it, and hand everything found to the declare
stage:
- `lazy_init` runs the real initializing call: every `lb.ToNNX` it reaches runs its Linen
  `init` once and reports the values that very trace sowed; native sows of the same call are
  read from the graph's state.
- `preallocate` (a new call signature on an initialized model) runs one abstract call
  (`jax.eval_shape`, no FLOPs) on a clone, so nothing of the model changes but its buffers.
The sample arguments' shardings are kept to choose the buffers' layout, whatever the root.
The third entry, `from_linen_variables`, declares an `lb.ToNNX` around Linen variables that
already exist (`lb.checkpoint.from_linen_variables`): one abstract init checks them.
"""

from __future__ import annotations

import typing as tp

import jax
from flax import nnx

from .. import _compat
from . import capacity as _capacity
from . import discovery_session, observe_native, recorder, site_probe
from .all_or_nothing import all_or_nothing
from .bridge_settings import is_bridge
from .discovered_parts import (
  Items,
  _bridge_parts,
  _flat_state,
  _graph_index,
  _native_parts,
  _remove_tuples,
  _transformed_parts,
)
from .entry_common import _Entry, _note_running
from .entry_common import declare_alone as declare_alone
from .entry_linen_variables import from_linen_variables as from_linen_variables
from .entry_preallocate import preallocate as preallocate

Model = tp.TypeVar("Model")


@all_or_nothing
def lazy_init(
  model: Model,
  *args: tp.Any,
  capacity: int | tp.Mapping[str, int] | None = None,
  overflow: _capacity.Overflow | None = None,
  memory: str | tp.Mapping[str, str] | None = None,
  **kwargs: tp.Any,
) -> Model:
  """Initialize bridged parts from sample inputs and preallocate a buffer per sow site.

  On an `lb.ToNNX`: `flax.nnx.bridge.lazy_init` plus buffers for its Linen sows, found in the
  values the Linen `init` trace itself sowed (the model is not applied a second time). On any
  other NNX module (or bound method): the call initializes every `lb.ToNNX` it reaches and
  declares buffers for every sow of that same call, native and bridged, with `capacity`
  resolved over the whole graph. Buffers of batch-sharded sample inputs are sharded alike.

  Args:
    model: an `lb.ToNNX`, or any NNX module (or bound method of one).
    *args: sample inputs, as for the model's call.
    capacity: an int for every sow site, or a mapping from a collection name, a `/`-joined
      path from the root inside the collection (e.g. `"ScanBlock_0/carry"`, `"llm/Block_0/x"`)
      or a glob of one to an int. Defaults to the capacity given to each `lb.ToNNX`, then to
      an enclosing `with lb.capacity(N):` block.
    overflow: `"error"`, `"drop"` or `"wrap"`. Default: a site declared before keeps its
      policy; a new site takes the `lb.ToNNX`'s, else `"error"`.
    memory: where the records live: `"device"` (the default) or `"host"` (pinned host
      memory, written from inside the compiled step, so a loop's records may exceed the
      device's memory; read back as NumPy arrays), or a mapping with the keys of `capacity`
      to either; sites no key covers stay on the device.
    **kwargs: keyword arguments of the call (`method=` included for an `lb.ToNNX`).

  Returns:
    `model`, initialized.

  Raises:
    CapacityError: bad capacity/overflow, a site no key covers, or a key matching no site.
    TypeError: `model` is not an NNX module or method.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return nn.Dense(2)(x)
    >>> model = lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), jnp.ones((1, 3)), capacity=5)
    >>> lb.recorded(model)["intermediates"]["x"].shape
    (0, 1, 3)
  """
  entry = _Entry.open("lazy_init", model, None, capacity, overflow, memory)
  root = entry.root
  native = observe_native.observable_modules(root)
  before = _flat_state(root) if native else {}
  bridged = [id(n) for _, n in _compat.iter_graph(root) if is_bridge(n)]
  with (
    discovery_session.open_session("init", bridged) as session,
    observe_native.observe(native) as calls,
  ):
    _compat.set_initializing(root, True)
    try:
      tp.cast(tp.Callable[..., tp.Any], model)(*args, **kwargs)
    except ValueError as error:
      if recorder.PROBES_ATTR not in str(error):
        _note_running(error, "lb.lazy_init", root, _graph_index(root)[0])
        raise
      raise TypeError(
        "lb.lazy_init found an lb.ToNNX that sows inside an NNX transform which does not "
        "stack it (e.g. nnx.vmap with in_axes=None for the module): every member sows its own "
        "value, but the module, and so its buffers, would be shared. Why: one buffer records "
        "one value per call. Fix: give the module the transform axis (in_axes=0, with "
        "nnx.split_rngs), or call it outside the transform."
      ) from error
    except Exception as error:
      _note_running(error, "lb.lazy_init", root, _graph_index(root)[0])
      raise
    finally:
      _compat.set_initializing(root, False)
  probes_of = site_probe.take_probes(root)
  if native:
    path_of, node_at = _graph_index(root)
    findings = observe_native.diff(before, _flat_state(root), calls)
    _remove_tuples(node_at.get, findings.tuple_paths)
  else:  # a bare lb.ToNNX (or only bridged parts): nothing native to look for
    bare: dict[tuple, nnx.Module] = {(): root}
    path_of, node_at = ({id(root): ()}, bare) if is_bridge(root) else _graph_index(root)
    findings = observe_native.NativeFindings({}, [], [])
  items: Items = [(path_of.get(id(r.node)), r) for r in session.reports]
  parts = (
    _bridge_parts(items, node_at, "lb.lazy_init", transient_ok=True)
    + _transformed_parts(items, node_at, probes_of, "lb.lazy_init")
    + _native_parts(findings, node_at.__getitem__)
  )
  entry.declare_parts(parts, args, kwargs)
  _unalias_sample_arrays(root, (args, kwargs))
  return model


def _unalias_sample_arrays(root: nnx.Module, sample: object) -> None:
  """Give each Variable that holds one of the caller's sample arrays its own copy.

  Linen init may store an input as it is (a cache initialised from `x`); `lb.compile_step`
  later donates the Variables it writes, which would delete the caller's array.
  """
  given = {id(x) for x in jax.tree_util.tree_leaves(sample) if isinstance(x, jax.Array)}
  if not given:
    return

  def own(leaf: object) -> object:
    return jax.numpy.array(leaf, copy=True) if id(leaf) in given else leaf

  for _, node in _compat.iter_graph(root):
    if isinstance(node, nnx.Variable):
      value = _compat.get_raw_value(node)
      if any(id(leaf) in given for leaf in jax.tree_util.tree_leaves(value)):
        _compat.set_raw_value(node, jax.tree_util.tree_map(own, value))
