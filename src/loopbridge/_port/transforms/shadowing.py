"""A field named like a method of `nnx.Module` (`train`, `eval`, `sow`, ...), renamed.

Linen keeps `self.train` a plain field; in the port `self.train = train` would hide NNX's own
`Module.train()` (and `model.train()` would raise "'bool' object is not callable"). The
attribute becomes `train_` in the drafted class; the constructor argument keeps its name, so
the port is built as the Linen module was.
"""

from __future__ import annotations

import typing as tp

from flax import nnx

from ..plan.source import libcst
from ..records import Change


def shadowing(fields: tp.Iterable[str]) -> list[str]:
  """The fields whose name is a method of `nnx.Module`."""
  return [f for f in fields if callable(getattr(nnx.Module, f, None))]


def renamed(code: str, names: tp.Sequence[str]) -> str:
  """`code` (one drafted class) with every `self.<name>` read or write as `self.<name>_`."""
  c = libcst()
  wanted = set(names)

  class Rename(c.CSTTransformer):
    def leave_Attribute(self, original, updated):
      if (
        isinstance(updated.value, c.Name)
        and updated.value.value == "self"
        and updated.attr.value in wanted
      ):
        return updated.with_changes(attr=c.Name(f"{updated.attr.value}_"))
      return updated

  return c.parse_module(code).visit(Rename()).code


def shadowing_changes(file: str, line: int, names: tp.Sequence[str]) -> list[Change]:
  return [
    Change(
      file,
      line,
      f"field {n}",
      f"self.{n}_ (the argument stays {n})",
      f"nnx.Module has a method {n}(); an attribute of that name would hide it",
    )
    for n in names
  ]
