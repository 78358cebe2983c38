"""Saving and restoring recording models with orbax, and loading existing Linen variables.

A recording model's whole state is its NNX Variables: the Linen variables (params,
batch_stats, ...), the record `Buffer`s and `Count`s, and the rng streams (keys and counts).
`save` writes every one of them with orbax (the checkpoint library flax uses);
`restore` writes them back *into the existing Variables* of a model declared the
same way, so a loop can stop mid-way and go on in another process and record exactly what an
uninterrupted run records.

The saved format (version 2) is the same on every supported flax:
- arrays keyed by the model's attribute paths, except that a bridge's rng attribute (`rngs`
  on flax 0.10, `to_nnx__rngs` from 0.11 on) is always saved as `to_nnx__rngs`; typed PRNG
  keys are stored as their key data and re-wrapped with the target key's implementation;
- the declaration, in orbax's custom metadata: per Buffer its capacity, overflow policy,
  value shape, dtype and leading stack shape, read from the Buffer and Count Variables only.
Version 1 (loopbridge 0.2) kept one scalar count per site, at the site's path under
`loopbridge__counts`; version 2 keeps one count vector per recorder (`loopbridge__counts`
itself). Restoring a version 1 checkpoint reads the per-site counts into the vector, each at
its site's entry.

Restore reads both before writing anything. A different overflow policy, value shape or
dtype, a smaller capacity or another set of Variables is a `CheckpointError` listing each
difference (orbax alone would silently pad or truncate a differently shaped buffer). A larger
capacity is restored when no saved buffer has overflowed: every value sown is then in the
saved buffer, in sowing order from slot 0 under every policy, and lands in the same slots of
the larger buffer. Anything orbax cannot read (a damaged or partial checkpoint) is a
`CheckpointError` too; the model is written only once everything was read and checked.

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
from flax import linen, nnx, traverse_util

from .. import _compat
from .._core import buffers, linen_vars, pipeline, recorder
from .._core.call_target import LinenMethod
from .._core.errors import CheckpointError, NotDeclaredError
from .._core.given_variables import describe, flat_values, plain_variables, unboxed_leaves
from .._core.site import key_str
from .._core.to_nnx import ToNNX
from . import count_vectors

if tp.TYPE_CHECKING:
  import orbax.checkpoint as ocp

Model = tp.TypeVar("Model")


class _BufferDeclaration(tp.TypedDict):
  """What a checkpoint says of one Buffer (saved in orbax's custom metadata)."""

  capacity: int
  overflow: str
  value_shape: list[int]
  stack_shape: list[int]
  dtype: str


FORMAT = 2
# Formats this version restores: 1 (loopbridge 0.2, a scalar count per site) and 2 (one count
# vector per recorder).
_READABLE_FORMATS = (1, 2)
# Key of the declaration in orbax's custom metadata, and the rng attribute name every flax
# version saves under (the newest flax's own name).
_METADATA_KEY = "loopbridge"
# In the declaration: [path, shape, dtype] of each zero-size array (not written by orbax).
_EMPTY_KEY = "empty_arrays"
_SAVED_RNGS_ATTR = "to_nnx__rngs"

_FIX_DECLARE = (
  "Fix: build the fresh model from the same Linen module and declare it like the saved one "
  "before restoring: lb.lazy_init(model, *sample_args, capacity=..., overflow=...) with the "
  "same sample shapes, capacities and overflow policies (and lb.preallocate for any "
  "signature declared later)."
)
_WHY_DAMAGED = (
  "Why: a checkpoint whose files were truncated, deleted or overwritten (e.g. a save "
  "interrupted mid-way, or a partial copy) cannot be restored, and the model was left "
  "untouched. Fix: restore an earlier complete checkpoint, or pass the path "
  "lb.checkpoint.save returned."
)


def _model_variables(model: object) -> dict[tuple[str, ...], nnx.Variable]:
  """Every Variable of the model's graph by its saved path (shared ones once).

  A bridge's rng attribute is renamed to `to_nnx__rngs` whatever the installed flax calls it,
  so checkpoints move between flax versions.
  """
  if not isinstance(model, nnx.Module):
    raise TypeError(
      f"expected an NNX module (e.g. an lb.ToNNX after lb.lazy_init), got {type(model).__name__}."
    )
  nodes = [(tuple(key_str(k) for k in path), node) for path, node in _compat.iter_graph(model)]
  renames = {}
  for path, node in nodes:
    if isinstance(node, nnx.bridge.ToNNX):
      local = _compat.rngs_attribute(node)
      renames[(*path, local)] = (*path, _SAVED_RNGS_ATTR)

  def saved_path(path: tuple[str, ...]) -> tuple[str, ...]:
    for prefix, new in renames.items():
      if path[: len(prefix)] == prefix:
        return new + path[len(prefix) :]
    return path

  return {saved_path(path): node for path, node in nodes if isinstance(node, nnx.Variable)}


def _is_key(value: jax.typing.ArrayLike) -> bool:
  return jnp.issubdtype(jnp.result_type(value), jax.dtypes.prng_key)


def _saved_form(value: tp.Any) -> tp.Any:
  return jax.random.key_data(value) if _is_key(value) else value


def _checkpointer() -> ocp.StandardCheckpointer:
  import orbax.checkpoint as ocp  # flax depends on it; imported only when used

  return ocp.StandardCheckpointer()


def _declaration(variables: dict[tuple[str, ...], nnx.Variable]) -> dict[str, _BufferDeclaration]:
  """Per Buffer (by saved path): capacity, overflow, value shape, dtype, stack shape.

  Read from the Variables alone. A Buffer's recorder keeps its Count vector beside the
  buffers; the vector's leading axes are the stack axes of its buffers (native layers stacked
  with `nnx.vmap`), so the capacity is the buffer axis right after them.
  """
  out = {}
  for key, variable in variables.items():
    if not isinstance(variable, buffers.Buffer):
      continue
    i = key.index(recorder.BUFFERS_ATTR) if recorder.BUFFERS_ATTR in key else -1
    count = variables.get((*key[:i], recorder.COUNTS_ATTR)) if i >= 0 else None
    stack = np.ndim(_compat.variable_value(count)) - 1 if count is not None else 0
    value = _compat.variable_value(variable)
    shape = tuple(int(d) for d in np.shape(value))
    out["/".join(key)] = {
      "capacity": shape[stack],
      "overflow": buffers.overflow_of(variable),
      "value_shape": list(shape[stack + 1 :]),
      "stack_shape": list(shape[:stack]),
      "dtype": np.dtype(value.dtype).name,
    }
  return out


def _path(directory: object, entry: str) -> str:
  """The absolute path of a checkpoint directory given as a str or os.PathLike."""
  if not isinstance(directory, (str, os.PathLike)):
    raise CheckpointError(
      f"lb.checkpoint.{entry}: the directory must be a path (a str or pathlib.Path), got "
      f"{type(directory).__name__}; note the order: lb.checkpoint.{entry}(directory, model)."
    )
  return os.path.abspath(os.fspath(directory))


def save(directory: str | os.PathLike, model: nnx.Module, *, overwrite: bool = False) -> str:
  """Save a model's full state (params, buffers, counts, rng streams) with orbax.

  Safe mid-loop: call it between loop segments on the model the loop updates in place. The
  checkpoint also holds the buffers' declaration (capacity, overflow policy, value shape and
  dtype), which `restore` compares with the model's, and restores on every
  supported flax version (0.10.2 through 0.12.8), whichever one saved it. With several JAX
  processes, every process calls it with the same path (as with orbax). Zero-size arrays
  (e.g. a sown empty slice), which orbax refuses, are kept as their shape and dtype.

  Args:
    directory: where to write the checkpoint (a new directory; made absolute).
    model: an `lb.ToNNX` (or any NNX module holding some).
    overwrite: replace an existing checkpoint at `directory`.

  Returns:
    The absolute checkpoint path.

  Raises:
    TypeError: `model` is not an NNX module.
    CheckpointError: `directory` is not a path, or exists already (without `overwrite=True`).

  Examples:
    >>> import tempfile, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3)
    >>> _ = model(jnp.ones(2))
    >>> path = lb.checkpoint.save(tempfile.mkdtemp() + "/step_1", model)
    >>> fresh = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3)
    >>> int(lb.counts(lb.checkpoint.restore(path, fresh))["intermediates"]["x"])
    1
  """
  path = _path(directory, "save")
  if os.path.exists(path) and not overwrite:
    raise CheckpointError(
      f"lb.checkpoint.save: {path} already exists. Why: saving over it would replace what it "
      "holds, so it is never done silently. Fix: pass overwrite=True to replace it, or save "
      "into a new directory (e.g. one per step: f'{root}/step_{step}')."
    )
  variables = _model_variables(model)
  tree = {key: _saved_form(_compat.variable_value(v)) for key, v in variables.items()}
  # orbax refuses zero-size arrays; they hold no data, so their shape and dtype are all that
  # is kept (in the declaration) and `restore` makes them again.
  empty = sorted(key for key, value in tree.items() if np.size(value) == 0)
  declaration = {
    "format": FORMAT,
    "buffers": _declaration(variables),
    _EMPTY_KEY: [[list(k), list(np.shape(tree[k])), jnp.dtype(tree[k].dtype).name] for k in empty],
  }
  checkpointer = _checkpointer()
  checkpointer.save(
    path,
    traverse_util.unflatten_dict({k: v for k, v in tree.items() if np.size(v) != 0}),
    force=overwrite,
    custom_metadata={_METADATA_KEY: declaration},
  )
  checkpointer.wait_until_finished()
  return path


def _damaged(path: str, what: str, error: BaseException | None = None) -> CheckpointError:
  cause = f": {type(error).__name__}: {error}" if error is not None else ""
  return CheckpointError(f"cannot restore the checkpoint at {path}: {what}{cause}. " + _WHY_DAMAGED)


def _read_metadata(checkpointer: ocp.StandardCheckpointer, path: str) -> tuple[dict, dict]:
  """(saved shapes and dtypes by path, the saved declaration); CheckpointError if unreadable."""
  if not os.path.exists(path):
    raise CheckpointError(
      f"no checkpoint at {path}: the path does not exist. Fix: pass the path "
      "lb.checkpoint.save returned."
    )
  if not os.path.isdir(path):
    raise CheckpointError(
      f"no checkpoint at {path}: it is a file, not a checkpoint directory. Fix: pass the "
      "directory lb.checkpoint.save returned."
    )
  if not os.listdir(path):
    raise CheckpointError(
      f"no checkpoint at {path}: the directory is empty. Why: a save that never ran or was "
      "interrupted before writing, or the wrong directory. Fix: pass the path "
      "lb.checkpoint.save returned."
    )
  try:
    metadata = checkpointer.metadata(path)
    tree = _compat.orbax_tree_metadata(metadata)
  except Exception as error:  # orbax/tensorstore raise many types for unreadable files
    raise _damaged(path, "its array metadata cannot be read", error) from error
  if tree is None:  # orbax logs why and returns nothing
    raise _damaged(path, "orbax found no readable array metadata (its log says which file)")
  try:
    flat: dict[tuple[tp.Any, ...], tp.Any] = traverse_util.flatten_dict(dict(tree))
    saved = {tuple(map(str, k)): (tuple(v.shape), np.dtype(v.dtype)) for k, v in flat.items()}
  except Exception as error:  # orbax/tensorstore raise many types for unreadable files
    raise _damaged(path, "its array metadata cannot be read", error) from error
  try:
    declaration = _compat.orbax_custom_metadata(metadata, path, _METADATA_KEY)
  except (OSError, ValueError, AttributeError) as error:
    raise _damaged(
      path, "its step metadata (the buffers' declaration) cannot be read", error
    ) from error
  if not isinstance(declaration, dict) or "buffers" not in declaration:
    raise CheckpointError(
      f"the checkpoint at {path} holds no loopbridge declaration (capacity and overflow "
      "of each buffer). Why: it was not written by lb.checkpoint.save (e.g. a plain orbax "
      "checkpoint, or one from loopbridge before the format carried the declaration), so "
      "restoring cannot check that the records mean the same thing. Fix: save it with "
      "lb.checkpoint.save; for a Linen variables dict use lb.checkpoint.load_linen_variables."
    )
  if declaration.get("format") not in _READABLE_FORMATS:
    raise CheckpointError(
      f"the checkpoint at {path} has loopbridge format {declaration.get('format')!r}, this "
      f"loopbridge reads formats {', '.join(map(str, _READABLE_FORMATS))}. Fix: restore it "
      "with the loopbridge version that saved it."
    )
  try:
    for key, shape, dtype in declaration.get(_EMPTY_KEY, ()):
      saved[tuple(map(str, key))] = (tuple(shape), jnp.dtype(dtype))
  except (TypeError, ValueError) as error:
    raise _damaged(path, "its list of zero-size arrays cannot be read", error) from error
  return saved, declaration


def _declaration_differences(saved: dict, model: dict) -> tuple[list[str], set[str]]:
  """(what differs in words, buffers restorable into a larger capacity)."""
  lines, grown = [], set()
  for key in sorted(set(saved) & set(model)):
    was, now = saved[key], model[key]
    diffs = [
      f"{field} saved {was[field]!r} vs model {now[field]!r}"
      for field in ("overflow", "value_shape", "dtype", "stack_shape")
      if was[field] != now[field]
    ]
    if was["capacity"] > now["capacity"]:
      diffs.append(
        f"capacity saved {was['capacity']} vs model {now['capacity']} (smaller: "
        "the saved values would not fit)"
      )
    elif was["capacity"] < now["capacity"] and not diffs:
      grown.add(key)
    elif was["capacity"] != now["capacity"]:
      diffs.append(f"capacity saved {was['capacity']} vs model {now['capacity']}")
    if diffs:
      lines.append(f"{key}: " + ", ".join(diffs))
  return lines, grown


def _host_max(value: jax.Array) -> int:
  """Largest element of an array that may span several JAX processes."""
  if not getattr(value, "is_fully_addressable", True):
    from jax.experimental import multihost_utils

    value = multihost_utils.process_allgather(value, tiled=True)
  return int(np.max(np.asarray(value))) if np.size(value) else 0


def restore(directory: str | os.PathLike, model: Model) -> Model:
  """Restore a `save` into a model declared like the saved one, in place.

  Works across the supported flax range (a checkpoint saved on flax 0.10.2 restores on
  0.12.8 and back). The saved declaration is compared with the model's before anything is
  read: each buffer must have the same overflow policy, value shape and dtype, and at least
  the saved capacity. A larger capacity keeps every value when no saved buffer has
  overflowed (count <= saved capacity): the values stay in their slots, oldest first, and
  the model records on from there. On any error the model is left untouched.

  Args:
    directory: the checkpoint path `save` returned.
    model: a fresh `lb.ToNNX` of the same Linen module, `lb.lazy_init`-ed (and
      `lb.preallocate`-d) with the same sample shapes and overflow policies, and capacities
      at least the saved ones.

  Returns:
    `model`, holding the saved params, buffers, counts and rng state (same Variables).

  Raises:
    CheckpointError: no checkpoint at `directory` (missing path, empty directory); a
      damaged checkpoint (truncated or deleted data, unreadable metadata), naming the path
      and orbax's error; a checkpoint without loopbridge's declaration; a buffer declared
      with another overflow policy, value shape, dtype or a smaller capacity; a larger
      capacity for a buffer that overflowed; or other Variables (paths, shapes, dtypes).
      The message lists the differences.

  Examples:
    >>> import tempfile, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3)
    >>> _ = model(jnp.arange(2.0))
    >>> path = lb.checkpoint.save(tempfile.mkdtemp() + "/c", model)
    >>> larger = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=10)
    >>> lb.recorded(lb.checkpoint.restore(path, larger))["intermediates"]["x"]
    Array([[0., 1.]], dtype=float32)
  """
  path = _path(directory, "restore")
  variables = _model_variables(model)
  checkpointer = _checkpointer()
  saved, declaration = _read_metadata(checkpointer, path)
  saved_declaration = declaration["buffers"]
  declaration_lines, grown = _declaration_differences(saved_declaration, _declaration(variables))
  if declaration_lines:
    raise CheckpointError(
      f"the checkpoint at {path} was declared differently from the model: "
      + "; ".join(declaration_lines[:8])
      + (" ..." if len(declaration_lines) > 8 else "")
      + ". Why: a buffer's overflow policy, value shape and dtype say what its slots mean, "
      "so the saved records would read back wrong in this model (a larger capacity is "
      f"fine, a smaller one would lose values). {_FIX_DECLARE}"
    )
  expected, target = {}, {}
  for key, variable in variables.items():
    value = _saved_form(_compat.variable_value(variable))
    shape, dtype = tuple(np.shape(value)), np.dtype(jnp.result_type(value))
    if "/".join(key) in grown:  # read at the saved capacity, padded below
      shape = saved[key][0]
    expected[key] = (shape, dtype)
    target[key] = jax.ShapeDtypeStruct(shape, dtype, sharding=getattr(value, "sharding", None))
  vectors = count_vectors.entries(model, key_str)
  per_site = declaration["format"] == 1  # loopbridge 0.2: a scalar count per site
  if per_site:
    count_vectors.read_per_site(vectors, expected, target)
  missing = sorted(set(expected) - set(saved))
  extra = sorted(set(saved) - set(expected))
  differ = sorted(k for k in set(saved) & set(expected) if saved[k] != expected[k])
  if missing or extra or differ:
    lines = []
    if differ:
      lines.append(
        "different shape/dtype: "
        + "; ".join(
          f"{'/'.join(k)} saved {describe(*saved[k])} vs model {describe(*expected[k])}"
          for k in differ[:8]
        )
        + (" ..." if len(differ) > 8 else "")
      )
    if missing:
      lines.append(
        "in the model but not saved: "
        + ", ".join("/".join(k) for k in missing[:8])
        + (" ..." if len(missing) > 8 else "")
      )
    if extra:
      lines.append(
        "saved but not in the model: "
        + ", ".join("/".join(k) for k in extra[:8])
        + (" ..." if len(extra) > 8 else "")
      )
    raise CheckpointError(
      f"the checkpoint at {path} does not match the model's structure: "
      + "; ".join(lines)
      + ". Why: restoring writes into the model's existing Variables "
      "(NNX loops need them unchanged), so every saved array must find a Variable of the "
      f"same shape and dtype. {_FIX_DECLARE}"
    )
  empty = {k for k, (shape, _) in expected.items() if 0 in shape}  # not saved by orbax
  try:
    raw = traverse_util.flatten_dict(
      checkpointer.restore(
        path, traverse_util.unflatten_dict({k: v for k, v in target.items() if k not in empty})
      )
    )
  except Exception as error:  # orbax/tensorstore raise many types for damaged data
    raise _damaged(path, "orbax cannot read its arrays", error) from error
  restored: dict[tuple[str, ...], tp.Any] = {tuple(map(str, k)): v for k, v in raw.items()}
  restored.update({k: jnp.zeros(*expected[k]) for k in empty})
  unread = sorted(
    "/".join(k)
    for k in expected
    if restored.get(k) is None or tuple(np.shape(restored[k])) != expected[k][0]
  )
  if unread:
    raise _damaged(path, "orbax returned no data for " + ", ".join(unread[:8]))
  if per_site:
    count_vectors.stack_per_site(vectors, restored)
  # The declaration is keyed by the joined path; a sow name or sown dict key may itself hold
  # a '/', so the path is looked up, not split.
  path_of = {"/".join(k): k for k in variables}
  for key in sorted(grown):
    saved_capacity = saved_declaration[key]["capacity"]
    site_count = count_vectors.site_count(vectors, restored, path_of[key])
    count = saved_capacity + 1 if site_count is None else _host_max(site_count)
    if count > saved_capacity:
      raise CheckpointError(
        f"the checkpoint at {path} cannot be restored into a larger capacity: buffer {key} "
        f"(overflow={saved_declaration[key]['overflow']!r}) had {count} values sown into "
        f"capacity {saved_capacity}, so {count - saved_capacity} of them are not in the "
        f"checkpoint, and a buffer of capacity {_declaration(variables)[key]['capacity']} "
        "would present the missing ones as recorded. Fix: restore into a model declared "
        f"with capacity {saved_capacity} for this site (then lb.preallocate a larger one, "
        "or lb.reset between runs)."
      )
  for key, variable in variables.items():
    value = restored[key]
    current = _compat.variable_value(variable)
    if "/".join(key) in grown:  # same slots, zeros after them (as an unwritten buffer holds)
      axis = len(saved_declaration["/".join(key)]["stack_shape"])
      padded = jnp.zeros(current.shape, current.dtype)
      value = jax.lax.dynamic_update_slice_in_dim(padded, value, 0, axis)
      sharding = getattr(current, "sharding", None)
      if sharding is not None:
        value = jax.device_put(value, sharding)
    if _is_key(current):
      value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(current))
    _compat.set_variable_value(variable, value)
  return model


# ---------------------------------------------------------------- existing Linen variables


_NO_CAPACITY_HERE = (
  "lb.checkpoint.from_linen_variables takes no {name}=: it builds the model around existing "
  "variables, and buffers are declared where every other model declares them. Why: one "
  "place declares capacity, so a model is recorded the same way however it was built. Fix: "
  "model = lb.checkpoint.from_linen_variables(module, variables, *args), then "
  "lb.preallocate(model, *args, {name}=...)."
)


def from_linen_variables(
  module: linen.Module,
  variables: tp.Mapping[str, object],
  *args: tp.Any,
  rngs: _compat.RngsArg = None,
  method: LinenMethod = None,
  **kwargs: tp.Any,
) -> ToNNX:
  """Wrap a Linen module around variables that already exist, without initializing.

  The variables (from `linen.init`, a Linen checkpoint, or a converted model) become the
  model's Variables as `lb.lazy_init` would have created them (partitioning metadata kept);
  the sample arguments are only traced abstractly to check the structure. No initializer
  runs and no rng stream is consumed. The model comes back with no record buffers: when the
  module sows, declare them with `lb.preallocate(model, *args, capacity=...)`.

  Args:
    module: the Linen module the variables belong to.
    variables: a Linen variables dict, e.g. `{'params': ..., 'batch_stats': ...}`.
    *args: sample inputs of the call the loop makes (shapes and dtypes only).
    rngs: the model's rng streams for later calls (e.g. dropout), as for `lb.ToNNX`.
    method: the Linen method the loop calls, default `__call__`.
    **kwargs: keyword arguments of that call.

  Returns:
    An initialized `lb.ToNNX` holding `variables`.

  Raises:
    CheckpointError: `variables` is not a dict, or its paths/shapes/dtypes differ from what
      `module.init` would create for these arguments.
    TypeError: `capacity=` or `overflow=` given (declare them with `lb.preallocate`).

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return nn.Dense(2)(x)
    >>> variables = Net().init(jax.random.key(0), jnp.ones((1, 3)))
    >>> model = lb.checkpoint.from_linen_variables(Net(), variables, jnp.ones((1, 3)))
    >>> model = lb.preallocate(model, jnp.ones((1, 3)), capacity=4)
    >>> bool((model(jnp.ones((1, 3))) == Net().apply(variables, jnp.ones((1, 3)))).all())
    True
  """
  for name in ("capacity", "overflow"):
    if name in kwargs:
      raise TypeError(_NO_CAPACITY_HERE.format(name=name))
  return pipeline.from_linen_variables(
    ToNNX(module, rngs=rngs), variables, *args, method=method, **kwargs
  )


def load_linen_variables(
  model: Model, variables: tp.Mapping[str, object], *, copy: bool = True
) -> Model:
  """Write a Linen variables dict into an initialized `lb.ToNNX`, in place.

  Use it to load Linen weights (e.g. a Linen checkpoint) into a model already declared with
  `lb.lazy_init`; buffers, counts and rng streams are left as they are. The model gets its
  own copy of each array by default, so a donating call of the model
  (`nnx.jit(..., donate_argnums=0)`, `lb.compile_step`) never deletes the caller's
  `variables`, which stay usable with plain Linen (as `lb.lazy_init` copies a sample array
  that init stored as it was).

  Args:
    model: an initialized `lb.ToNNX`.
    variables: a Linen variables dict with the model's structure (a subset of collections is
      fine, e.g. only `{'params': ...}`).
    copy: `False` moves the arrays instead, when memory is tight: the model holds the very
      arrays given (no second copy on the device), so a donating call deletes them; use
      `variables` no more after that.

  Returns:
    `model` (same Variables, new values).

  Raises:
    NotDeclaredError: `model` was not initialized.
    CheckpointError: a path the model does not have, or a different shape/dtype.
    TypeError: `copy` is not a bool.

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> model = lb.lazy_init(lb.ToNNX(nn.Dense(2), rngs=nnx.Rngs(0)), jnp.ones((1, 3)))
    >>> variables = nn.Dense(2).init(jax.random.key(7), jnp.ones((1, 3)))
    >>> out = lb.checkpoint.load_linen_variables(model, variables)(jnp.ones((1, 3)))
    >>> bool((out == nn.Dense(2).apply(variables, jnp.ones((1, 3)))).all())
    True
  """
  if not isinstance(model, ToNNX) or recorder.sites_of(model) is None:
    raise NotDeclaredError(
      "lb.checkpoint.load_linen_variables needs an lb.ToNNX after lb.lazy_init (it writes into the "
      "existing Variables). Fix: lb.lazy_init(model, *sample_args, capacity=...) first, or "
      "build the model directly with lb.checkpoint.from_linen_variables(module, variables, *args)."
    )
  if not isinstance(copy, bool):
    raise TypeError(
      f"lb.checkpoint.load_linen_variables: copy= must be True or False, got {copy!r}. Fix: "
      "copy=True (the default: the model gets its own arrays) or copy=False (move them)."
    )
  variables = plain_variables(variables, "lb.checkpoint.load_linen_variables")
  attrs = linen_vars.attrs(model)
  current = linen_vars.to_linen(attrs)
  have, want = unboxed_leaves(variables), unboxed_leaves(current)
  unknown = sorted(set(have) - set(want))
  differ = sorted(k for k in set(have) & set(want) if have[k] != want[k])
  if unknown or differ:
    detail = "; ".join(
      [
        f"{'/'.join(k)} given {describe(*have[k])} vs model {describe(*want[k])}"
        for k in differ[:8]
      ]
      + ([("not in the model: " + ", ".join("/".join(k) for k in unknown[:8]))] if unknown else [])
    )
    raise CheckpointError(
      f"lb.checkpoint.load_linen_variables: the variables do not fit the model: {detail}. "
      "Why: values "
      "are written into the existing Variables, which keep their shapes for NNX loops. Fix: "
      "initialize the model with sample arguments of the shapes the variables were made "
      "for, or build it with lb.checkpoint.from_linen_variables(module, variables, *args)."
    )
  for path, value in flat_values(variables).items():
    value = linen_vars.unbox(value, constrain=False)
    if isinstance(value, tuple) or not linen_vars.is_data(value):
      continue  # records, and static values the model already holds (a graphdef)
    # jnp.array copies even a jax.Array; jnp.asarray keeps it (a host array is put on the
    # device either way).
    value = jnp.array(value, copy=True) if copy else jnp.asarray(value)
    _compat.set_variable_value(recorder.get_nested(attrs, path[1:]), value)
  return model
