"""`self.conv_shortcut = None` in setup, then `if ...: self.conv_shortcut = nn.Conv(...)`
(diffusers' blocks): an NNX attribute first set to None is static, and a module assigned to it
later is refused. On a flax whose NNX tells static attributes from data (`nnx.data`), the
placeholder is `nnx.data(None)`.

Hook: `Rewriter.leave_Assign`.
"""

from __future__ import annotations

import typing as tp

from flax import nnx

from ..source import dotted, libcst

WHY = "a module may replace this None later (nnx.data keeps the attribute a data slot)"


def data_placeholder(rewriter: tp.Any, original: tp.Any, updated: tp.Any) -> tp.Any | None:
  """The assignment with `nnx.data(None)` (None: not this idiom)."""
  c = libcst()
  p = rewriter.p
  if rewriter.method != "setup" or not hasattr(nnx, "data") or len(original.targets) != 1:
    return None
  if not (isinstance(original.value, c.Name) and original.value.value == "None"):
    return None
  name = dotted(original.targets[0].target)
  if name is None or not name.startswith("self.") or name.count(".") != 1:
    return None
  if not any(s.kind == "construct" and s.setup_attr == name[5:] for s in p.sites):
    return None
  new = f"{p.code(original.targets[0].target)} = nnx.data(None)"
  p.change(p.positions[original].start.line, p.code(original), new, WHY)
  return updated.with_changes(value=c.parse_expression("nnx.data(None)"))
