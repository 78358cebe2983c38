"""Loop targets the rewrite leaves unread: `for width in ...` whose body no longer reads `width`
becomes `for _width in ...` (what linters expect of an unused target)."""

from __future__ import annotations

import typing as tp

from ..plan.names import loop_targets
from ..plan.source import libcst


def _reads(node) -> dict[str, int]:
  """How often each name occurs in `node` (reads and writes alike)."""
  c = libcst()
  counts: dict[str, int] = {}

  class Reads(c.CSTVisitor):
    def visit_Name(self, name) -> None:
      counts[name.value] = counts.get(name.value, 0) + 1

  node.visit(Reads())
  return counts


def mark_unread_targets(fn):
  """`for width in ...` whose body no longer reads `width` -> `for _width in ...`."""
  c = libcst()

  class Unread(c.CSTTransformer):
    def leave_For(self, original, updated):
      used = _reads(updated.body)
      names = [
        n
        for n in _target_names(updated.target)
        if used.get(n.value, 0) == 0 and not n.value.startswith("_")
      ]
      if not names:
        return updated
      renamed = {id(n) for n in names}

      class Rename(c.CSTTransformer):
        def leave_Name(self, orig, upd):
          return upd.with_changes(value=f"_{upd.value}") if id(orig) in renamed else upd

      return updated.with_changes(target=updated.target.visit(Rename()))

  return fn.visit(Unread())


def _target_names(target) -> list[tp.Any]:
  """The Name nodes a for-loop target binds (`i`, `(i, x)`)."""
  c = libcst()
  if isinstance(target, c.Name):
    return [target]
  if isinstance(target, (c.Tuple, c.List)):
    return [n for e in target.elements for n in _target_names(e.value)]
  return []


def loop_names(loops) -> set[str]:
  return set().union(*[loop_targets(loop) for loop in loops]) if loops else set()
