"""Every difference between the supported flax versions, in one place.

Supported: every flax minor from 0.10.2 + jax 0.5.3 (what openpi pins) through flax 0.12.12 +
jax 0.12.1; the tested pairs are the files in `constraints/` (README, "Supported versions").
Each function below hides exactly one difference and tests for the capability itself (a
signature, an attribute), not the version number; the comment says which versions differ and
how. Code elsewhere in the package never checks a version itself (`tests/test_layering.py`).
Three jobs live in modules of their own: `installed_pair.py`, the one check that reads version
numbers (from package metadata, before flax is imported), `orbax_metadata.py`, reading
back what orbax saved, and `jaxpr_reading.py`, reading jaxpr equations (whose param names JAX
renames between minors) with a conservative fallback for every read.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import sys
import typing as tp
import warnings

# Re-exported: `_compat` is the one import for every difference.
from .installed_pair import broken_pair_message as broken_pair_message
from .installed_pair import check_installed_pair, version_tuple
from .orbax_metadata import orbax_custom_metadata as orbax_custom_metadata
from .orbax_metadata import orbax_tree_metadata as orbax_tree_metadata

check_installed_pair()

# After the pair check: on a broken pair these imports fail deep inside flax.
import flax  # noqa: E402
import jax  # noqa: E402
from flax import linen, nnx  # noqa: E402
from flax.nnx.bridge import wrappers as _bridge_wrappers  # noqa: E402

from .jaxpr_reading import eval_jaxpr as eval_jaxpr  # noqa: E402
from .jaxpr_reading import forwarded_inputs as forwarded_inputs  # noqa: E402
from .jaxpr_reading import used_inputs as used_inputs  # noqa: E402

FLAX_VERSION: tuple[int, ...] = version_tuple(flax.__version__)
JAX_VERSION: tuple[int, ...] = version_tuple(jax.__version__)

# A bridge's `rngs`: streams, one key, or none (as stock `ToNNX` takes them).
RngsArg = nnx.Rngs | jax.Array | None
Node = tp.TypeVar("Node")

# flax 0.11.1 renamed nnx.Object to nnx.Pytree and its per-instance state attribute from
# `_object__state` to `_pytree__state`.
_STATE_ATTR = "_pytree__state" if hasattr(nnx, "Pytree") else "_object__state"

# flax >= 0.12.5 loops and transforms accept `graph=` (graph mode vs tree mode, FLIP 5310;
# `nnx.jit` alone from 0.12.4); 0.10.2 to 0.12.4 loops have graph mode only.
HAS_GRAPH_SWITCH: bool = "graph" in inspect.signature(nnx.while_loop).parameters

# Prefixes of attributes on a bridge.ToNNX that are not Linen variables. flax 0.12 namespaces
# its own (`to_nnx__module`, `to_nnx__rngs`); 0.10 uses plain `module`, `rngs`,
# `linen_attributes` and records the Linen attribute names itself.
# flax's own per-instance bookkeeping attributes on every NNX module (not graph data):
# `_object__...` up to flax 0.11.0, `_pytree__...` from 0.11.1 on.
NNX_INTERNAL_PREFIXES = ("_pytree__", "_object__")
_OWN_ATTR_PREFIXES = ("to_nnx__", *NNX_INTERNAL_PREFIXES, "loopbridge__")


def is_initializing(module: nnx.Module) -> bool:
  """Whether `bridge.lazy_init` is running on `module` (attribute name differs, see above)."""
  return bool(getattr(module, _STATE_ATTR).initializing)


def set_initializing(module: nnx.Module, initializing: bool) -> None:
  """Flip the lazy-init flag the same way `flax.nnx.bridge.lazy_init` does.

  Both versions ship the private helper `_set_initializing` with the same signature; a flax
  without it gets the same loop written here (every graph node's state flag).
  """
  helper = getattr(_bridge_wrappers, "_set_initializing", None)
  if helper is not None:
    helper(module, initializing)
    return
  for _, node in iter_graph(module):
    state = getattr(node, _STATE_ATTR, None)
    if state is not None:
      state._initializing = initializing


def linen_module_of(model: nnx.bridge.ToNNX) -> linen.Module:
  """The wrapped Linen module: `to_nnx__module` (flax >= 0.12.0) or `module` (before)."""
  if "to_nnx__module" in vars(model):
    return vars(model)["to_nnx__module"]
  return vars(model)["module"]


def rngs_attribute(model: nnx.bridge.ToNNX) -> str:
  """The name of the wrapper's rngs attribute: `to_nnx__rngs` (flax >= 0.11) or `rngs` (0.10)."""
  return "to_nnx__rngs" if "to_nnx__rngs" in vars(model) else "rngs"


def rngs_of(model: nnx.bridge.ToNNX) -> RngsArg:
  """The wrapper's rngs: `to_nnx__rngs` (flax >= 0.12.0) or `rngs` (before)."""
  if "to_nnx__module" in vars(model):
    return vars(model)["to_nnx__rngs"]
  return vars(model)["rngs"]


def linen_attribute_names(model: nnx.bridge.ToNNX) -> list[str]:
  """Names of the attributes holding Linen variables, as stock `ToNNX.__call__` reads them."""
  own = vars(model)
  if "to_nnx__module" in own:
    # flax >= 0.12.0: every attribute that is not the wrapper's own.
    return [k for k in own if not k.startswith(_OWN_ATTR_PREFIXES)]
  if "linen_attributes" in own:
    # flax 0.10.2: the wrapper keeps the list itself.
    return [k for k in own["linen_attributes"] if not k.startswith(_OWN_ATTR_PREFIXES)]
  # flax 0.11 (no list, attributes not namespaced yet): every attribute but `module` and `rngs`.
  return [k for k in own if k not in ("module", "rngs") and not k.startswith(_OWN_ATTR_PREFIXES)]


def set_linen_attribute_names(model: nnx.bridge.ToNNX, names: tp.Iterable[str]) -> None:
  """Keep flax 0.10.2's `linen_attributes` list in step when we add or remove Linen attributes."""
  if "linen_attributes" in vars(model):
    # 0.10.2 only: the newest flax (the one type-checked against) has no such attribute.
    model.linen_attributes = tuple(sorted(names))  # pyright: ignore[reportAttributeAccessIssue]


def set_data_attribute(obj: object, name: str, value: object) -> None:
  """Assign a container of Variables as an NNX data attribute.

  flax 0.12 Pytrees refuse a dict holding Variables unless it is marked with `nnx.data`;
  0.10 treats every attribute as a graph node and has no `nnx.data`.
  """
  if hasattr(nnx, "data"):
    value = nnx.data(value)
  setattr(obj, name, value)


def bridge_call_rngs(rngs: RngsArg, *, initializing: bool) -> dict[str, jax.Array]:
  """The `rngs=` dict stock `ToNNX.__call__` hands to Linen, consuming the streams the same way.

  flax 0.12 calls every stream (advancing its count) and renames `default` to `params`.
  flax 0.10 uses the raw keys without advancing them at init, calls the streams at apply, and
  renames `default` only at init. flax 0.11 (nnx.Pytree, from 0.11.1) calls the streams as 0.12
  does but renames only at init, so its stock wrapper cannot create params outside lazy_init;
  ours takes the 0.12 path there and can (nnx.bridge.Module.init needs it).
  """
  if rngs is None:
    return {}
  if isinstance(rngs, jax.Array):
    return {"params": rngs}
  if hasattr(nnx, "Pytree"):  # 0.11.1 on
    out = {name: stream() for name, stream in rngs.items()}
    if "params" not in out and "default" in out:
      out["params"] = out.pop("default")
    return out
  if initializing:  # 0.10 init
    out = {name: stream.key.raw_value for name, stream in rngs.items()}
    if "params" not in out and "default" in out:
      out["params"] = out.pop("default")
    return out
  return {name: stream() for name, stream in rngs.items()}  # 0.10 apply


def collection_name(variable_type: type) -> str:
  """Linen collection name of an NNX Variable type (the function moved between versions)."""
  from flax.nnx import variablelib

  if hasattr(variablelib, "variable_name_from_type"):  # 0.12
    return variablelib.variable_name_from_type(variable_type)
  from flax.nnx.bridge import variables as bridge_variables  # 0.10

  # 0.10 only: the newest flax (the one type-checked against) has no such function.
  name_of = bridge_variables.variable_type_name  # pyright: ignore[reportAttributeAccessIssue]
  return name_of(variable_type)


def variable_value(variable: nnx.Variable) -> tp.Any:
  """The value inside a Variable.

  flax 0.12 deprecates `.value` for `get_value()`; 0.10 has only `.value`.
  """
  if hasattr(variable, "get_value"):
    return variable.get_value()
  return variable.value


def set_variable_value(variable: nnx.Variable, value: object) -> None:
  """Write a Variable's value in place, keeping the Variable object (loops need identity).

  0.12 deprecates assigning `.value` for `set_value()`; 0.10 has only `.value`.
  """
  if hasattr(variable, "set_value"):
    variable.set_value(value)
  else:
    variable.value = value


def set_variable_metadata(variable: nnx.Variable, name: str, value: object) -> None:
  """Change one metadata entry of a Variable in place.

  0.12 refuses attribute assignment for metadata (`set_metadata` only; 0.12.0 takes keyword
  arguments only, later releases also `(name, value)`); 0.10 has no `set_metadata` (a missing
  attribute is looked up on the value) and takes assignment.
  """
  if hasattr(type(variable), "set_metadata"):
    variable.set_metadata(**{name: value})
  else:
    setattr(variable, name, value)


def drop_variable_metadata(variable: nnx.Variable, name: str) -> None:
  """Remove one metadata entry of a Variable in place (a no-op when it has none).

  0.12 replaces the whole metadata with `set_metadata(dict)`; 0.11 has `get_metadata` but no
  `set_metadata` (attribute deletion removes an entry); 0.10 keeps metadata as instance
  attributes.
  """
  if hasattr(type(variable), "set_metadata"):
    metadata = dict(variable.get_metadata())
    if name in metadata:
      del metadata[name]
      variable.set_metadata(metadata)
    return
  held = variable.get_metadata() if hasattr(variable, "get_metadata") else vars(variable)
  if name in held:
    delattr(variable, name)


def current_bridge_mutable() -> tp.Any:
  """`mutable` inherited from an enclosing bridge/Linen module, as stock `ToNNX.__call__` does.

  flax 0.12 reads it from `bridge.module.current_module()` or the Linen module stack;
  0.10 has no such inheritance (its stock call never forwards `mutable` implicitly).
  Returns None when there is no enclosing module.
  """
  try:
    from flax.nnx.bridge import module as bridge_module  # 0.12 only
  except ImportError:
    bridge_module = None
  if (
    bridge_module is not None
    and (m := bridge_module.current_module()) is not None
    and m.scope is not None
  ):
    return m.scope.mutable
  # Linen's module stack is private: a flax that moves it inherits nothing (as flax 0.10 does).
  context = getattr(linen.module, "_context", None)
  stack = getattr(context, "module_stack", None)
  if stack and stack[-1] is not None and stack[-1].scope is not None:
    return stack[-1].scope.mutable
  return None


def current_trace() -> object:
  """The JAX trace NNX records on each Variable (`Variable._trace_state`), for comparing."""
  from flax.nnx import tracers  # same module and function on 0.10 and 0.12

  current = getattr(tracers, "current_jax_trace", None)
  if current is not None:
    return current()
  from jax.extend import core as jex_core  # pylint: disable=import-outside-toplevel

  # What flax 0.12's helper returns, from jax's public extension API.
  return jex_core.get_opaque_trace_state(convention="nnx")


def written_in_another_trace(variable: nnx.Variable, trace: object) -> bool:
  """Whether writing `variable` under `trace` would leave the value behind in a foreign trace.

  flax 0.12 refuses such a write itself (`TraceContextError`), except for hijax Variables,
  whose values are references that may cross traces. flax 0.10 records the trace on every
  Variable (`_trace_state`) but its check is switched off (`TraceState.is_valid` returns
  True), so the write goes through and the value is lost when the trace ends. Both keep the
  trace in `_trace_state.jax_trace`, so comparing it works alike.
  """
  if getattr(variable, "hijax", False):
    return False
  state = getattr(variable, "_trace_state", None)
  # A flax that keeps no trace here cannot lose a write to it: its own check decides.
  return state is not None and getattr(state, "jax_trace", trace) != trace


def unfiltered_tracebacks() -> tp.ContextManager[object]:
  """JAX traceback filtering off inside the block (this thread only).

  Filtering drops flax's own frames (Linen's module wrappers), and with them which Linen module
  was running; jax 0.5 and 0.10 both keep the option as a `jax._src.config` State, which is a
  thread-local context manager.
  """
  try:
    from jax._src import config  # pylint: disable=import-outside-toplevel

    return config.traceback_filtering("off")
  except (ImportError, AttributeError):  # moved: the note then names fewer modules, no more
    import contextlib

    return contextlib.nullcontext()


def is_batched(x: object) -> bool:
  """Whether `x` is a value inside `jax.vmap` (or `nnx.vmap`), i.e. one per batch member.

  jax 0.10 no longer exports `jax.interpreters.batching.BatchTracer`; both versions keep the
  class in `jax._src.interpreters.batching`.
  """
  return isinstance(x, _BATCH_TRACER) if _BATCH_TRACER is not None else _named_batch_tracer(x)


def is_partial_eval_tracer(x: object) -> bool:
  """Whether `x` is a partial-evaluation tracer (`JaxprTracer`), e.g. of Linen `nn.scan`'s
  broadcast pass.

  Linen's `nn.scan` first runs its body under `pe.trace_to_jaxpr_nounits` to find the broadcast
  outputs; what that pass stages is thrown away, never run. The class is read by name:
  `jax.interpreters.partial_eval` is not a promised place for it.
  """
  return any(c.__name__ == "JaxprTracer" for c in type(x).__mro__)


def in_linen_scan_broadcast_pass() -> bool:
  """Whether the caller runs inside Linen `nn.scan`'s broadcast pass (`init_mode=True`).

  `flax.core.axes_scan.scan` traces its body once under partial evaluation to find the
  broadcast outputs and throws that trace away. The pass is recognised by its frame (flax's
  `body_fn` with `init_mode` true), since its tracers' class is jax's to rename; a flax that
  renames the frame is read as "not in the pass" (`is_partial_eval_tracer` still applies).
  """
  try:
    from flax.core import axes_scan  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  filename = getattr(axes_scan, "__file__", None)
  frame = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]
  while frame is not None:
    code = frame.f_code
    in_body = code.co_name == "body_fn" and code.co_filename == filename
    if in_body and frame.f_locals.get("init_mode") is True:
      return True
    frame = frame.f_back
  return False


def _named_batch_tracer(x: object) -> bool:
  return any(c.__name__ == "BatchTracer" for c in type(x).__mro__)


def _find_batch_tracer() -> type | None:
  # A jax that moves the class is still recognised by the class name (`_named_batch_tracer`).
  try:
    from jax._src.interpreters import batching  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return getattr(batching, "BatchTracer", None)


_BATCH_TRACER: type | None = _find_batch_tracer()


def iter_graph(node: tp.Any) -> tp.Iterator[tuple[tuple[tp.Any, ...], tp.Any]]:
  """(path, node) for every node of an NNX graph, following shared references once.

  flax 0.12's `nnx.iter_graph` takes `graph=` (tree mode would refuse shared references);
  0.10's has graph semantics only.
  """
  if _ITER_GRAPH_TAKES_GRAPH:
    return nnx.iter_graph(node, graph=True)
  return nnx.iter_graph(node)


_ITER_GRAPH_TAKES_GRAPH = "graph" in inspect.signature(nnx.iter_graph).parameters


# --- layer views (lb.layers.layer) ----------------------------------------------------------
# A layer view is a Variable of the stacked Variable's own type whose value reads and writes
# `parent[index]` (leading layer axis). flax 0.12 routes every read/write through
# `get_value(index=)` / `set_value(index=)` (and deprecates Variable hooks in favor of
# overriding those two); flax 0.10 routes them through the `.value` property. Both keep the
# link in two slots, so the link is not Variable metadata and never reaches a graphdef.
_VIEW_TYPES: dict[type, type] = {}
_NO_INDEX = object()


def _view_link(variable: tp.Any) -> tuple[tp.Any, tp.Any] | None:
  try:
    return (
      object.__getattribute__(variable, "_loopbridge_parent"),
      object.__getattribute__(variable, "_loopbridge_index"),
    )
  except AttributeError:  # crossed a transform boundary (re-created from its pytree): a copy
    return None


def _take(leaf: tp.Any, index: tp.Any) -> tp.Any:
  return jax.lax.dynamic_index_in_dim(leaf, index, 0, keepdims=False)


def _put(leaf: tp.Any, index: tp.Any, value: tp.Any) -> tp.Any:
  return jax.lax.dynamic_update_index_in_dim(leaf, jax.numpy.asarray(value, leaf.dtype), index, 0)


def _view_type(var_type: type) -> type:
  if var_type in _VIEW_TYPES:
    return _VIEW_TYPES[var_type]
  if hasattr(nnx.Variable, "get_value"):  # flax 0.12

    def get_value(self, *, index=_NO_INDEX):
      link = _view_link(self)
      if link is None:
        if index is _NO_INDEX:
          return var_type.get_value(self)
        return var_type.get_value(self, index=index)
      parent, i = link
      value = jax.tree.map(lambda leaf: _take(leaf, i), parent.get_value())
      return value if index is _NO_INDEX or index is Ellipsis else value[index]

    def set_value(self, value, *, index=_NO_INDEX):
      link = _view_link(self)
      if link is not None and index is not _NO_INDEX and index is not Ellipsis:
        value = self.get_value().at[index].set(value)
      if link is not None:
        parent, i = link
        parent.set_value(
          jax.tree.map(lambda full, new: _put(full, i, new), parent.get_value(), value)
        )
      self.set_raw_value(value)  # keep the snapshot (shape, dtype, pytree leaves) current

    namespace = {
      "__slots__": ("_loopbridge_parent", "_loopbridge_index"),
      "get_value": get_value,
      "set_value": set_value,
    }
  else:  # flax 0.10

    def _get(self):
      link = _view_link(self)
      if link is None:
        return var_type.value.fget(self)
      parent, i = link
      return jax.tree.map(lambda leaf: _take(leaf, i), parent.value)

    def _set(self, value):
      link = _view_link(self)
      if link is not None:
        parent, i = link
        parent.value = jax.tree.map(lambda full, new: _put(full, i, new), parent.value, value)
      var_type.value.fset(self, value)

    namespace = {
      "__slots__": ("_loopbridge_parent", "_loopbridge_index"),
      "value": property(_get, _set),
    }
  namespace["__module__"] = __name__
  namespace["__doc__"] = (
    f"A view of one layer of a stacked `{var_type.__name__}` (lb.layers.layer)."
  )
  view_type = type(var_type.__name__, (var_type,), namespace)
  _VIEW_TYPES[var_type] = view_type
  return view_type


def layer_view_variable(
  parent: nnx.Variable, index: tp.Any, snapshot: nnx.Variable
) -> nnx.Variable:
  """A Variable of `type(parent)` reading and writing `parent`'s value at `index` on axis 0.

  `snapshot` is an ordinary Variable already holding that slice (e.g. from `nnx.merge`); its
  value and metadata seed the view. Versions differ only inside `_view_type` (see above).
  """
  view_type = _view_type(type(parent))
  metadata = dict(snapshot.get_metadata())
  if hasattr(nnx.Variable, "get_value"):  # flax 0.12: constructor options live in metadata
    view = view_type(variable_value(snapshot), **metadata)
  else:
    view = view_type(snapshot.raw_value, **metadata)
  object.__setattr__(view, "_loopbridge_parent", parent)
  object.__setattr__(view, "_loopbridge_index", index)
  return view


@functools.cache
def tolinen_stores_graphdef() -> bool:
  """Whether `nnx.bridge.ToLinen` keeps its module's graphdef in an 'nnx' collection (flax 0.10).

  Such a wrapper rebuilds its module with `nnx.merge(stored graphdef, state)` and makes the
  Variables itself; flax 0.11 and later keep no graphdef and `nnx.update` a fresh module with
  the Linen variables. Read from one tiny init, once (flax 0.12.0 and 0.11 lack
  `Variable.get_value` yet behave like 0.12.8 here, so no other feature tells them apart).
  """
  wrapper = _bridge_wrappers.ToLinen(nnx.Linear, args=(1, 1))
  variables = wrapper.init(jax.random.key(0), jax.numpy.ones((1, 1)))
  return "nnx" in variables


def nnx_sow_input(value: object, variable_type: object) -> object:
  """An NNX module's accumulator as `nnx.bridge.ToLinen` must be given it to reduce into.

  flax 0.11+'s wrapper `nnx.update`s a fresh module with the Linen variables: a raw array
  becomes a plain attribute, which `Module.sow` refuses ("Expected 'tot' to be a Variable"), so
  it gets a Variable of the sow's type. flax 0.10's makes the Variables itself (by collection).
  """
  if tolinen_stores_graphdef():  # flax 0.10
    return value
  if isinstance(variable_type, str):
    from flax.nnx import variablelib

    variable_type = variablelib.variable_type_from_name(variable_type, allow_register=True)
  return tp.cast(tp.Callable[[object], nnx.Variable], variable_type)(value)


def tolinen_graphdef_with(
  graphdef: object,
  variables: tp.Mapping[str, object],
  added: tp.Mapping[tuple[str, ...], tuple[str, object]],
) -> object:
  """flax 0.10 `nnx.bridge.ToLinen`'s stored graphdef, grown by NNX Variables its module
  creates in apply (the accumulators of custom-reduce sows), so they can be given back.

  0.10's wrapper rebuilds its NNX module with `nnx.merge(stored graphdef, state)`, which refuses
  a key the graphdef lacks ("Unknown keys"). The module is rebuilt here as the wrapper does it
  (public NNX API), given the new Variables, and split again: records stay out of it.
  `variables`: the wrapper's Linen variables (collection -> its subtree, 'nnx' left out);
  `added`: path inside the NNX module -> (collection, value). flax 0.12's wrapper keeps no
  graphdef: `graphdef` is returned as it is there.
  """
  if not tolinen_stores_graphdef() or not added:  # flax 0.11 and later
    return graphdef
  from flax.core import meta
  from flax.nnx.bridge import variables as bridge_variables
  from flax.nnx.statelib import State

  states = jax.tree_util.tree_map_with_path(
    lambda kp, x: bridge_variables.to_nnx_var(bridge_variables.get_col_name(kp), x).to_state(),
    dict(variables),
    is_leaf=lambda x: isinstance(x, meta.AxisMetadata),
  )
  state = State.merge(*(State(v) for v in states.values())) if states else State({})
  module = nnx.merge(tp.cast(tp.Any, graphdef), state)
  for path, (collection, value) in added.items():
    owner = module
    for key in path[:-1]:
      owner = getattr(owner, key)
    setattr(owner, path[-1], bridge_variables.to_nnx_var(collection, value))
  return nnx.split(module)[0]


@contextlib.contextmanager
def quiet_nnx_accumulators(active: bool) -> tp.Iterator[None]:
  """Silence flax 0.12 ToLinen's "Found unknown module paths in incoming state" warning, for one
  call that gives an NNX module its accumulators back (`nnx_sow_input`): they are unknown to
  the freshly built module until its `sow` reduces into them, which is the point."""
  if not active:
    yield
    return
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Found unknown module paths in incoming state")
    yield


def is_layer_view(value: object) -> bool:
  """Whether `value` is a Variable of a layer view (`layer_view_variable`)."""
  return type(value) in _VIEW_TYPES.values()


def plain_variable(variable: nnx.Variable) -> nnx.Variable:
  """`variable` itself, or for a layer view (`layer_view_variable`) a Variable of the stacked
  type holding the layer's current value and metadata.

  flax's bridge finds a Variable's Linen collection by its exact type in a registry; a view's
  type is a subclass that is not (and must not be) registered: flax 0.12 refuses it, 0.10
  registers it under its class name and looks for the collection 'Param'.
  """
  view_type = type(variable)
  base = next((t for t, v in _VIEW_TYPES.items() if v is view_type), None)
  if base is None:
    return variable
  metadata = dict(variable.get_metadata())
  return base(variable_value(variable), **metadata)


# flax 0.12 keeps the value in the slot `_raw_value` and checks the trace level in
# `__setattr__` (even under `set_raw_value(..., _unsafe_bypass_check=True)`); 0.10 keeps it in
# the instance attribute `raw_value` and checks in `_setattr`.
_RAW_SLOT = "_raw_value" if "_raw_value" in getattr(nnx.Variable, "__slots__", ()) else None


def get_raw_value(variable: nnx.Variable) -> tp.Any:
  """A Variable's stored value without hooks or copies (what `nnx.split` puts in the state).

  flax 0.12 has `get_raw_value()` (the `.raw_value` property warns); 0.10 has the attribute only.
  """
  if _RAW_SLOT is not None:
    return object.__getattribute__(variable, _RAW_SLOT)
  return variable.raw_value


def set_raw_value(variable: nnx.Variable, value: object, *, check: bool = True) -> None:
  """Store a value in a Variable without hooks or copies (what `nnx.update` does with a state).

  flax 0.12 has `set_raw_value()` (the `.raw_value` setter warns); 0.10 has the attribute only.
  Both check the trace level on every write (~10 µs on 0.12); `check=False` skips that, for
  callers that know they run outside any trace (concrete values).
  """
  if _RAW_SLOT is not None:
    if check:
      variable.set_raw_value(value)
    else:
      object.__setattr__(variable, _RAW_SLOT, value)
  elif check:
    variable.raw_value = value
  else:
    object.__setattr__(variable, "raw_value", value)


def raw_value_accessors() -> tuple[
  tp.Callable[[nnx.Variable], tp.Any], tp.Callable[[nnx.Variable, tp.Any], None]
]:
  """(get, set) of a Variable's stored value as C-level callables, for per-call hot paths.

  Same as `get_raw_value` / `set_raw_value(..., check=False)` without a Python frame per
  Variable: `lb.compile_step` moves every leaf of a model on each call, and on a tiny model
  those frames cost as much as jax's own dispatch. `set` skips the trace-level check, so it is
  only for concrete values. flax 0.12: the `_raw_value` slot's descriptor (the class's
  `__setattr__` checks traces); 0.10: the instance attribute `raw_value`.
  """
  if _RAW_SLOT is not None:
    slot = nnx.Variable.__dict__[_RAW_SLOT]  # a member descriptor: __get__/__set__ in C
    return operator.attrgetter(_RAW_SLOT), slot.__set__

  def set_value(variable: nnx.Variable, value: tp.Any) -> None:
    object.__setattr__(variable, "raw_value", value)

  return operator.attrgetter("raw_value"), set_value


@functools.cache
def key_data_accessors() -> (
  tuple[tp.Callable[[nnx.Variable], tp.Any], tp.Callable[[nnx.Variable], tp.Any]] | None
):
  """(key data, key impl) getters of a Variable holding a typed PRNG key array, C-level.

  jax flattens a typed key array argument through a Python callback on every call of a jitted
  function; its uint32 data goes through the C++ path. The attributes are jax internals that
  every supported jax has (0.5.3 to 0.10.2); None if they are gone (keys then go as they are).
  Probed on first use, not at import: making a key starts the JAX backend, after which
  `jax.config.update('jax_num_cpu_devices', ...)` is refused.
  """
  key = jax.random.key(0)
  if not (hasattr(key, "_base_array") and hasattr(key, "_impl")):
    return None
  name = _RAW_SLOT or "raw_value"
  return operator.attrgetter(f"{name}._base_array"), operator.attrgetter(f"{name}._impl")


def is_concrete_typed_key(value: object) -> bool:
  """A typed PRNG key array holding its data (not a tracer), as `key_data_accessors` reads."""
  dtype = getattr(value, "dtype", None)
  return (
    dtype is not None
    and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key)
    and hasattr(value, "_base_array")
  )


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


def state_leaf_type(leaf: object) -> type:
  """The Variable type of one leaf of an `nnx.State`.

  flax 0.10 State leaves are `VariableState` objects naming their type in `.type`; flax 0.12
  removed `VariableState` and State leaves are the Variables themselves.
  """
  if type(leaf).__name__ == "VariableState":
    return leaf.type  # pyright: ignore[reportAttributeAccessIssue]  # flax 0.10 only
  return type(leaf)


def _partitioning_key() -> str:
  """The Variable metadata key under which `nnx.with_partitioning` records partition names.

  flax 0.10.2 uses `sharding`, 0.11 to 0.12.3 `sharding_names`, 0.12.4 on `out_sharding` (and
  warns that the older names are deprecated); each reads its own back in
  `nnx.get_partition_spec`, so buffers carrying it are sharded by the standard NNX recipe.
  Asked of flax itself: the initializer it returns boxes the value with that metadata.
  """
  boxed = nnx.with_partitioning(lambda *args: None, ("axis",))(None)
  names = [k for k, v in getattr(boxed, "metadata", {}).items() if v == ("axis",)]
  return names[0] if names else "sharding"


_SHARDING_KEY = _partitioning_key()


def sharding_metadata(names: tp.Sequence[str | None], mesh: object) -> dict[str, object]:
  """Variable metadata that records a partitioning (mesh axis names per axis) and its mesh."""
  return {_SHARDING_KEY: tuple(names), "mesh": mesh}


def variable_sharding(variable: nnx.Variable) -> tuple[tuple[tp.Any, ...] | None, tp.Any]:
  """(mesh axis names per axis, mesh) recorded in a Variable's metadata, or (None, None)."""
  if hasattr(variable, "get_metadata"):  # 0.12
    metadata = variable.get_metadata()
  else:  # 0.10 keeps metadata as plain instance attributes
    metadata = vars(variable)
  names = metadata.get(_SHARDING_KEY)
  return (tuple(names) if names is not None else None), metadata.get("mesh")


def mesh_context(mesh: jax.sharding.Mesh) -> tp.ContextManager[object]:
  """Make `mesh` the current mesh (what Linen's `nn.Partitioned` and flax's eager sharding read).

  jax >= 0.7 has `jax.set_mesh`; jax 0.5 uses the mesh itself as the (legacy) context that
  `flax.core.meta` 0.10 checks before constraining partitioned params.
  """
  if hasattr(jax, "set_mesh"):
    return jax.set_mesh(mesh)
  return mesh


def single_device_sharding(device: tp.Any, memory_kind: str | None = None) -> jax.sharding.Sharding:
  """The sharding that places an array on one device (in `memory_kind`, if given).

  jax 0.12 deprecates the class `jax.sharding.SingleDeviceSharding` (reading the name warns)
  for the factory `jax.sharding.make_single_device_sharding`; jax 0.5.3 and 0.10.2 have only
  the class. The factory is looked for first, so the deprecated name is never read where it
  exists.
  """
  make = getattr(jax.sharding, "make_single_device_sharding", None)
  if make is None:
    make = jax.sharding.SingleDeviceSharding
  return make(device, memory_kind=memory_kind)


def _stack_call_fails(run: tp.Callable[[tp.Any, jax.Array], object]) -> bool:
  """Whether `run(stack, x)` fails over a two-layer `nnx.vmap`-built stack holding a stream."""

  class _Layer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
      return self.drop(x, deterministic=True)

  @nnx.split_rngs(splits=2)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def make(rngs: nnx.Rngs) -> _Layer:
    return _Layer(rngs)

  try:
    run(make(nnx.Rngs(0)), jax.numpy.ones(2))
  except Exception:  # flax 0.10: the stream counts are not mapped along the stack
    return True
  return False


@functools.cache
def nnx_scan_needs_split_rngs() -> bool:
  """Whether `nnx.scan` over an `nnx.vmap`-built stack needs `nnx.split_rngs` around it.

  flax 0.10 scans a stack's rng stream counts as scalars ("axis 0 is out of bounds"), so a
  scan over a stack of layers holding a stream (a Dropout) needs the streams split around the
  call; flax 0.11 and 0.12 scan them as they are, and there the wrapper splits an already
  split key ("fold_in accepts a single key"). Decided by running one tiny scan, once.
  """

  def step(layer: tp.Any, x: jax.Array) -> tuple[jax.Array, None]:
    return layer(x), None

  scan = nnx.scan(step, in_axes=(0, nnx.Carry), out_axes=(nnx.Carry, 0))
  return _stack_call_fails(scan)


@functools.cache
def nnx_vmap_needs_split_rngs() -> bool:
  """Whether `nnx.vmap` over an `nnx.vmap`-built stack (its axis 0) needs `nnx.split_rngs`
  around it: as for `nnx.scan`, flax 0.10 maps the stack's stream counts, which are scalars
  ("rank should be at least 1"); flax 0.12 maps them as they are. Decided by running once."""
  return _stack_call_fails(nnx.vmap(lambda layer, x: layer(x), in_axes=(0, None), out_axes=0))


@functools.cache
def nnx_keeps_array_attributes() -> bool:
  """Whether an NNX module may keep a plain jax/numpy array as an attribute.

  flax 0.10's graph refuses one when the module is split ("Arrays leaves are not supported");
  flax 0.11 and 0.12 keep it (as a leaf of the module's state). Decided by splitting one tiny
  module that holds a numpy array, once.
  """
  import numpy as np

  class Holder(nnx.Module):
    def __init__(self) -> None:
      self.constant = np.zeros(())

  try:
    nnx.split(Holder())
  except ValueError:
    return False
  return True


def no_eager_sharding() -> tp.ContextManager[object]:
  """Create Variables from existing arrays as they are, keeping partitioning as metadata only.

  flax 0.12 shards a Variable with partitioning metadata eagerly at creation (which needs a
  mesh); `nnx.use_eager_sharding(False)` (flax >= 0.12.1) turns that off for the block, and on
  flax 0.12.0, which has only the process-wide flag `flax_always_shard_variable`, the flag is
  flipped for the block. flax 0.10 and 0.11 never shard eagerly.
  """
  import contextlib

  if hasattr(nnx, "use_eager_sharding"):
    return nnx.use_eager_sharding(False)
  if getattr(flax.config, "flax_always_shard_variable", False):
    return flax.config.temp_flip_flag("always_shard_variable", False)
  return contextlib.nullcontext()


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


# --- one difference each, used outside the core's Variable handling ----------------------------
def installed_versions() -> dict[str, str]:
  """The installed flax and jax versions, for reports (never to branch on)."""
  return {"flax": flax.__version__, "jax": jax.__version__}


def in_nnx_capture(module: nnx.Module) -> bool:
  """Whether `module` runs inside flax's `nnx.capture` (flax >= 0.12 only).

  flax 0.12's `nnx.capture` gives each module it watches a `__captures__` attribute for the
  duration of the call; flax 0.10 and 0.11 have no `nnx.capture`.
  """
  return hasattr(module, "__captures__")


def subclass_options(cls: type) -> dict[str, bool]:
  """Keyword arguments that make a subclass of the NNX module class `cls` keep its options.

  flax 0.12 Pytrees take `pytree=` when subclassed (`class M(nnx.Module, pytree=False)`) and
  record it as `_pytree__is_pytree`; flax 0.10 `nnx.Object`s take no such argument.
  """
  if hasattr(cls, "_pytree__is_pytree"):
    return {"pytree": bool(cls._pytree__is_pytree)}
  return {}


# flax >= 0.12 shards a Variable with partitioning metadata when it is created
# (`flax_always_shard_variable`, on by default), which needs a mesh; it says so in a
# ValueError with this text (flax 0.10 and 0.11 never shard at creation).
_NO_MESH_MARK = "An auto mesh context or metadata is required"


def is_missing_mesh_error(error: BaseException) -> bool:
  """Whether `error` is flax 0.12's refusal to create a partitioned Variable without a mesh."""
  return isinstance(error, ValueError) and _NO_MESH_MARK in str(error)


def stock_sow_tuple_length(node: object, children: tp.Mapping[object, object]) -> int | None:
  """How many sown values a stock bridge's tuple holds, when `node` is one; else None.

  flax 0.10's stock `nnx.bridge.ToNNX` keeps a sow tuple as a tuple of Variables, one per
  value (flax 0.12 keeps it as one Variable holding a tuple, which needs no help).
  """
  if (
    isinstance(node, tuple)
    and children
    and all(isinstance(c, nnx.Variable) for c in children.values())
  ):
    return len(children)
  return None


# --- Linen lifted transforms (lb.checkpoint.linen_to_nnx) -------------------------------------
def linen_variable_axes(module: object) -> dict[str, int] | None:
  """The `variable_axes` an `nn.scan` / `nn.vmap` module class was made with, by collection
  name (string keys and int axes only), or None.

  Linen keeps the transform's keyword arguments in the closure of the lifted class's methods
  (flax 0.10.2 through 0.12.8 alike: `module_class_lift_transform`'s `trafo_kwargs`); no
  public attribute holds them. A flax that keeps them elsewhere gives None, and the caller
  decides the layer axis by running the models instead.
  """
  method = type(module).__dict__.get("__call__")
  for cell in getattr(method, "__closure__", None) or ():
    try:
      value = cell.cell_contents
    except ValueError:  # an empty cell
      continue
    if isinstance(value, dict) and isinstance(value.get("variable_axes"), tp.Mapping):
      return {
        k: a
        for k, a in value["variable_axes"].items()
        if isinstance(k, str) and isinstance(a, int) and not isinstance(a, bool) and a >= 0
      }
  return None


# --- nnx.Optimizer (lb.checkpoint.linen_to_nnx, its tests and guide) -------------------------
_OPTIMIZER_UPDATE_TAKES_MODEL = "model" in inspect.signature(nnx.Optimizer.update).parameters


def optimizer_update(optimizer: nnx.Optimizer, model: nnx.Module, grads: nnx.State) -> None:
  """One `nnx.Optimizer` update.

  flax 0.11 made the model an argument (`update(model, grads)`; the optimizer no longer holds
  it); 0.10 takes `update(grads)` and updates the model it was built on.
  """
  if _OPTIMIZER_UPDATE_TAKES_MODEL:
    optimizer.update(model, grads)  # pyright: ignore[reportCallIssue]
  else:
    optimizer.update(grads)  # pyright: ignore[reportCallIssue]


def trace_of(x: object) -> object | None:
  """The trace a tracer belongs to (None for a concrete value, or where jax does not say).

  jax keeps it as the private `Tracer._trace` (since the stackless tracing of 0.4.36; read on
  jax 0.5.3 and 0.10.2). Used only to tell a value of a `jax.jit` body from one of a loop
  inside it; a jax without it gives None, and callers then treat the value as nested (the
  conservative answer).
  """
  return getattr(x, "_trace", None) if isinstance(x, jax.core.Tracer) else None  # pyright: ignore[reportAttributeAccessIssue]
