"""A Linen class's own source, parsed once, and what its names refer to."""

from __future__ import annotations

import inspect
import sys
import textwrap
import typing as tp

from ..errors import PortError, no_source

# The class's text and the lazy libcst import live in `class_source`, which the transforms that
# `read_class` calls import too (from here they would be an import cycle).
from .class_source import ClassSource as ClassSource
from .class_source import dotted as dotted
from .class_source import libcst as libcst


def read_class(cls: type) -> ClassSource:
  """The source of `cls`, or a `PortError` saying why it cannot be read and what to do."""
  from ..transforms.comprehension_loops import comprehension_loops
  from ..transforms.field_only_subclass import merged_source
  from ..transforms.inherited_fields import inherited_source
  from ..transforms.relative_imports import absolute_imports

  merged = merged_source(cls, read_class) or inherited_source(cls, read_class)
  if merged is not None:
    return comprehension_loops(absolute_imports(merged))
  try:
    lines, first = inspect.getsourcelines(cls)
    file = inspect.getsourcefile(cls) or "<unknown>"
  except (OSError, TypeError) as e:
    raise PortError(no_source(cls, str(e))) from e
  module = sys.modules.get(cls.__module__)
  namespace = dict(vars(module)) if module is not None else {}
  src = ClassSource(cls, textwrap.dedent("".join(lines)), file, first, namespace)
  return comprehension_loops(absolute_imports(src))


def resolve(name: str | None, namespace: tp.Mapping[str, object]) -> object:
  """The object a dotted name refers to in `namespace` (None when it cannot be told)."""
  if name is None:
    return None
  head, *rest = name.split(".")
  if head not in namespace:
    return None
  value = namespace[head]
  for part in rest:
    value = getattr(value, part, None)
    if value is None:
      return None
  return value


def self_target(stmt: tp.Any) -> str | None:
  """`attr` of a statement line `self.attr = ...` (one target, one statement), else None."""
  c = libcst()
  if not isinstance(stmt, c.SimpleStatementLine) or len(stmt.body) != 1:
    return None
  assign = stmt.body[0]
  if not isinstance(assign, c.Assign) or len(assign.targets) != 1:
    return None
  target = assign.targets[0].target
  if isinstance(target, c.Attribute) and dotted(target.value) == "self":
    return target.attr.value
  return None


def is_docstring(stmt: tp.Any) -> bool:
  """A method body's first statement is its docstring (kept ahead of a lifted body)."""
  c = libcst()
  return (
    isinstance(stmt, c.SimpleStatementLine)
    and isinstance(stmt.body[0], c.Expr)
    and isinstance(stmt.body[0].value, (c.SimpleString, c.ConcatenatedString))
  )
