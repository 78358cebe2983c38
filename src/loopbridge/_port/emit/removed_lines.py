"""A report row for each line the draft removes from a method (nothing dropped silently).

A line whose value only moved constructions read (`d = x.shape[-1]` for a Dense now built in
`__init__`, `conv = partial(nn.Conv, ...)`) is computed in `__init__` now; the method loses it.
"""

from __future__ import annotations

import typing as tp

from ..plan.source import libcst


def removed_line(rewriter: tp.Any, name: str) -> None:
  """Record the removal of the method's assignment to `name` (found in its original source)."""
  c = libcst()
  fn = rewriter.original_fn
  if fn is None:
    return
  found: list[tp.Any] = []

  class Find(c.CSTVisitor):
    def visit_SimpleStatementLine(self, stmt) -> None:
      body = stmt.body[0] if stmt.body else None
      if isinstance(body, c.Assign) and any(
        isinstance(t.target, c.Name) and t.target.value == name
        for t in body.targets  # pyright: ignore[reportOptionalMemberAccess]
      ):
        found.append(stmt)

  fn.visit(Find())
  if not found:
    return
  planner = rewriter.p
  stmt = found[0]
  planner.change(
    planner.positions[stmt].start.line,
    planner.code(stmt).strip(),
    "(removed from the method)",
    f"only constructions moved to __init__ read {name}; __init__ computes what they need",
  )
