"""Notes on exceptions raised by the user's own model while a loopbridge entry runs it.

`lb.lazy_init` / `lb.preallocate` run the model's code; an error from inside it (a shape bug, a
dataclass field named `sow` that shadows `Module.sow`, ...) would otherwise read as ours. It
keeps its type and traceback (so `except` clauses still match) and gets notes: which module was
running (the innermost Linen module and NNX module found in the traceback) and whether plain
Linen, called without loopbridge, fails the same way.
"""

from __future__ import annotations

import sys
import types
import typing as tp

import jax
from flax import linen, nnx
from flax.core import meta

from .. import _compat
from .errors import LoopbridgeError

_MARK = "loopbridge:"  # every note starts with it; a note is added once per kind


def is_users(error: BaseException) -> bool:
  """An exception from the model's code, not one loopbridge raised on purpose."""
  return isinstance(error, Exception) and not isinstance(error, LoopbridgeError)


def add_note(error: BaseException, text: str) -> None:
  """`error.add_note(text)`; on Python 3.10 the same `__notes__` list, which 3.10's own
  traceback printer ignores but pytest and the `exceptiongroup` backport show."""
  text = f"{_MARK} {text}"
  if text in getattr(error, "__notes__", ()):
    return
  if sys.version_info >= (3, 11):
    error.add_note(text)
  else:  # pragma: no cover - Python 3.10
    notes = getattr(error, "__notes__", None)
    if not isinstance(notes, list):
      notes = []
      error.__notes__ = notes  # type: ignore[attr-defined]
    notes.append(text)


def has_note(error: BaseException, start: str) -> bool:
  return any(n.startswith(f"{_MARK} {start}") for n in getattr(error, "__notes__", ()))


def _frames_self(tb: types.TracebackType | None) -> list[object]:
  """The `self` of every frame of the traceback, outermost first."""
  found = []
  while tb is not None:
    owner = tb.tb_frame.f_locals.get("self")
    if owner is not None:
      found.append(owner)
    tb = tb.tb_next
  return found


def running_linen_module(error: BaseException) -> str | None:
  """`'layers/Block_0' (Block)`: the innermost bound Linen module of the traceback."""
  for owner in reversed(_frames_self(error.__traceback__)):
    if isinstance(owner, linen.Module):
      scope = getattr(owner, "scope", None)
      path = "/".join(map(str, getattr(scope, "path", ()) or ()))
      return f"'{path or '<top>'}' ({type(owner).__name__})"
  return None


def running_nnx_module(error: BaseException, path_of: tp.Mapping[int, tuple]) -> str | None:
  """`'llm' (ToNNX)`: the innermost NNX module of the traceback that `path_of` knows."""
  for owner in reversed(_frames_self(error.__traceback__)):
    if isinstance(owner, nnx.Module) and id(owner) in path_of:
      path = "/".join(map(str, path_of[id(owner)]))
      return f"'{path or '<root>'}' ({type(owner).__name__})"
  return None


def note_linen_call(
  error: BaseException, *, label: str, what: str, plain: str, rerun: tp.Callable[[], object]
) -> None:
  """Note where in the wrapped Linen module `error` was raised and what plain Linen does.

  `rerun` calls plain Linen the way a user would (`module.init`/`module.apply` with the same
  arguments, without loopbridge's `mutable=True`); it runs only here, after a failure, with
  JAX's traceback filtering off, so its traceback still holds the frames of Linen's module
  wrappers and so the innermost module (the user's own traceback stays as JAX filtered it).
  """
  if not is_users(error) or has_note(error, "raised inside"):
    return
  plain_error = None
  try:
    with _compat.unfiltered_tracebacks():
      rerun()
  except Exception as failure:
    plain_error = failure
  same = plain_error is not None and type(plain_error) is type(error)
  where = (
    running_linen_module(plain_error) if same and plain_error is not None else None
  ) or running_linen_module(error)
  add_note(
    error,
    f"raised inside lb.ToNNX({label}) while it ran the Linen {what}"
    + (f"; Linen module {where} was running." if where else "."),
  )
  if plain_error is None:
    add_note(
      error,
      f"plain Linen {plain} succeeds, so loopbridge's way of calling it "
      "(every collection mutable, sows observed) is involved: please report it with "
      "this traceback.",
    )
    return
  add_note(
    error,
    f"plain Linen {plain} fails "
    + (
      "the same way"
      if same
      else f"too, differently ({type(plain_error).__name__}: {str(plain_error)[:200]})"
    )
    + ": the error is in the model (or its inputs), not in loopbridge.",
  )


# A call whose batch is not the one the model's state (a decode cache) was sized for. Flax's
# own message ("Autoregressive cache shape error") names neither the state nor the fix, and
# `lb.preallocate` (the rule for another call signature) keeps the state as it is.
BATCH_SIZED_STATE = (
  "the state {collections} was sized for batch {sized} ({shapes}) and this call has batch "
  "{batch}; the same call runs with that state sized for batch {batch}. Why: state such as a "
  "decode cache is sized from the inputs lb.lazy_init saw, and lb.preallocate keeps the "
  "model's state as it is. Fix: lb.lazy_init(model, *inputs, capacity=...) again with inputs "
  "of batch {batch} (on the full length for a flax decode cache, then lb.preallocate the "
  "step), or build one decoding model per batch size."
)


def _call_batch(args: tp.Sequence[object], kwargs: tp.Mapping[str, object]) -> int | None:
  """The leading dimension of the call's first array argument (the batch, if it has one)."""
  for leaf in jax.tree.leaves((tuple(args), dict(kwargs))):
    shape = getattr(leaf, "shape", None)
    if shape:
      return int(shape[0])
  return None


def _resized_state(variables: tp.Mapping[str, tp.Any], batch: int):
  """The variables with every state array of another leading dimension made abstract at
  `batch`, and those arrays' paths and shapes (params and records are never batch-sized)."""
  found: dict[str, tuple[int, ...]] = {}

  def resize(path, leaf):
    value = leaf.unbox() if isinstance(leaf, meta.AxisMetadata) else leaf
    shape = tuple(getattr(value, "shape", ()))
    if len(shape) < 2 or shape[0] == batch:
      return leaf
    found["/".join(str(getattr(k, "key", k)) for k in path)] = shape
    new = jax.ShapeDtypeStruct((batch, *shape[1:]), value.dtype)
    return leaf.replace_boxed(new) if isinstance(leaf, meta.AxisMetadata) else new

  resized = {
    collection: tree
    if collection in ("params", "intermediates")
    else jax.tree_util.tree_map_with_path(
      lambda p, leaf, c=collection: resize((c, *p), leaf),
      tree,
      is_leaf=lambda x: isinstance(x, meta.AxisMetadata),
    )
    for collection, tree in variables.items()
  }
  return resized, found


def note_batch_sized_state(
  error: BaseException,
  variables: tp.Mapping[str, tp.Any],
  args: tp.Sequence[object],
  kwargs: tp.Mapping[str, object],
  rerun: tp.Callable[[tp.Any], object],
) -> None:
  """Note that the call failed on state sized for another batch, when running it again
  (abstractly: `rerun(variables)` under `jax.eval_shape`) with that state resized succeeds."""
  if not is_users(error) or has_note(error, "the state"):
    return
  batch = _call_batch(args, kwargs)
  if batch is None:
    return
  resized, found = _resized_state(variables, batch)
  sized = {shape[0] for shape in found.values()}
  if len(sized) != 1:
    return  # none, or several other sizes: not one batch the state was sized for
  try:
    jax.eval_shape(rerun, resized)
  except Exception:
    return  # resizing the state does not fix the call: the note would not be true
  paths = sorted(found)
  shapes = ", ".join(f"{p}: {found[p]}" for p in paths[:2]) + (", ..." if len(paths) > 2 else "")
  collections = ", ".join(f"'{c}'" for c in sorted({p.split("/")[0] for p in paths}))
  add_note(
    error,
    BATCH_SIZED_STATE.format(
      collections=collections, sized=sized.pop(), shapes=shapes, batch=batch
    ),
  )
