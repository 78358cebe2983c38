"""A Linen class's own source, parsed once, and what its names refer to."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import textwrap
import types
import typing as tp

from .errors import NO_LIBCST, PortError, no_source

if tp.TYPE_CHECKING:
  import libcst as cst


def libcst() -> types.ModuleType:
  """libcst, imported only when drafting (the `port` extra)."""
  try:
    import libcst as module
  except ImportError as e:
    raise PortError(NO_LIBCST) from e
  return module


@dataclasses.dataclass
class ClassSource:
  """The text of one class (dedented), its file and first line, and its module's globals."""

  cls: type
  text: str
  file: str
  first_line: int  # line of the file where `text` starts
  namespace: dict[str, object]

  def line(self, relative: int) -> int:
    """The file's line number of line `relative` (1-based) of `text`."""
    return self.first_line + relative - 1

  def tree(self) -> cst.Module:
    return libcst().parse_module(self.text)


def read_class(cls: type) -> ClassSource:
  """The source of `cls`, or a `PortError` saying why it cannot be read and what to do."""
  from .transforms.field_only_subclass import merged_source
  from .transforms.relative_imports import absolute_imports

  merged = merged_source(cls, read_class)
  if merged is not None:
    return absolute_imports(merged)
  try:
    lines, first = inspect.getsourcelines(cls)
    file = inspect.getsourcefile(cls) or "<unknown>"
  except (OSError, TypeError) as e:
    raise PortError(no_source(cls, str(e))) from e
  module = sys.modules.get(cls.__module__)
  namespace = dict(vars(module)) if module is not None else {}
  return absolute_imports(ClassSource(cls, textwrap.dedent("".join(lines)), file, first, namespace))


def dotted(node: tp.Any) -> str | None:
  """`a.b.c` for a chain of names and attributes, else None."""
  c = libcst()
  if isinstance(node, c.Name):
    return node.value
  if isinstance(node, c.Attribute):
    base = dotted(node.value)
    return None if base is None else f"{base}.{node.attr.value}"
  return None


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
