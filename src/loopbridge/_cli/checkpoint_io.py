"""Reading and writing the orbax checkpoints `loopbridge convert` moves between.

Before orbax reads any array, the checkpoint's own metadata (paths, shapes, dtypes) is compared
with the tree the models and options describe. A checkpoint of another model, another `--arg`
or without the optax state `--tx` expects is refused listing the differences, with the fix for
that cause; orbax then never starts a read that fails (a failed read leaves tasks behind whose
shutdown prints hundreds of lines to stderr). A read that fails although the metadata fits is
reported as unreadable data, not as a model mismatch.

Typed PRNG keys (an rng stream the port holds, e.g. `nnx.Dropout(..., rngs=rngs)`) are stored
by orbax as their key data. They are read as key data and wrapped again with the target's key
implementation: orbax 0.11 (flax 0.10's) cannot read into a typed-key target.
"""

from __future__ import annotations

import contextlib
import logging
import os
import typing as tp

from .. import _compat
from .errors import CliError
from .output import progress

Spec = tuple[tuple[int, ...], str]  # (shape, dtype name) of one array


def _checkpointer():
  import orbax.checkpoint as ocp  # flax depends on it; imported only when used

  return ocp.StandardCheckpointer()


def _name(key: object) -> str:
  """One step of a pytree path as orbax names it (dict key, attribute or index)."""
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _specs(tree: object) -> dict[tuple[str, ...], Spec]:
  import jax
  import numpy as np

  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {
    tuple(_name(k) for k in path): (tuple(int(d) for d in leaf.shape), np.dtype(leaf.dtype).name)
    for path, leaf in flat
  }


def _is_key(leaf: object) -> bool:
  import jax
  import jax.numpy as jnp

  dtype = getattr(leaf, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _key_data_target(target: object) -> object:
  """The target with each typed PRNG key replaced by its key data's shape and dtype."""
  import jax

  def as_data(leaf):
    if not _is_key(leaf):
      return leaf
    data = jax.eval_shape(jax.random.key_data, leaf)
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=getattr(leaf, "sharding", None))

  return jax.tree.map(as_data, target)


def _wrap_keys(restored: object, target: object) -> object:
  """Typed keys again where the target held them (orbax returns key data or keys)."""
  import jax

  def wrap(value, leaf):
    if _is_key(leaf) and not _is_key(value):
      return jax.random.wrap_key_data(value, impl=jax.random.key_impl(leaf))
    return value

  return jax.tree.map(wrap, restored, target)


def _path(parts: tuple[str, ...]) -> str:
  return "/".join(parts)


def _described(spec: Spec) -> str:
  return f"{spec[1]}{list(spec[0])}"


def _mismatch(source: str, what: str, saved: dict, wanted: dict) -> CliError | None:
  """The error for a checkpoint whose arrays are not the ones the models describe, or None.

  A scalar's dtype is not compared: orbax casts it on reading, and a step saved as a Python
  int (orbax: int64) is the same step as the int32 one the models describe.
  """

  def differs(k) -> bool:
    (shape, dtype), (want_shape, want_dtype) = saved[k], wanted[k]
    return shape != want_shape or (dtype != want_dtype and shape != ())

  differ = [k for k in wanted if k in saved and differs(k)]
  missing = [k for k in wanted if k not in saved]
  extra = [k for k in saved if k not in wanted]
  if not (differ or missing or extra):
    return None
  found = [
    f"{_path(k)} saved {_described(saved[k])}, the models make {_described(wanted[k])}"
    for k in differ[:4]
  ] + ([f"{len(differ) - 4} more of other shapes"] if len(differ) > 4 else [])
  for label, keys in (("not in the checkpoint", missing), ("only in the checkpoint", extra)):
    if keys:
      more = f" and {len(keys) - 4} more" if len(keys) > 4 else ""
      found.append(f"{label}: " + ", ".join(_path(k) for k in keys[:4]) + more)
  tops_missing = {k[0] for k in missing} - {k[0] for k in saved}
  tops_extra = {k[0] for k in extra} - {k[0] for k in wanted}
  if what == "Linen" and tops_extra & {"opt_state", "step"}:
    fix = "pass --tx (the optax transformation it was trained with) to convert its optax state"
  elif what == "Linen" and tops_missing & {"opt_state", "step"}:
    fix = "drop --tx: this checkpoint holds no optax state and step"
  elif what == "NNX" and tops_extra == {"optimizer"}:
    fix = "pass --tx (the optax transformation of its nnx.Optimizer)"
  elif what == "NNX" and tops_missing == {"optimizer"}:
    fix = "drop --tx: this checkpoint holds no 'optimizer' state"
  elif differ and not (missing or extra) and all(saved[k][0] == wanted[k][0] for k in differ):
    fix = "build the models with the checkpoint's dtypes (e.g. param_dtype); values are not cast"
  elif differ and not (missing or extra):
    fix = (
      "pass the --arg shapes the checkpoint's model was built for, and the models it was "
      "written from"
    )
  else:
    fix = "pass the models (and --tx) the checkpoint was written from"
  return CliError(
    f"SOURCE {source!r} does not hold the {what} checkpoint these models and options "
    f"describe: {'; '.join(found)}. Fix: {fix}."
  )


# Loggers orbax reports through: asyncio's (a failed read's tasks, at shutdown) and absl's
# (orbax's own notes, e.g. a directory without metadata). Each failure is the one-line error.
_ORBAX_LOGGERS = ("asyncio", "absl")


@contextlib.contextmanager
def _quiet_orbax() -> tp.Iterator[None]:
  """orbax's log lines off for the duration of one call only; the loggers are left as found."""
  loggers = [logging.getLogger(name) for name in _ORBAX_LOGGERS]
  were = [logger.disabled for logger in loggers]
  for logger in loggers:
    logger.disabled = True
  try:
    yield
  finally:
    for logger, was in zip(loggers, were):
      logger.disabled = was


def unboxed(target: object) -> object:
  """`target` with Linen's metadata boxes (`nn.Partitioned`, ...) replaced by their values:
  the layout of a train state saved after `nn.unbox`, which many training loops save."""
  import jax
  from flax.core import meta

  from .._core.linen_vars import unbox

  return jax.tree.map(
    lambda x: unbox(x, constrain=False), target, is_leaf=lambda x: isinstance(x, meta.AxisMetadata)
  )


def restore(source: str, target: object, what: str, layouts: tp.Sequence[object] = ()) -> tp.Any:
  """Read the checkpoint at `source` into the structure of `target`, checked first.

  Args:
    source: the checkpoint directory as given on the command line.
    target: the tree to read (arrays or `jax.ShapeDtypeStruct`s, typed keys allowed).
    what: "Linen" or "NNX", for the messages.
    layouts: other trees holding the same arrays in another layout (the params without their
      metadata boxes): the checkpoint is read into the one its metadata matches exactly; the
      messages name `target`'s differences when none does.

  Returns:
    The restored tree, typed keys where `target` holds them.

  Raises:
    CliError: not a directory, no readable orbax metadata, arrays other than `target`'s, or
      data orbax cannot read.
  """
  if not os.path.isdir(source):
    raise CliError(f"SOURCE {source!r} is not a directory (an orbax checkpoint is one)")
  path = os.path.abspath(source)
  checkpointer = _checkpointer()
  readable = _key_data_target(target)
  not_orbax = (
    f"SOURCE {source!r} is not a readable orbax checkpoint ({{why}}). Fix: pass the directory "
    "the checkpoint was saved to (the one holding orbax's metadata files)."
  )
  try:
    with _quiet_orbax():
      tree = _compat.orbax_tree_metadata(checkpointer.metadata(path))
  except Exception as e:  # orbax raises many types for a directory it cannot read
    why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    raise CliError(not_orbax.format(why=why)) from e
  if tree is None:  # orbax 0.12 returns no tree for a directory without its metadata
    raise CliError(not_orbax.format(why="orbax found no array metadata in it"))
  saved = _specs(tree)
  error = _mismatch(source, what, saved, _specs(readable))
  for layout in layouts:  # chosen by the saved paths, shapes and dtypes, never by guessing
    if (
      error is not None and _mismatch(source, what, saved, _specs(_key_data_target(layout))) is None
    ):
      target, readable, error = layout, _key_data_target(layout), None
  if error is not None:
    raise error
  try:
    with progress(f"restoring the {what} checkpoint"), _quiet_orbax():
      restored = checkpointer.restore(path, readable)
  except Exception as e:  # orbax/tensorstore raise many types for unreadable data
    raise CliError(
      f"SOURCE {source!r} holds the arrays these models describe, but orbax cannot read "
      f"them ({type(e).__name__}: {(str(e).splitlines() or [''])[0]}). Why: damaged or "
      "partial files, or a checkpoint written by an orbax this one cannot read. Fix: "
      "convert an earlier complete checkpoint, or save it again."
    ) from e
  return _wrap_keys(restored, target)


def save(dest: str, tree: object, what: str) -> None:
  """Write `tree` as an orbax checkpoint at `dest`, which must not exist."""
  if os.path.exists(dest):
    raise CliError(f"DEST {dest!r} exists; pick a new directory (nothing is overwritten)")
  checkpointer = _checkpointer()
  with progress(f"writing the {what} checkpoint"):
    checkpointer.save(os.path.abspath(dest), tree)
    checkpointer.wait_until_finished()
