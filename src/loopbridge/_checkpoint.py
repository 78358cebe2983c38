"""Saving and restoring recording models with orbax, and loading existing Linen variables.

A recording model's whole state is its NNX Variables: the Linen variables (params,
batch_stats, ...), the record `Buffer`s and `Count`s, and the rng streams (keys and counts).
`save_checkpoint` writes every one of them with orbax (the checkpoint library flax uses);
`restore_checkpoint` writes them back *into the existing Variables* of a model declared the
same way, so a loop can stop mid-way and go on in another process and record exactly what an
uninterrupted run records. Before orbax reads anything the saved tree is compared with the
model's (paths, shapes, dtypes): orbax alone would silently pad or truncate a differently
shaped buffer.

Checkpoints hold raw arrays keyed by the model's attribute paths; typed PRNG keys are stored
as their key data and re-wrapped with the target key's implementation. Paths follow the
installed flax's attribute names, so restore with the flax version that saved.

`from_linen_variables` builds an `lb.ToNNX` around variables that already exist (from
`linen.init` or a Linen checkpoint) without initializing anything; `load_linen_variables`
writes such variables into an initialized model in place.
"""

from __future__ import annotations

import os
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import traverse_util
from flax.core import meta
from flax.nnx.bridge import variables as bridge_variables

from . import _compat
from . import _linen_vars
from . import _observe_linen
from . import _pipeline
from . import _recorder
from . import _session
from ._errors import CheckpointError, NotInitializedError
from ._to_nnx import ToNNX

_FIX_DECLARE = (
    "Fix: build the fresh model from the same Linen module and declare it like the saved one "
    "before restoring: lb.lazy_init(model, *sample_args, capacity=..., overflow=...) with the "
    "same sample shapes and capacities (and lb.preallocate for any signature declared later).")


def _key_str(key: tp.Any) -> str:
  return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))


def _model_variables(model: tp.Any) -> dict[tuple[str, ...], nnx.Variable]:
  """Every Variable of the model's graph by its attribute path (shared ones once)."""
  if not isinstance(model, nnx.Module):
    raise TypeError(
        f"expected an NNX module (e.g. an lb.ToNNX after lb.lazy_init), got "
        f"{type(model).__name__}.")
  return {tuple(_key_str(k) for k in path): node
          for path, node in _compat.iter_graph(model) if isinstance(node, nnx.Variable)}


def _is_key(value: tp.Any) -> bool:
  return jnp.issubdtype(jnp.result_type(value), jax.dtypes.prng_key)


def _saved_form(value: tp.Any) -> tp.Any:
  return jax.random.key_data(value) if _is_key(value) else value


def _checkpointer() -> tp.Any:
  import orbax.checkpoint as ocp  # flax depends on it; imported only when used

  return ocp.StandardCheckpointer()


def _describe(shape: tp.Any, dtype: tp.Any) -> str:
  return f"{tuple(shape)} {np.dtype(dtype).name if not isinstance(dtype, str) else dtype}"


def save_checkpoint(directory: str | os.PathLike, model: tp.Any, *,
                    overwrite: bool = False) -> str:
  """Save a model's full state (params, buffers, counts, rng streams) with orbax.

  Safe mid-loop: call it between loop segments on the model the loop updates in place.

  Args:
    directory: where to write the checkpoint (a new directory; made absolute).
    model: an `lb.ToNNX` (or any NNX module holding some).
    overwrite: replace an existing checkpoint at `directory`.

  Returns:
    The absolute checkpoint path.

  Example:
    >>> import tempfile, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3)
    >>> _ = model(jnp.ones(2))
    >>> path = lb.save_checkpoint(tempfile.mkdtemp() + "/step_1", model)
    >>> fresh = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3)
    >>> int(lb.counts(lb.restore_checkpoint(path, fresh))["intermediates"]["x"])
    1
  """
  path = os.path.abspath(os.fspath(directory))
  tree: dict = {}
  for key, variable in _model_variables(model).items():
    tree[key] = _saved_form(_compat.variable_value(variable))
  checkpointer = _checkpointer()
  checkpointer.save(path, traverse_util.unflatten_dict(tree), force=overwrite)
  checkpointer.wait_until_finished()
  return path


def _saved_shapes(checkpointer: tp.Any, path: str) -> dict[tuple[str, ...], tuple[tp.Any, tp.Any]]:
  metadata = checkpointer.metadata(path)
  # orbax 0.12 wraps the tree in a StepMetadata (`item_metadata`); 0.11 returns the tree.
  metadata = getattr(metadata, "item_metadata", metadata)
  metadata = getattr(metadata, "tree", metadata)
  flat = traverse_util.flatten_dict(dict(metadata))
  return {tuple(map(str, k)): (tuple(v.shape), np.dtype(v.dtype)) for k, v in flat.items()}


def restore_checkpoint(directory: str | os.PathLike, model: tp.Any) -> tp.Any:
  """Restore a `save_checkpoint` into a model declared like the saved one, in place.

  Args:
    directory: the checkpoint path `save_checkpoint` returned.
    model: a fresh `lb.ToNNX` of the same Linen module, `lb.lazy_init`-ed (and
      `lb.preallocate`-d) with the same sample shapes, capacities and overflow policies.

  Returns:
    `model`, holding the saved params, buffers, counts and rng state (same Variables).

  Raises:
    CheckpointError: no checkpoint at `directory`, or its tree (paths, shapes, dtypes)
      differs from the model's; the message lists the differences.

  Example:
    >>> import tempfile, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> path = lb.save_checkpoint(tempfile.mkdtemp() + "/c",
    ...                           lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3))
    >>> _ = lb.restore_checkpoint(path, lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3))
  """
  path = os.path.abspath(os.fspath(directory))
  if not os.path.isdir(path):
    raise CheckpointError(
        f"no checkpoint at {path}. Fix: pass the path lb.save_checkpoint returned.")
  variables = _model_variables(model)
  checkpointer = _checkpointer()
  saved = _saved_shapes(checkpointer, path)
  expected = {}
  for key, variable in variables.items():
    value = _saved_form(_compat.variable_value(variable))
    expected[key] = (tuple(np.shape(value)), np.dtype(jnp.result_type(value)))
  missing = sorted(set(expected) - set(saved))
  extra = sorted(set(saved) - set(expected))
  differ = sorted(k for k in set(saved) & set(expected) if saved[k] != expected[k])
  if missing or extra or differ:
    lines = []
    if differ:
      lines.append("different shape/dtype: " + "; ".join(
          f"{'/'.join(k)} saved {_describe(*saved[k])} vs model {_describe(*expected[k])}"
          for k in differ[:8]) + (" ..." if len(differ) > 8 else ""))
    if missing:
      lines.append("in the model but not saved: " + ", ".join("/".join(k) for k in missing[:8])
                   + (" ..." if len(missing) > 8 else ""))
    if extra:
      lines.append("saved but not in the model: " + ", ".join("/".join(k) for k in extra[:8])
                   + (" ..." if len(extra) > 8 else ""))
    raise CheckpointError(
        f"the checkpoint at {path} does not match the model's structure: "
        + "; ".join(lines) + ". Why: restoring writes into the model's existing Variables "
        "(NNX loops need them unchanged), so every saved array must find a Variable of the "
        f"same shape and dtype. {_FIX_DECLARE}")
  target = {}
  for key, variable in variables.items():
    value = _saved_form(_compat.variable_value(variable))
    target[key] = jax.ShapeDtypeStruct(np.shape(value), jnp.result_type(value),
                                       sharding=getattr(value, "sharding", None))
  restored = traverse_util.flatten_dict(
      checkpointer.restore(path, traverse_util.unflatten_dict(target)))
  restored = {tuple(map(str, k)): v for k, v in restored.items()}
  for key, variable in variables.items():
    value = restored[key]
    current = _compat.variable_value(variable)
    if _is_key(current):
      value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(current))
    _compat.set_variable_value(variable, value)
  return model


# ---------------------------------------------------------------- existing Linen variables

def _plain_variables(variables: tp.Any, what: str) -> dict:
  from flax.core import unfreeze

  if not isinstance(variables, tp.Mapping):
    raise CheckpointError(
        f"{what} needs a Linen variables dict like linen.init returns "
        f"({{'params': {{...}}, ...}}), got {type(variables).__name__}.")
  variables = unfreeze(variables) if hasattr(variables, "unfreeze") else dict(variables)
  return variables


def _unbox(value: tp.Any) -> tp.Any:
  """The raw value of a boxed Linen variable, without applying a sharding constraint."""
  if isinstance(value, meta.Partitioned):  # includes LogicallyPartitioned
    return value.unbox(apply_constraint=False)
  if isinstance(value, meta.AxisMetadata):
    return value.unbox()
  return value


def _unboxed_leaves(tree: tp.Any) -> dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype]]:
  flat = traverse_util.flatten_dict(
      dict(tree), is_leaf=lambda _, v: isinstance(v, (meta.AxisMetadata, tuple)))
  out = {}
  for path, value in flat.items():
    if isinstance(value, tuple):  # a sown record, not state
      continue
    value = _unbox(value)
    out[tuple(map(str, path))] = (tuple(np.shape(value)), np.dtype(jnp.result_type(value)))
  return out


def _check_linen_structure(given: dict, expected: dict, what: str, module_name: str) -> None:
  have, want = _unboxed_leaves(given), _unboxed_leaves(expected)
  missing = sorted(set(want) - set(have))
  extra = sorted(set(have) - set(want))
  differ = sorted(k for k in set(have) & set(want) if have[k] != want[k])
  if not (missing or extra or differ):
    return
  lines = []
  if differ:
    lines.append("different shape/dtype: " + "; ".join(
        f"{'/'.join(k)} given {_describe(*have[k])} vs module {_describe(*want[k])}"
        for k in differ[:8]))
  if missing:
    lines.append("missing: " + ", ".join("/".join(k) for k in missing[:8]))
  if extra:
    lines.append("not in the module: " + ", ".join("/".join(k) for k in extra[:8]))
  hint = ""
  if "params" not in given and any(k[0] == "params" and k[1] in given for k in want):
    hint = " (it looks like a bare params tree: pass {'params': params})"
  raise CheckpointError(
      f"{what}: the variables do not match what {module_name} creates for these sample "
      f"arguments{hint}: " + "; ".join(lines) + ". Why: the variables are used as they are, "
      "without initializing, so they must have exactly the module's structure. Fix: pass the "
      "dict linen.init (or the Linen checkpoint) produced for this module, with sample "
      "arguments of the shapes it was initialized with.")


def from_linen_variables(module: tp.Any, variables: tp.Mapping[str, tp.Any], *args: tp.Any,
                         capacity: tp.Any = None, overflow: str = "error", rngs: tp.Any = None,
                         method: tp.Any = None, **kwargs: tp.Any) -> tp.Any:
  """Wrap a Linen module around variables that already exist, without initializing.

  The variables (from `linen.init`, a Linen checkpoint, or a converted model) become the
  model's Variables as `lb.lazy_init` would have created them (partitioning metadata kept);
  the sample arguments are only traced abstractly to check the structure and to declare the
  sow buffers. No initializer runs and no rng stream is consumed.

  Args:
    module: the Linen module the variables belong to.
    variables: a Linen variables dict, e.g. `{'params': ..., 'batch_stats': ...}`.
    *args: sample inputs of the call the loop makes (shapes and dtypes only).
    capacity: as for `lb.lazy_init`.
    overflow: as for `lb.lazy_init`.
    rngs: the model's rng streams for later calls (e.g. dropout), as for `lb.ToNNX`.
    method: the Linen method the loop calls, default `__call__`.
    **kwargs: keyword arguments of that call.

  Returns:
    An initialized `lb.ToNNX`.

  Raises:
    CheckpointError: `variables` is not a dict, or its paths/shapes/dtypes differ from what
      `module.init` would create for these arguments.
    CapacityError: as for `lb.lazy_init`.

  Example:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return nn.Dense(2)(x)
    >>> variables = Net().init(jax.random.key(0), jnp.ones((1, 3)))
    >>> model = lb.from_linen_variables(Net(), variables, jnp.ones((1, 3)), capacity=4)
    >>> bool((model(jnp.ones((1, 3))) == Net().apply(variables, jnp.ones((1, 3)))).all())
    True
  """
  model = ToNNX(module, rngs=rngs, capacity=capacity, overflow=overflow)
  variables = _plain_variables(variables, "lb.from_linen_variables")
  rng_source = _compat.rngs_of(model)
  rng_names = [n for n, _ in rng_source.items()] if isinstance(rng_source, nnx.Rngs) else []
  rng_keys = {name: jax.random.key(0) for name in {"params", *rng_names} if name != "default"}
  # One abstract init (no FLOPs): its variables check the given ones' structure, and what it
  # sowed (intermediates included, hence mutable=True) declares the buffers.
  capture = model._loopbridge_settings().capture_intermediates
  with _observe_linen.observe() as calls:
    expected = jax.eval_shape(lambda: module.init(
        rng_keys, *args, method=method, mutable=True, capture_intermediates=capture, **kwargs))
  found = _observe_linen.classify(expected, calls)
  expected = _without(expected, found.record_paths)
  # Collections linen.init returns but the user may have dropped (e.g. sown 'intermediates'
  # records) are not state; compare only collections that hold state.
  variables = _without(variables, found.record_paths)
  variables = {col: tree for col, tree in variables.items() if tree}
  _check_linen_structure(variables, expected, "lb.from_linen_variables", type(module).__name__)
  # The arrays are used as given (e.g. host-loaded): partitioning stays metadata, and the
  # standard NNX recipe (nnx.get_partition_spec + device_put) places them.
  with _compat.no_eager_sharding():
    _linen_vars.set_variables(model, variables)
  report = _session.BridgeReport(model, type(module).__name__, found.sites, found.dropped, {})
  _pipeline.declare_alone(model, report, args, kwargs)
  return model


def _without(variables: tp.Mapping[str, tp.Any], paths: set[tuple[str, ...]]) -> dict:
  """`variables` minus the given leaf paths (sown records are not state)."""
  flat = traverse_util.flatten_dict(dict(variables), is_leaf=lambda _, v: isinstance(v, tuple))
  return traverse_util.unflatten_dict({p: v for p, v in flat.items() if p not in paths})


def load_linen_variables(model: tp.Any, variables: tp.Mapping[str, tp.Any]) -> tp.Any:
  """Write a Linen variables dict into an initialized `lb.ToNNX`, in place.

  Use it to load Linen weights (e.g. a Linen checkpoint) into a model already declared with
  `lb.lazy_init`; buffers, counts and rng streams are left as they are.

  Args:
    model: an initialized `lb.ToNNX`.
    variables: a Linen variables dict with the model's structure (a subset of collections is
      fine, e.g. only `{'params': ...}`).

  Returns:
    `model` (same Variables, new values).

  Raises:
    NotInitializedError: `model` was not initialized.
    CheckpointError: a path the model does not have, or a different shape/dtype.

  Example:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> model = lb.lazy_init(lb.ToNNX(nn.Dense(2), rngs=nnx.Rngs(0)), jnp.ones((1, 3)))
    >>> variables = nn.Dense(2).init(jax.random.key(7), jnp.ones((1, 3)))
    >>> out = lb.load_linen_variables(model, variables)(jnp.ones((1, 3)))
    >>> bool((out == nn.Dense(2).apply(variables, jnp.ones((1, 3)))).all())
    True
  """
  if not isinstance(model, ToNNX) or _recorder.sites_of(model) is None:
    raise NotInitializedError(
        "lb.load_linen_variables needs an lb.ToNNX after lb.lazy_init (it writes into the "
        "existing Variables). Fix: lb.lazy_init(model, *sample_args, capacity=...) first, or "
        "build the model directly with lb.from_linen_variables(module, variables, *args).")
  variables = _plain_variables(variables, "lb.load_linen_variables")
  attrs = _linen_vars.attrs(model)
  current = bridge_variables.nnx_attrs_to_linen_vars(attrs)
  have, want = _unboxed_leaves(variables), _unboxed_leaves(current)
  unknown = sorted(set(have) - set(want))
  differ = sorted(k for k in set(have) & set(want) if have[k] != want[k])
  if unknown or differ:
    detail = "; ".join(
        [f"{'/'.join(k)} given {_describe(*have[k])} vs model {_describe(*want[k])}"
         for k in differ[:8]]
        + ([("not in the model: " + ", ".join("/".join(k) for k in unknown[:8]))]
           if unknown else []))
    raise CheckpointError(
        f"lb.load_linen_variables: the variables do not fit the model: {detail}. Why: values "
        "are written into the existing Variables, which keep their shapes for NNX loops. Fix: "
        "initialize the model with sample arguments of the shapes the variables were made "
        "for, or build it with lb.from_linen_variables(module, variables, *args).")
  flat = traverse_util.flatten_dict(
      dict(variables), is_leaf=lambda _, v: isinstance(v, (meta.AxisMetadata, tuple)))
  for path, value in flat.items():
    if isinstance(value, tuple):
      continue
    node: tp.Any = attrs
    for key in path[1:]:
      node = node[key]
    _compat.set_variable_value(node, jnp.asarray(_unbox(value)))
  return model
