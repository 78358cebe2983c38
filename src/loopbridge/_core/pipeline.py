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

import dataclasses
import typing as tp

import jax
import jax.numpy as jnp
from flax import nnx

from .. import _compat
from . import (
  cache_length,
  declare,
  discovery_session,
  given_variables,
  linen_vars,
  observe_linen,
  observe_native,
  recorder,
  site_probe,
  user_errors,
)
from . import capacity as _capacity
from .all_or_nothing import all_or_nothing
from .bridge_settings import bridge_settings, is_bridge, settings_of
from .call_target import Call, LinenMethod, model_name, target
from .errors import NotDeclaredError
from .site import SowSite

Model = tp.TypeVar("Model")
# Where a part sits in the graph (path from the root) and what it reported; None: a copy.
Items = list[tuple[tuple | None, discovery_session.BridgeReport]]


# ------------------------------------------------------------------------- collecting parts
def _merge_reports(items: Items) -> Items:
  """One report per bridged node: a node called k times per call sows k times per site."""
  merged: dict[tuple, discovery_session.BridgeReport] = {}
  for path, r in items:
    # A node called with two signatures in one call declares both (a prompt, then a step).
    key = (path, r.signature) if path is not None else ("<transient>", id(r))
    into = merged.get(key)
    if into is None:
      merged[key] = dataclasses.replace(
        r, sites=list(r.sites), dropped=list(r.dropped), new_accumulators=dict(r.new_accumulators)
      )
      continue
    by_key = {s.key: i for i, s in enumerate(into.sites)}
    for s in r.sites:
      if s.key not in by_key:
        into.sites.append(s)
        continue
      old = into.sites[by_key[s.key]]
      if (old.shape, old.dtype) != (s.shape, s.dtype):
        raise NotDeclaredError(
          f"sow site {'/'.join(s.key)} of lb.ToNNX({r.label}) receives {old.shape} "
          f"{old.dtype} in one call and {s.shape} {s.dtype} in another, within one call of "
          "the model. Why: one buffer holds one value shape. Fix: sow the two under "
          "different names, or declare and run the two call signatures separately."
        )
      into.sites[by_key[s.key]] = dataclasses.replace(old, per_call=old.per_call + s.per_call)
    into.dropped.extend(d for d in r.dropped if d not in into.dropped)
    into.new_accumulators.update(r.new_accumulators)
  return [(None if k[:1] == ("<transient>",) else k[0], r) for k, r in merged.items()]


def _bridge_parts(
  items: Items,
  node_at: dict[tuple, nnx.Module],
  what: str,
  transient_ok: bool = False,
) -> list[declare.Part]:
  """Declaration parts of the bridged nodes a call reached; `items` are (path or None, report).

  Path-less reports (copies inside NNX transforms) are left to `_transformed_parts` when
  `transient_ok` (lazy_init, where probes locate them).
  """
  parts = []
  for path, report in _merge_reports(items):
    if path is None:
      if transient_ok or (not report.sites and not report.new_accumulators):
        continue  # a part that sows nothing needs no buffers, wherever it runs
      raise TypeError(
        f"{what} found lb.ToNNX({report.label}) called inside an NNX transform (nnx.vmap, "
        "nnx.scan, ...) of the model, where it cannot tell which submodule it is. Fix: call "
        "lb.preallocate on that lb.ToNNX directly with the arguments it receives there."
      )
    node = node_at[path]
    assert is_bridge(node)  # only an lb.ToNNX reports in a discovery session
    settings = bridge_settings(node)
    sites, accumulators = _for_signature(report), report.new_accumulators
    if report.layers is not None:  # one layer of a stack ran: every layer gets the site
      n = report.layers
      sites = [
        dataclasses.replace(s, shape=(n, *s.shape), stack_axes=s.stack_axes + 1) for s in sites
      ]
      accumulators = {k: (f, _stacked_abstract(v, n)) for k, (f, v) in accumulators.items()}
    linen_vars.add_accumulators(node, accumulators)
    parts.append(declare.Part(path, node, sites, settings.spec, report.dropped))
  return parts


def _stacked_abstract(tree: object, layers: int) -> object:
  """Abstract values with a leading layer axis (what a stack of `layers` holds)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct((layers, *x.shape), x.dtype), tree)


def _for_signature(report: discovery_session.BridgeReport) -> list[SowSite]:
  """The report's sites, each marked with the call signature it is declared for."""
  return [dataclasses.replace(s, signature=report.signature) for s in report.sites]


def _transformed_parts(
  items: Items,
  node_at: dict[tuple, nnx.Module],
  probes_of: dict[int, dict[str, site_probe.SiteProbe]],
  what: str,
) -> list[declare.Part]:
  """Parts of the lb.ToNNX nodes initialized by a copy inside an NNX transform.

  Such a copy reports with no path (`nnx.vmap`/`nnx.scan`/`nnx.remat` call a merged copy), and
  its static attributes do not leave the transform; its Variables do, stacked along the
  transform axis. A node of the model still undeclared after the call, of a class a path-less
  report names, is such a node; the `SiteProbe`s it sowed give each site's stacked shape, so
  its buffers are `(*stack, capacity, *value)` like a stacked native module's.
  """
  transient = [r for path, r in items if path is None]
  if not transient:
    return []
  reached = {id(r.node) for path, r in items if path is not None}
  # Only nodes the call did initialize: they hold Linen variables (or probes) now.
  candidates = [
    (path, node)
    for path, node in node_at.items()
    if is_bridge(node)
    and id(node) not in reached
    and recorder.sites_of(node) is None
    and (linen_vars.attrs(node) or id(node) in probes_of)
  ]
  parts, used = [], set()
  for path, node in candidates:
    label = model_name(node)
    reports = [r for r in transient if r.label == label]
    if not reports:
      continue
    probes = probes_of.get(id(node), {})
    sites: dict[tuple, SowSite] = {}
    for report in reports:
      for site in _for_signature(report):
        probe = probes.get("/".join(site.key))
        if probe is None:
          continue
        stacked = tuple(_compat.variable_value(probe).shape)
        axes = len(stacked) - len(site.shape)
        if axes < 0 or stacked[axes:] != tuple(site.shape):
          continue
        sites[(site.signature, *site.key)] = dataclasses.replace(
          site, shape=stacked, stack_axes=axes
        )
        used.add(id(report))
    settings = bridge_settings(node)
    parts.append(
      declare.Part(
        path,
        node,
        [sites[k] for k in sorted(sites)],
        settings.spec,
        [d for r in reports for d in r.dropped],
      )
    )
  for report in transient:
    if (report.sites or report.new_accumulators) and id(report) not in used:
      raise TypeError(
        f"{what} found lb.ToNNX({report.label}) called inside an NNX transform (nnx.vmap, "
        "nnx.scan, ...) of the model, where it cannot tell which submodule it is. Fix: call "
        "lb.preallocate on that lb.ToNNX directly with the arguments it receives there."
      )
  return parts


def _native_parts(
  findings: observe_native.NativeFindings, node_at: tp.Callable[[tuple], nnx.Module]
) -> list[declare.Part]:
  parts = []
  for path, sites in sorted(findings.sites.items(), key=lambda kv: tuple(map(str, kv[0]))):
    parts.append(declare.Part(path, node_at(path), sorted(sites, key=lambda s: s.key)))
  return parts


def _remove_tuples(node_at: tp.Callable[[tuple], object], paths: tp.Iterable[tuple]) -> None:
  """Delete the tuples flax's own `sow` left during discovery: buffers replace them."""
  for path in paths:
    module = node_at(tuple(path[:-1]))
    if isinstance(module, nnx.Module) and path[-1] in vars(module):
      delattr(module, path[-1])


def _graph_index(root: nnx.Module) -> tuple[dict[int, tuple], dict[tuple, tp.Any]]:
  path_of, node_at = {}, {}
  for path, node in _compat.iter_graph(root):
    path_of.setdefault(id(node), tuple(path))
    node_at[tuple(path)] = node
  return path_of, node_at


def _flat_state(root: nnx.Module) -> dict[tuple, object]:
  return observe_native.flat_state(_compat.split_graph(root)[1])


# ------------------------------------------------------------------------------- the entries
@dataclasses.dataclass(frozen=True)
class _Entry:
  """What every entry starts from: the call, the spec it was given, the `lb.capacity` default."""

  name: str  # "lazy_init" or "preallocate"
  root: nnx.Module
  call: Call
  spec: _capacity.DeclarationSpec
  scoped: _capacity.CapacitySpec | None  # the lowest precedence (see lb.capacity)

  @classmethod
  def open(
    cls,
    name: str,
    model: object,
    method: object,
    capacity: object,
    overflow: object,
    memory: object = None,
  ) -> _Entry:
    """Validate what the entry was given, in the order a user reads the arguments."""
    spec = _capacity.DeclarationSpec.checked(capacity, overflow, memory)
    scoped = _capacity.scoped_capacity()
    root, call = target(model, method, f"lb.{name}")
    return cls(name, root, call, spec, scoped)

  def declare_parts(self, parts: list[declare.Part], args: tuple, kwargs: dict) -> None:
    """Declare every part's buffers, then warn of caches shorter than the declared loop."""
    declare.declare(
      parts,
      spec=self.spec,
      shardings_from=(args, kwargs),
      model_name=model_name(self.root),
      entry=self.name,
      scoped_capacity=self.scoped,
    )
    cache_length.warn_short_caches(self.root, parts, self.name)


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


def _note_running(
  error: BaseException, entry: str, root: nnx.Module, path_of: dict[int, tuple]
) -> None:
  """Say which module of the model was running when its own code raised `error`."""
  if not user_errors.is_users(error):
    return
  where = user_errors.running_nnx_module(error, path_of)
  user_errors.add_note(
    error,
    f"raised by the model's own code while {entry} ran "
    f"{model_name(root)}" + (f"; NNX module {where} was running." if where else "."),
  )


def declare_alone(
  node: nnx.Module, report: discovery_session.BridgeReport, args: tuple, kwargs: dict
) -> None:
  """Declare one `lb.ToNNX` initialized without a loopbridge entry (stock `bridge.lazy_init`),
  with the capacity and overflow given to its constructor."""
  part = declare.Part((), node, _for_signature(report), bridge_settings(node).spec, report.dropped)
  declare.declare(
    [part],
    spec=_capacity.DeclarationSpec(),
    shardings_from=(args, kwargs),
    model_name=model_name(node),
    scoped_capacity=_capacity.scoped_capacity(),
  )


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


def from_linen_variables(
  model: Model,
  variables: object,
  *args: tp.Any,
  method: LinenMethod = None,
  what: str = "lb.checkpoint.from_linen_variables",
  **kwargs: tp.Any,
) -> Model:
  """Declare a new `lb.ToNNX` around Linen variables that already exist, initializing nothing.

  The third entry beside `lazy_init` and `preallocate` (public as
  `lb.checkpoint.from_linen_variables`, which builds the wrapper). One abstract init (no
  FLOPs, the wrapper's rng streams untouched) shows what the module creates for these
  arguments: its variables check the given ones' structure, and what it sowed is set apart as
  records. The model is declared with no sites (so it counts as initialized);
  `lb.preallocate` adds the buffers with the capacity the user gives there.

  Args:
    model: a new `lb.ToNNX` (not initialized).
    variables: a Linen variables dict, e.g. `{'params': ..., 'batch_stats': ...}`.
    *args: sample inputs of the call the loop makes (shapes and dtypes only).
    method: the Linen method the loop calls, default `__call__`.
    what: the public name, for messages.
    **kwargs: keyword arguments of that call.

  Returns:
    `model`, holding `variables`.

  Raises:
    CheckpointError: `variables` is not a dict, or its paths/shapes/dtypes differ from what
      the module's `init` would create for these arguments.

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> from loopbridge._core import pipeline
    >>> variables = nn.Dense(2).init(jax.random.key(0), jnp.ones((1, 3)))
    >>> model = pipeline.from_linen_variables(lb.ToNNX(nn.Dense(2)), variables, jnp.ones((1, 3)))
    >>> sorted(lb.linen_variables(model)["params"])
    ['bias', 'kernel']
  """
  node = tp.cast(nnx.bridge.ToNNX, model)
  module = _compat.linen_module_of(node)
  given = given_variables.plain_variables(variables, what)
  rng_source = _compat.rngs_of(node)
  rng_names = [n for n, _ in rng_source.items()] if isinstance(rng_source, nnx.Rngs) else []
  rng_keys = {name: jax.random.key(0) for name in {"params", *rng_names} if name != "default"}
  # mutable=True: init returns what it sowed too (intermediates included), set apart below.
  capture = bridge_settings(node).capture_intermediates
  with observe_linen.observe() as calls:
    expected = jax.eval_shape(
      lambda: module.init(
        rng_keys, *args, method=method, mutable=True, capture_intermediates=capture, **kwargs
      )
    )
  found = observe_linen.classify(expected, calls)
  expected = given_variables.without(expected, found.record_paths)
  # Collections linen.init returns but the user may have dropped (e.g. sown 'intermediates'
  # records) are not state; compare only collections that hold state.
  given = given_variables.without(given, found.record_paths)
  given = {col: tree for col, tree in given.items() if tree}
  given = given_variables.with_static_values(given, expected)
  given_variables.check_structure(given, expected, what, type(module).__name__)
  # The arrays are used as given (e.g. host-loaded): partitioning stays metadata, and the
  # standard NNX recipe (nnx.get_partition_spec + device_put) places them.
  with _compat.no_eager_sharding():
    linen_vars.set_variables(node, given)
  report = discovery_session.BridgeReport(node, type(module).__name__, [], found.dropped, {})
  declare_alone(node, report, args, kwargs)
  return model
