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

  def line(self, relative: int) -> int:
    """The file's line number of line `relative` (1-based) of `text`."""
    return self.first_line + relative - 1

  def tree(self) -> cst.Module:
    return libcst().parse_module(self.text)
