"""A submodule named with a dot or another character no attribute takes
(`nn.Dense(4, name=f"down.block_{i}")`, as code ported from PyTorch names its layers): the
port's attribute is the name with each such character an underscore (`self.down_block[i]`);
the checkpoint converter pairs the layers by their calls.

Hook: `hoist.Hoist` (every attribute the port builds is named there).
"""

from __future__ import annotations

import keyword
import re


def attribute_name(name: str) -> str:
  """`down.block` -> `down_block`; an identifier stays as it is."""
  if name.isidentifier() and not keyword.iskeyword(name):
    return name
  out = re.sub(r"\W", "_", name)
  return out if out.isidentifier() and not keyword.iskeyword(out) else f"layer_{out}"
