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
from flax import nnx, traverse_util

from .. import _compat
from .._core.errors import CheckpointError
from .._core.given_variables import describe
from .._core.site import key_str
from . import count_vectors
from .checkpoint_format import (
  _EMPTY_KEY,
  _METADATA_KEY,
  FORMAT,
  _checkpointer,
  _damaged,
  _declaration,
  _declaration_differences,
  _is_key,
  _model_variables,
  _path,
  _read_metadata,
  _saved_form,
)
from .existing_linen_variables import from_linen_variables as from_linen_variables
from .existing_linen_variables import load_linen_variables as load_linen_variables

Model = tp.TypeVar("Model")

_FIX_DECLARE = (
  "Fix: build the fresh model from the same Linen module and declare it like the saved one "
  "before restoring: lb.lazy_init(model, *sample_args, capacity=..., overflow=...) with the "
  "same sample shapes, capacities and overflow policies (and lb.preallocate for any "
  "signature declared later)."
)


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
