"""A bridged part's Linen variables: reading them as a Linen dict and adding new ones.

`flax.nnx.bridge.ToNNX` keeps each top-level Linen variable name as an attribute holding
Variables; these helpers go between that layout and Linen's `{'params': ..., ...}` dict, using
the stock conversions so metadata boxes (partitioning) survive.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util
from flax.core import meta
from flax.nnx import bridge
from flax.nnx.bridge import variables as bridge_variables

from .. import _compat
from .errors import ShardingError, StructureChangeError
from .site import NNXAccumulatorInit

# A Linen variables dict: collection -> nested dict of values ({'params': {...}, ...}).
LinenVariables = tp.Mapping[str, tp.Mapping[str, object]]
# A Linen variable's value: an array, a number, or a static object (flax 0.10 ToLinen's graphdef).
Value = tp.Any


def attrs(node: bridge.ToNNX) -> dict[str, object]:
  """The attributes of a bridged node that hold Linen variables, by name."""
  return {name: getattr(node, name) for name in _compat.linen_attribute_names(node)}


def to_linen(attributes: tp.Mapping[str, object]) -> dict[str, tp.Any]:
  """Stock conversion of a bridged node's attributes to a Linen variables dict, for a layer
  of a stack too (`lb.layers.layer`: its Variables are views, read as the layer's values)."""
  is_variable = lambda v: isinstance(v, nnx.Variable)  # noqa: E731
  if not any(map(_compat.is_layer_view, jax.tree.leaves(dict(attributes), is_leaf=is_variable))):
    return bridge_variables.nnx_attrs_to_linen_vars(dict(attributes))  # the common case
  plain = jax.tree.map(
    lambda v: _compat.plain_variable(v) if is_variable(v) else v,
    dict(attributes),
    is_leaf=is_variable,
  )
  return bridge_variables.nnx_attrs_to_linen_vars(plain)


def linen_variables(model: object) -> dict[str, tp.Any]:
  """A bridged model's Linen variables, as the dict `linen_module.apply` takes.

  Use it for reference computations with the plain Linen module (same parameters), or to
  save them in a Linen checkpoint. Partitioning metadata boxes are kept, as stock
  `flax.nnx.bridge` converts them; record buffers are not Linen variables and are left out.

  Args:
    model: an `lb.ToNNX` (or stock `flax.nnx.bridge.ToNNX`) after `lazy_init`.

  Returns:
    A dict such as `{'params': {...}, 'batch_stats': {...}}`.

  Raises:
    TypeError: `model` is not a bridged Linen module.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> model = lb.lazy_init(lb.ToNNX(nn.Dense(2), rngs=nnx.Rngs(0)), jnp.ones((1, 3)))
    >>> variables = lb.linen_variables(model)
    >>> bool((nn.Dense(2).apply(variables, jnp.ones((1, 3))) == model(jnp.ones((1, 3)))).all())
    True
  """
  if not isinstance(model, bridge.ToNNX):
    raise TypeError(
      f"lb.linen_variables needs a bridged Linen module (lb.ToNNX), got "
      f"{type(model).__name__}. Fix: pass the lb.ToNNX part of the model (e.g. policy.llm)."
    )
  return to_linen(attrs(model))


def unbox(value: object, *, constrain: bool = True) -> Value:
  """The raw value of a boxed Linen variable (partitioning or NNX metadata); others as they are.

  `constrain=False`: a partitioned value is not given a sharding constraint (values loaded
  from outside are placed later, by the standard NNX recipe).
  """
  if isinstance(value, meta.Partitioned) and not constrain:  # LogicallyPartitioned too
    return value.unbox(apply_constraint=False)
  if isinstance(value, meta.AxisMetadata):
    return value.unbox()
  if isinstance(value, bridge_variables.NNXMeta):
    return value.value
  return value


def is_data(value: object) -> bool:
  """Whether a Linen variable holds array data (an array or a number), rather than a static
  value such as the graphdef flax 0.10's `nnx.bridge.ToLinen` keeps in its 'nnx' collection."""
  numbers = (np.ndarray, np.generic, int, float, complex, bool)
  return isinstance(value, numbers) or (hasattr(value, "shape") and hasattr(value, "dtype"))


def is_static_rewrite(old: object, new: object) -> bool:
  """Whether `new` is a static (non-array) value written over a static value of its type.

  flax 0.10's `nnx.bridge.ToLinen` puts its NNX module's graphdef into the 'nnx' collection
  on every mutable call: a new object each time, equal in structure but not `==`. A loop
  cannot carry a changed static value (it is part of the carry's structure) and the module's
  structure cannot change inside a trace, so the value already held is kept.
  """
  old, new = unbox(old), unbox(new)
  leaves = jax.tree.leaves((old, new))
  return type(old) is type(new) and not is_data(new) and not any(map(is_data, leaves))


# The stock bridge fails the same way, with a message that does not say how to get past it.
NO_MESH_FOR_PARTITIONED = (
  "lb.ToNNX({model}) cannot create its partition-annotated params: {flax_message} Why: from "
  "flax 0.12 on, a Variable with partitioning metadata (nn.with_logical_partitioning, "
  "nn.with_partitioning) is sharded when it is created (the flax flag "
  "flax_always_shard_variable, on by default), which needs a mesh; flax 0.10 kept the "
  "annotation as metadata only. Fix: either initialize under a mesh and your logical axis "
  "rules, e.g.\n"
  "  mesh = jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))\n"
  "  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):\n"
  "    lb.lazy_init(model, *sample_args, capacity=N)\n"
  "or create the params unsharded as flax 0.10 did: wrap the call in "
  "`with nnx.use_eager_sharding(False):`, or set it for the process with "
  "flax.config.update('flax_always_shard_variable', False)."
)


def _nnx_attrs(node: bridge.ToNNX, variables: LinenVariables) -> dict[str, object]:
  """Stock conversion of a Linen variables dict to ToNNX attributes (Variables)."""
  try:
    return bridge_variables.linen_vars_to_nnx_attrs(dict(variables))
  except ValueError as error:
    if not _compat.is_missing_mesh_error(error):
      raise
    raise ShardingError(
      NO_MESH_FOR_PARTITIONED.format(
        model=type(_compat.linen_module_of(node)).__name__, flax_message=error
      )
    ) from error


def set_variables(node: bridge.ToNNX, variables: LinenVariables) -> None:
  """Store a Linen variables dict on the node as stock `ToNNX` does after `init`."""
  for name, value in _nnx_attrs(node, variables).items():
    _compat.set_data_attribute(node, name, value)
  names = {key for tree in variables.values() for key in tree}
  _compat.set_linen_attribute_names(node, set(_compat.linen_attribute_names(node)) | names)


def add_variables(node: bridge.ToNNX, variables: LinenVariables) -> None:
  """Add new Linen variables next to the existing ones (existing Variables stay as they are)."""
  for name, value in _nnx_attrs(node, variables).items():
    existing = getattr(node, name, None) if name in _compat.linen_attribute_names(node) else None
    if isinstance(existing, dict) and isinstance(value, dict):
      merged = traverse_util.unflatten_dict(
        {**traverse_util.flatten_dict(existing), **traverse_util.flatten_dict(value)}
      )
      _compat.set_data_attribute(node, name, merged)
    else:
      _compat.set_data_attribute(node, name, value)
  names = {key for tree in variables.values() for key in tree}
  _compat.set_linen_attribute_names(node, set(_compat.linen_attribute_names(node)) | names)


def add_accumulators(
  node: bridge.ToNNX, new: tp.Mapping[tuple[str, ...], tuple[tp.Callable[[], object], object]]
) -> None:
  """Give custom-reduce sows their `init_fn()` value now, so no call creates a Variable.

  Linen's `sow` starts an accumulator from `init_fn()` when it does not exist yet; storing that
  value before the first call is therefore equivalent, and keeps the structure fixed. Inside
  `nn.scan`/`nn.vmap` Linen stores the accumulator stacked, so the initial value is broadcast
  to the (abstract) shape discovery saw.
  """
  if not new:
    return
  variables: dict = {}
  for site, (init_fn, target) in new.items():

    def fit(init, want, site=site):
      init = jnp.asarray(init)
      if want is None or init.shape == tuple(want.shape):
        return init
      try:
        return jnp.broadcast_to(init, want.shape).astype(want.dtype)
      except ValueError:
        raise StructureChangeError(
          f"the accumulator sown at '{'/'.join(site)}' starts as init_fn() of shape "
          f"{init.shape} but Linen stores it as {tuple(want.shape)} (a lifted transform "
          "stacks it on a non-leading axis). Why: loopbridge must create it before the "
          "loop. Fix: stack it on axis 0 (variable_axes={'intermediates': 0}) or sow it "
          "outside the transform."
        ) from None

    initial = init_fn()
    if target is not None:
      initial = jax.tree.map(fit, initial, target)
    tree = variables
    for key in site[:-1]:
      tree = tree.setdefault(key, {})
    tree[site[-1]] = initial
    if isinstance(init_fn, NNXAccumulatorInit):
      nnx_sown = dict(getattr(node, NNX_ACCUMULATORS_ATTR, ()))
      nnx_sown[site] = init_fn.variable_type
      setattr(node, NNX_ACCUMULATORS_ATTR, tuple(sorted(nnx_sown.items())))
  add_variables(node, variables)
  _grow_tolinen_graphdefs(node)


# Static on a bridged node: ((site, variable type), ...) of the NNX modules' accumulators
# (see `NNXAccumulatorInit`), which every call passes back in as Variables.
NNX_ACCUMULATORS_ATTR = "loopbridge__nnx_accumulators"
# Static on a bridged node (flax 0.10 only): ((path of a ToLinen part, the graphdef it stored,
# that graphdef grown by the part's accumulators), ...), see `_grow_tolinen_graphdefs`.
TOLINEN_GRAPHDEFS_ATTR = "loopbridge__tolinen_graphdefs"


def call_variables(node: bridge.ToNNX) -> dict[str, tp.Any]:
  """The Linen variables a call of the node's module takes: `to_linen` of its attributes, the
  accumulators of NNX modules inside it given as flax's wrapper needs them to reduce into
  (and, on flax 0.10, with a graphdef that names them)."""
  variables = to_linen(attrs(node))
  for part, stored, grown in getattr(node, TOLINEN_GRAPHDEFS_ATTR, ()):
    held = _nested(variables.get("nnx", {}), part)
    if isinstance(held, dict) and "graphdef" in held:
      # A graphdef replaced since (Linen variables loaded into the model) is grown anew.
      held["graphdef"] = grown if held["graphdef"] == stored else _grown(node, variables, part)
  for site, variable_type in getattr(node, NNX_ACCUMULATORS_ATTR, ()):
    tree = variables
    for key in site[:-1]:
      tree = tree.get(key, {}) if isinstance(tree, dict) else {}
    if isinstance(tree, dict) and site[-1] in tree:
      tree[site[-1]] = _compat.nnx_sow_input(tree[site[-1]], variable_type)
  return variables


def _grow_tolinen_graphdefs(node: bridge.ToNNX) -> None:
  """Keep, for each flax 0.10 ToLinen part with NNX accumulators, the graphdef calls give it.

  0.10's `nnx.bridge.ToLinen` rebuilds its NNX module from the graphdef it stored at init,
  which lacks the accumulator a custom-reduce `sow` creates in apply: passed back in, it would
  be an unknown key. Calls therefore get that graphdef grown by the accumulators
  (`_compat.tolinen_graphdef_with`). The Linen variables keep the graphdef plain Linen
  stored, so they still run in plain Linen without the records (a grown graphdef there asks
  for the accumulator: "Expected key ... in state"). flax 0.12 stores no graphdef.
  """
  if not _compat.tolinen_stores_graphdef():
    return
  variables = to_linen(attrs(node))
  grown = []
  for key, stored in traverse_util.flatten_dict(dict(variables.get("nnx", {}))).items():
    if key[-1] == "graphdef" and not is_data(stored):
      part = key[:-1]
      new = _grown(node, variables, part)
      if new is not stored:
        grown.append((part, stored, new))
  setattr(node, TOLINEN_GRAPHDEFS_ATTR, tuple(grown))


def _grown(node: bridge.ToNNX, variables: tp.Mapping[str, tp.Any], part: tuple[str, ...]) -> object:
  """The graphdef stored for the ToLinen part at `part`, grown by its NNX accumulators."""
  stored = _nested(variables["nnx"], part)["graphdef"]
  mine = {
    site[1 + len(part) :]: (site[0], _nested(variables, site))
    for site, _ in getattr(node, NNX_ACCUMULATORS_ATTR, ())
    if site[1 : 1 + len(part)] == part and _nested(variables, site) is not None
  }
  if not mine:
    return stored
  # The part's own variables, but for the accumulators: those are what the graphdef lacks.
  added = {(c, *q) for q, (c, _) in mine.items()}
  inside = {}
  for col, tree in variables.items():
    subtree = _nested(tree, part)
    if col != "nnx" and isinstance(subtree, tp.Mapping):
      flat = traverse_util.flatten_dict(dict(subtree))
      inside[col] = traverse_util.unflatten_dict(
        {p: v for p, v in flat.items() if (col, *p) not in added}
      )
  return _compat.tolinen_graphdef_with(stored, inside, mine)


def _nested(tree: tp.Any, path: tp.Sequence[str]) -> tp.Any:
  for key in path:
    if not isinstance(tree, tp.Mapping) or key not in tree:
      return None
    tree = tree[key]
  return tree
