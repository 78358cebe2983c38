"""Every difference between the supported flax versions, in one place.

Supported: every flax minor from 0.10.2 + jax 0.5.3 (what openpi pins) through flax 0.12.12 +
jax 0.12.1; the tested pairs are the files in `constraints/` (README, "Supported versions").
Each function below hides exactly one difference and tests for the capability itself (a
signature, an attribute), not the version number; the comment says which versions differ and
how. Code elsewhere in the package never checks a version itself (`tests/test_layering.py`).
Three jobs live in modules of their own: `installed_pair.py`, the one check that reads version
numbers (from package metadata, before flax is imported), `orbax_metadata.py`, reading
back what orbax saved, and `jaxpr_reading.py`, reading jaxpr equations (whose param names JAX
renames between minors) with a conservative fallback for every read. The differences of one
kind of object have a module each, re-exported here: `variables.py` (a Variable's value,
metadata, raw slot and typed keys), `layer_views.py` (one layer's view of a stacked Variable),
`graphs.py` (walking, splitting, cloning graphs), `placement.py` (shardings and meshes),
`nnx_transforms.py` (what `nnx.scan`/`nnx.vmap` need) and `to_linen.py` (flax's `ToLinen`).
"""

from __future__ import annotations

import inspect
import sys
import typing as tp

# Re-exported: `_compat` is the one import for every difference.
from .installed_pair import broken_pair_message as broken_pair_message
from .installed_pair import check_installed_pair, version_tuple
from .orbax_metadata import orbax_custom_metadata as orbax_custom_metadata
from .orbax_metadata import orbax_tree_metadata as orbax_tree_metadata
from .symbolic_initializers import symbolic_safe_initializers as symbolic_safe_initializers
from .symbolic_initializers import symbolic_safe_modules as symbolic_safe_modules

check_installed_pair()

# After the pair check: on a broken pair these imports fail deep inside flax.
import flax  # noqa: E402
import jax  # noqa: E402
from flax import linen, nnx  # noqa: E402
from flax.nnx.bridge import wrappers as _bridge_wrappers  # noqa: E402

from .graphs import NNX_INTERNAL_PREFIXES as NNX_INTERNAL_PREFIXES  # noqa: E402
from .graphs import Node as Node  # noqa: E402
from .graphs import clone_graph as clone_graph  # noqa: E402
from .graphs import graph_children as graph_children  # noqa: E402
from .graphs import iter_graph as iter_graph  # noqa: E402
from .graphs import split_graph as split_graph  # noqa: E402
from .jaxpr_reading import eval_jaxpr as eval_jaxpr  # noqa: E402
from .jaxpr_reading import forwarded_inputs as forwarded_inputs  # noqa: E402
from .jaxpr_reading import used_inputs as used_inputs  # noqa: E402
from .layer_views import is_layer_view as is_layer_view  # noqa: E402
from .layer_views import layer_view_variable as layer_view_variable  # noqa: E402
from .layer_views import plain_variable as plain_variable  # noqa: E402
from .nnx_transforms import nnx_keeps_array_attributes as nnx_keeps_array_attributes  # noqa: E402
from .nnx_transforms import nnx_scan_needs_split_rngs as nnx_scan_needs_split_rngs  # noqa: E402
from .nnx_transforms import nnx_vmap_needs_split_rngs as nnx_vmap_needs_split_rngs  # noqa: E402
from .placement import is_missing_mesh_error as is_missing_mesh_error  # noqa: E402
from .placement import mesh_context as mesh_context  # noqa: E402
from .placement import no_eager_sharding as no_eager_sharding  # noqa: E402
from .placement import sharding_metadata as sharding_metadata  # noqa: E402
from .placement import single_device_sharding as single_device_sharding  # noqa: E402
from .placement import variable_sharding as variable_sharding  # noqa: E402
from .to_linen import nnx_sow_input as nnx_sow_input  # noqa: E402
from .to_linen import quiet_nnx_accumulators as quiet_nnx_accumulators  # noqa: E402
from .to_linen import tolinen_graphdef_with as tolinen_graphdef_with  # noqa: E402
from .to_linen import tolinen_stores_graphdef as tolinen_stores_graphdef  # noqa: E402
from .variables import collection_name as collection_name  # noqa: E402
from .variables import drop_variable_metadata as drop_variable_metadata  # noqa: E402
from .variables import get_raw_value as get_raw_value  # noqa: E402
from .variables import is_concrete_typed_key as is_concrete_typed_key  # noqa: E402
from .variables import key_data_accessors as key_data_accessors  # noqa: E402
from .variables import raw_value_accessors as raw_value_accessors  # noqa: E402
from .variables import register_variable_type_source as register_variable_type_source  # noqa: E402
from .variables import set_raw_value as set_raw_value  # noqa: E402
from .variables import set_variable_metadata as set_variable_metadata  # noqa: E402
from .variables import set_variable_value as set_variable_value  # noqa: E402
from .variables import state_leaf_type as state_leaf_type  # noqa: E402
from .variables import variable_value as variable_value  # noqa: E402

FLAX_VERSION: tuple[int, ...] = version_tuple(flax.__version__)
JAX_VERSION: tuple[int, ...] = version_tuple(jax.__version__)

# A bridge's `rngs`: streams, one key, or none (as stock `ToNNX` takes them).
RngsArg = nnx.Rngs | jax.Array | None

# flax 0.11.1 renamed nnx.Object to nnx.Pytree and its per-instance state attribute from
# `_object__state` to `_pytree__state`.
_STATE_ATTR = "_pytree__state" if hasattr(nnx, "Pytree") else "_object__state"

# flax >= 0.12.5 loops and transforms accept `graph=` (graph mode vs tree mode, FLIP 5310;
# `nnx.jit` alone from 0.12.4); 0.10.2 to 0.12.4 loops have graph mode only.
HAS_GRAPH_SWITCH: bool = "graph" in inspect.signature(nnx.while_loop).parameters

# Prefixes of attributes on a bridge.ToNNX that are not Linen variables. flax 0.12 namespaces
# its own (`to_nnx__module`, `to_nnx__rngs`); 0.10 uses plain `module`, `rngs`,
# `linen_attributes` and records the Linen attribute names itself.
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
