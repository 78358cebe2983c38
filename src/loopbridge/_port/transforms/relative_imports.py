"""A relative import inside a class (`from ...models.auto import X` in a method, as HF's
encoder-decoder wrappers write in setup) names the package of the class's module: the port is
another module, where the same line raises ImportError. The class is read with each relative
import written absolute (`from transformers.models.auto import X`): the same module.

Hook: `source.read_class` (the text every later stage reads; lines keep their numbers).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import typing as tp

from ..class_source import ClassSource, libcst


def absolute_imports(src: ClassSource) -> ClassSource:
  """`src` with its relative imports made absolute (itself where it has none, or where the
  class's package is unknown)."""
  if "from ." not in src.text:
    return src
  module = sys.modules.get(src.cls.__module__)
  package = getattr(module, "__package__", None) or src.cls.__module__.rpartition(".")[0]
  if not package:
    return src
  c = libcst()

  class Absolute(c.CSTTransformer):
    def leave_ImportFrom(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      if not updated.relative:
        return updated
      dots = "." * len(updated.relative)
      rest = c.Module(body=[]).code_for_node(updated.module) if updated.module else ""
      try:
        name = importlib.util.resolve_name(dots + rest, package)
      except ImportError:
        return updated  # above the top-level package: left as written (it raises in Linen too)
      return updated.with_changes(relative=[], module=c.parse_expression(name))

  text = src.tree().visit(Absolute()).code
  return src if text == src.text else dataclasses.replace(src, text=text)
