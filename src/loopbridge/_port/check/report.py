"""The report of a draft: every change (file:line old -> new), every TODO, the measured verdict."""

from __future__ import annotations

import os
import typing as tp

from ..._diagnostics.compare_tolerance import HIGHEST, default_tolerance
from ..records import Change, Check, Todo


def _short(path: str) -> str:
  return os.path.basename(path)


def _tolerance_line(check: Check, precision: str) -> str:
  """What the check ran both models at and the tolerance it held them to, and why."""
  chosen = next(
    (r.default_tolerance for r in check.reports if r.default_tolerance is not None), None
  )
  if chosen is None:  # the check stopped before a comparison: what it would have used
    chosen = default_tolerance(precision=precision)
  return f"Tolerance: {chosen.reason}."


def render(
  root: str,
  changes: tp.Sequence[Change],
  todos: tp.Sequence[Todo],
  check: Check | None,
  precision: str = HIGHEST,
) -> str:
  """The report text of a draft of `root`, its check run at `precision`."""
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
  else:
    # What it was checked at, then the tolerance: the report ends with the measured verdict.
    if check.equal and check.checked:
      lines.append("Checked at: the given calls; " + "; ".join(check.checked) + ".")
    lines.append(_tolerance_line(check, precision))
    at = f"check_precision={precision!r}"
    if check.error is not None:
      lines.append(f"Verdict ({at}): the check did not run to the end: {check.error}")
    elif check.equal:
      n = len(check.reports)
      lines.append(f"Verdict ({at}): equal to the Linen model on {n} call{'s' if n != 1 else ''}.")
    else:
      lines.append(f"Verdict ({at}): NOT equal; first divergence at {check.first_divergence}.")
  if todos and check is not None and check.equal:
    lines.append("(Not ok: TODOs remain.)")
  return "\n".join(lines)
