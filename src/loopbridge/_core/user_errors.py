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

from flax import linen, nnx

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
