"""The text of one Linen class as drafting reads it, and libcst imported only when drafting."""

from __future__ import annotations

import dataclasses
import types
import typing as tp

from ..errors import NO_LIBCST, PortError

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
  # Read as one class with the user Linen base it inherits from (`field_only_subclass`,
  # `inherited_fields`): its port needs no Linen base.
  merged: bool = False
  # Where a transform wrote lines the file does not have (`comprehension_loops`): the file's
  # relative line of each line of `text`, by its position.
  line_origin: tuple[int, ...] | None = None

  def line(self, relative: int) -> int:
    """The file's line number of line `relative` (1-based) of `text`."""
    if self.line_origin is not None and 1 <= relative <= len(self.line_origin):
      relative = self.line_origin[relative - 1]
    return self.first_line + relative - 1

  def tree(self) -> cst.Module:
    return libcst().parse_module(self.text)


def dotted(node: tp.Any) -> str | None:
  """`a.b.c` for a chain of names and attributes, else None."""
  c = libcst()
  if isinstance(node, c.Name):
    return node.value
  if isinstance(node, c.Attribute):
    base = dotted(node.value)
    return None if base is None else f"{base}.{node.attr.value}"
  return None
