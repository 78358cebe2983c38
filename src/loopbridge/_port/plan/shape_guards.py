"""A layer under a test of the call's shapes that every trace took.

`if residual.shape != y.shape: residual = nn.Dense(self.features)(residual)` builds the
projection only where the input's width differs from `features`. `__init__` cannot evaluate
the test, and where every traced instance built the layer the port builds it always: right
wherever the widths differ, wrong (a layer Linen does not have) where they are equal, which no
trace at the sample's input size shows. Such a layer is noted here; the check then runs the
port at input sizes equal to the settings (`check/setting_sizes.py`), and where that fails the
note becomes the draft's TODO at the layer's line.
"""

from __future__ import annotations

import typing as tp

from ..records import Todo
from .find_sites import Site
from .source import libcst

# `rewrite_class.Planner`, typed loosely so this module stays below it.
Planner = tp.Any

# What a test reads of an array's shape.
_SHAPE_ATTRS = frozenset({"shape", "ndim", "size"})


def note_shape_guard(planner: Planner, site: Site) -> None:
  """Record `site` on the port when it is built always yet sits under a test of shapes."""
  tests = [t for t, _ in site.guards if t is not None and _reads_shape(t)]
  if not tests or planner.written_guard(site.guards, site.method) is not None:
    return
  test = " and ".join(planner.code(t) for t in tests)
  text = planner.src.text.splitlines()[site.lines[0] - 1].strip()
  reason = (
    f"a layer built only where `{test}` holds when called; every trace took that branch, so "
    "the port builds it in `__init__` always, and at an input size equal to a setting Linen "
    "does not build it: build it in `__init__` under the same test written with the input's "
    "width (an `in_features`-style argument), or port the branch by hand"
  )
  line = planner.src.line(site.lines[0])
  planner.port.shape_guards.append(Todo(planner.src.file, line, reason, text))


def _reads_shape(test: tp.Any) -> bool:
  """Whether `test` reads `.shape`, `.ndim` or `.size` of something, or calls `len`."""
  c = libcst()
  found = False

  class Find(c.CSTVisitor):
    def visit_Attribute(self, node) -> None:
      nonlocal found
      found = found or node.attr.value in _SHAPE_ATTRS

    def visit_Call(self, node) -> None:
      nonlocal found
      found = found or (isinstance(node.func, c.Name) and node.func.value == "len")

  test.visit(Find())
  return found
