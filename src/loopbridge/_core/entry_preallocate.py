"""The entry `lb.preallocate`: declare buffers for a new call signature of an initialized model,
from one abstract call on a clone (and one jitted run for the Linen variables the call creates)."""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
import jax.numpy as jnp
from flax import nnx

from .. import _compat
from . import capacity as _capacity
from . import discovery_session, linen_vars, observe_native, recorder
from .bridge_settings import is_bridge, settings_of
from .call_target import Call
from .discovered_parts import (
  Items,
  _bridge_parts,
  _graph_index,
  _native_parts,
  _remove_tuples,
)
from .entry_common import _Entry, _note_running
from .errors import NotDeclaredError

Model = tp.TypeVar("Model")


def _variable_shapes(node: nnx.Module) -> list[tuple[tuple, tuple[int, ...]]]:
  return [
    (path, tuple(getattr(_compat.variable_value(v), "shape", ())))
    for path, v in _compat.iter_graph(node)
    if isinstance(v, nnx.Variable)
  ]


def _report_path(
  report: discovery_session.BridgeReport,
  paths: dict[int, tuple],
  node_at: dict[tuple, nnx.Module],
) -> tuple[tuple | None, int | None]:
  """Where a bridged node that reported in `preallocate`'s run sits in the model (None:
  unknown), and the number of layers when it ran as one layer of a stack there (else None).

  A node of the model's clone is found by identity. An NNX loop or transform inside the call
  (`nnx.while_loop`, `nnx.fori_loop`, `nnx.scan`, `lb.fori_loop`, ...) calls a copy merged from
  the clone's state instead; the copy keeps the node's static attributes (its settings object
  is the very same), so it is the node whose settings it carries, provided every Variable has
  the node's shape. A copy whose every Variable is the node's without its leading axis is one
  layer of a stacked node (`lb.layers.scan`, `nnx.scan` over an `lb.layers.stack` or
  `nnx.vmap` stack): its sites are the node's with the layer axis in front. A copy shared by
  the members of a vmap (batched sows, one buffer) stays unknown.
  """
  node = report.node
  if node is None:  # released once its run is over: nothing left to place
    return None, None
  path = paths.get(id(node))
  if path is not None:
    return path, None
  if report.batched:
    return None, None
  settings = settings_of(node)
  matches = [p for p, n in node_at.items() if settings_of(n) is settings]
  if len(matches) != 1:
    return None, None
  mine, theirs = _variable_shapes(node), _variable_shapes(node_at[matches[0]])
  if mine == theirs:
    return matches[0], None
  layers = {full[0] for (_, one), (_, full) in zip(mine, theirs) if full[1:] == one and full}
  same_paths = [p for p, _ in mine] == [p for p, _ in theirs]
  stacked = all(full == (*layers, *one) for (_, one), (_, full) in zip(mine, theirs))
  if same_paths and len(layers) == 1 and stacked:
    return matches[0], layers.pop()
  return None, None


def _bridged_stack_size(root: nnx.Module) -> int | None:
  """The number of layers when `root` is a stack of `lb.ToNNX` layers (`lb.layers.stack`),
  read from its declared sites' layer axis; None for a single wrapper."""
  if not is_bridge(root):
    return None
  sizes = {s.shape[0] for s in recorder.sites_of(root) or () if s.stack_axes}
  return sizes.pop() if len(sizes) == 1 else None


def _first_layer(stacked: nnx.Module) -> nnx.Module:
  """Layer 0 of a stack of `lb.ToNNX` layers, as its own module (for an abstract call)."""
  graphdef, state = nnx.split(stacked)
  one = nnx.merge(graphdef, jax.tree.map(lambda leaf: leaf[0], state))
  recorder.shift_stack_axes(one, None)
  return one


def _abstract(tree: object) -> object:
  return jax.tree.map(
    lambda x: (
      jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "shape") and hasattr(x, "dtype") else x
    ),
    tree,
  )


def preallocate(
  model: Model,
  *args: tp.Any,
  capacity: int | tp.Mapping[str, int] | None = None,
  overflow: _capacity.Overflow | None = None,
  method: object = None,
  memory: str | tp.Mapping[str, str] | None = None,
  **kwargs: tp.Any,
) -> Model:
  """Declare buffers for every sow a call makes, anywhere in an NNX module graph.

  Runs the call once abstractly (`jax.eval_shape`, no FLOPs) on a copy of the model and
  declares a buffer for every sow it makes: the Linen sows of every `lb.ToNNX` it reaches and
  every native `Module.sow` with the default tuple reduce (any `nnx.Variable` type; inside
  `nnx.scan` / `nnx.vmap` over stacked modules too). Sites whose storage is unchanged keep
  their buffers and records; sites the call does not make keep theirs. Perturbation Variables
  (`Module.perturb`) and custom-reduce accumulators the call would create are created now
  (zeros / `init_fn()`). Parameters are untouched.

  Args:
    model: an NNX module (or a bound method of one), e.g. an initialized `lb.ToNNX`.
    *args: sample inputs of the call (only shapes, dtypes and shardings matter).
    capacity: as for `lb.lazy_init` (the same defaults); native sows need it or an
      enclosing `with lb.capacity(N):` block.
    overflow: `"error"`, `"drop"` or `"wrap"`. Default: a site declared before keeps its
      policy; a new site takes the `lb.ToNNX`'s, else `"error"`.
    method: the method the loop calls: a name, a function taking the module first, or (for
      an `lb.ToNNX`) a Linen method. Default `__call__`.
    memory: as for `lb.lazy_init` (`"device"`, `"host"` or a mapping; default the device).
    **kwargs: keyword arguments of the call.

  Returns:
    `model`.

  Raises:
    CapacityError: a malformed capacity/overflow, a site no key covers, a key matching no site.
    NotDeclaredError: an `lb.ToNNX` in the graph was not initialized yet.
    NotDeclaredError: a site receives values of different shapes within one call.
    TypeError: `model` is not an NNX module.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import nnx
    >>> class Net(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.lin = nnx.Linear(2, 3, rngs=rngs)
    ...   def __call__(self, x):
    ...     h = self.lin(x)
    ...     self.sow(nnx.Intermediate, "h", h)
    ...     return h
    >>> model = lb.preallocate(Net(nnx.Rngs(0)), jnp.ones((1, 2)), capacity=4)
    >>> _ = model(jnp.ones((1, 2)))
    >>> lb.recorded(model)["intermediates"]["h"].shape
    (1, 1, 3)
  """
  entry = _Entry.open("preallocate", model, method, capacity, overflow, memory)
  root, call = entry.root, entry.call
  for path, node in _compat.iter_graph(root):
    if is_bridge(node) and recorder.sites_of(node) is None:
      where = f" at '{'/'.join(map(str, path))}'" if path else ""
      raise NotDeclaredError(
        f"lb.preallocate needs an initialized model: the lb.ToNNX("
        f"{type(_compat.linen_module_of(node)).__name__}){where} is not initialized. Why: its "
        "Linen parameters are created from sample inputs. Fix: lb.lazy_init(model, "
        "*sample_args, capacity=...) first (preallocate then declares buffers for other "
        "call signatures)."
      )
  graphdef, state = _compat.split_graph(root)
  before = observe_native.flat_state(state)
  found: dict[str, list] = {}

  # A stack of lb.ToNNX layers is declared for a call of one layer: each layer makes it.
  layered = _bridged_stack_size(root) is not None

  def run(state: object) -> object:
    clone = nnx.merge(graphdef, state)
    clone_paths, clone_at = _graph_index(clone)
    with (
      discovery_session.open_session("apply") as session,
      observe_native.observe(observe_native.observable_modules(clone)) as calls,
    ):
      try:
        call(_first_layer(clone) if layered else clone, *args, **kwargs)
      except Exception as error:
        _note_running(error, "lb.preallocate", root, clone_paths)
        raise
    # Nothing traced may leave the trace: keep shapes and paths only.
    found["reports"] = [
      (
        where[0],
        dataclasses.replace(
          r,
          node=None,
          new_accumulators={k: (f, _abstract(v)) for k, (f, v) in r.new_accumulators.items()},
          new_variables=_abstract(r.new_variables),
          layers=where[1],
        ),
      )
      for r in session.reports
      for where in [_report_path(r, clone_paths, clone_at)]
    ]
    found["calls"] = list(calls)
    return _compat.split_graph(clone)[1]

  # Closing over the (concrete) inputs is fine: under eval_shape nothing is executed.
  after = observe_native.flat_state(jax.eval_shape(run, state))
  _, node_at = _graph_index(root)
  findings = observe_native.diff(before, after, found["calls"])
  parts = _bridge_parts(found["reports"], node_at, "lb.preallocate")
  if any(r.new_variables for _, r in found["reports"]):
    _create_linen_variables(found["reports"], node_at, graphdef, state, call, args, kwargs, layered)
  _remove_tuples(node_at.get, [p for p in findings.tuple_paths if p in before])
  for path, var_type, abstract, these in findings.created:
    module = node_at.get(tuple(path[:-1]))
    variable = observe_native.new_state_variable(var_type, abstract, these)
    if isinstance(module, nnx.Module) and variable is not None:
      setattr(module, path[-1], variable)
  parts += _native_parts(findings, node_at.__getitem__)
  entry.declare_parts(parts, args, kwargs)
  return model


def _create_linen_variables(
  reports: Items,
  node_at: dict[tuple, nnx.Module],
  graphdef: tp.Any,
  state: object,
  call: Call,
  args: tuple,
  kwargs: dict,
  layered: bool,
) -> None:
  """Create the Linen variables the call makes on the bridged parts that lack them.

  A call such as HuggingFace's `init_cache=True` creates a collection (its `cache`) that the
  loop's later calls update: as `lazy_init` with that call would, the variables get the values
  the call gives them. The abstract run found which; one jitted run of the same call on a
  clone computes their values (XLA keeps only what they need) and nothing else of the model
  changes.
  """

  def values(state: object) -> list[dict]:
    clone = nnx.merge(graphdef, state)
    with (
      discovery_session.open_session("apply") as session,
      observe_native.observe(observe_native.observable_modules(clone)),
    ):
      call(_first_layer(clone) if layered else clone, *args, **kwargs)
    return [r.new_variables for r in session.reports]

  # Closing over the inputs: they are constants of this one run.
  computed = jax.jit(values)(state)
  for (path, report), made in zip(reports, computed, strict=True):
    if not report.new_variables:
      continue
    if path is None:
      raise TypeError(
        f"lb.preallocate found lb.ToNNX({report.label}) creating Linen variables "
        f"({', '.join('/'.join(p) for p in report.new_variables)}) inside an NNX transform "
        "(nnx.vmap, nnx.scan, ...) of the model, where it cannot tell which submodule it is. "
        "Fix: call lb.preallocate on that lb.ToNNX directly with the arguments it receives "
        "there."
      )
    new: dict = {}
    layers = report.layers
    for key, value in made.items():
      if layers is not None:  # every layer of the stack starts from the same value
        value = jax.tree.map(lambda x, n=layers: jnp.stack([x] * n), value)
      recorder.set_nested(new, key, value)
    linen_vars.add_variables(tp.cast(nnx.bridge.ToNNX, node_at[path]), new)
