"""The saved checkpoint format: the model's Variables by saved path, the saved form of a
value, the buffers' declaration, and the checkpoint's metadata read back and checked before
any array is (see `save_restore.py` for the format itself)."""

from __future__ import annotations

import os
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from .. import _compat
from .._core import buffers, recorder
from .._core.errors import CheckpointError
from .._core.site import key_str

if tp.TYPE_CHECKING:
  import orbax.checkpoint as ocp


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
