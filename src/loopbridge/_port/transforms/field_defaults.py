"""A dataclass field whose default names another name of the class body.

`cardinality: int = groups` reads `groups`'s default when the class is made (ResNeXt-style
blocks); as an `__init__` default the name is unbound (`NameError`). The port writes the value
the dataclass holds, `cardinality: int = 2`, which is what Linen's default is (a later
`groups=` does not change it there either).

Hook: the `__init__` signature (`rewrite_methods.port_class`).
"""

from __future__ import annotations

import typing as tp

from ..literals import literal
from ..names import names_in
from ..records import Change
from ..source import libcst

WHY = "a default naming another name of the class body is the value it had when the class was made"


def default_text(planner: tp.Any, field: tp.Any, value: tp.Any) -> str:
  """The `__init__` default of a dataclass field written `= value` in the class body."""
  code = planner.rewrite_expr(planner.code(value))
  if not names_in(value) & _class_body_names(planner.module.body[0]):
    return code
  text = literal(field.default)
  if text is None:
    return code  # no literal for it: kept as written (the check reports the NameError)
  src = planner.src
  line = _field_line(planner, field.name)
  planner.port.changes.append(Change(src.file, line, code, text, WHY))
  return text


def _class_body_names(classdef: tp.Any) -> set[str]:
  """The names the class body binds by assignment (its fields among them)."""
  c = libcst()
  found: set[str] = set()
  for stmt in classdef.body.body:
    if not isinstance(stmt, c.SimpleStatementLine):
      continue
    for small in stmt.body:
      if isinstance(small, c.AnnAssign) and isinstance(small.target, c.Name):
        found.add(small.target.value)
      elif isinstance(small, c.Assign):
        found.update(t.target.value for t in small.targets if isinstance(t.target, c.Name))
  return found


def _field_line(planner: tp.Any, name: str) -> int:
  """The source line of the field's statement in the class as read."""
  c = libcst()
  for stmt in planner.module.body[0].body.body:
    small: tp.Any = stmt.body[0] if isinstance(stmt, c.SimpleStatementLine) else None
    if isinstance(small, c.AnnAssign) and getattr(small.target, "value", None) == name:
      return planner.src.line(planner.positions[stmt].start.line)
  return planner.src.first_line
