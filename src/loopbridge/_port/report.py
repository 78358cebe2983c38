"""The report of a draft: every change (file:line old -> new), every TODO, the measured verdict."""

from __future__ import annotations

import os
import typing as tp

from .records import Change, Check, Todo


def _short(path: str) -> str:
  return os.path.basename(path)


def render(
  root: str, changes: tp.Sequence[Change], todos: tp.Sequence[Todo], check: Check | None
) -> str:
  """The report text of a draft of `root`."""
  lines = [f"Drafted NNX port of {root}: {len(changes)} changes, {len(todos)} TODOs."]
  if changes:
    lines.append("")
    lines.append("Changes:")
    for ch in changes:
      lines.append(f"  {_short(ch.file)}:{ch.line}: {ch.old}")
      lines.append(f"      -> {ch.new}   ({ch.why})")
  if todos:
    lines.append("")
    lines.append("TODO (kept as the original lines; the port raises there):")
    for todo in todos:
      lines.append(f"  {_short(todo.file)}:{todo.line}: {todo.reason}")
      lines += [f"      | {ln}" for ln in todo.original.splitlines()]
  lines.append("")
  if check is None:
    lines.append("Verdict: not checked (check=False).")
  elif check.error is not None:
    lines.append(f"Verdict: the check did not run to the end: {check.error}")
  elif check.equal:
    n = len(check.reports)
    lines.append(f"Verdict: equal to the Linen model on {n} call{'s' if n != 1 else ''}.")
  else:
    lines.append(f"Verdict: NOT equal; first divergence at {check.first_divergence}.")
  if todos and check is not None and check.equal:
    lines.append("(Not ok: TODOs remain.)")
  return "\n".join(lines)
