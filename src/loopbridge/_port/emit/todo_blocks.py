"""The block a TODO leaves in the drafted code: why, the original lines, and a `raise`."""

from __future__ import annotations

import textwrap
import typing as tp

from ..plan.source import libcst


def todo_block(reason: str, code: str, file: str, line: int) -> tp.Any:
  """A TODO as the draft writes one: the reason and the original code as comments, then a
  `raise` (the port fails loudly there). The reason is in the comment and the report; the
  message says where (short, lint-clean)."""
  c = libcst()
  wrapped = textwrap.wrap(f"TODO(port): {reason}", 80) or [""]
  comments = [f"# {wrapped[0]}", *(f"#   {w}" for w in wrapped[1:])]
  comments += [f"#   | {ln}" for ln in code.splitlines()]
  message = f"TODO(port) at {file.rsplit('/', 1)[-1]}:{line}"
  stmt = c.parse_statement(f"raise NotImplementedError({message!r})\n")
  return stmt.with_changes(leading_lines=[c.EmptyLine(comment=c.Comment(t)) for t in comments])
