"""A submodule named with a dot or another character no attribute takes
(`nn.Dense(4, name=f"down.block_{i}")`, as code ported from PyTorch names its layers): the
port's attribute is the name with each dot an underscore (`self.down_block[i]`);
the checkpoint converter pairs the layers by their calls.

Hook: `hoist.Hoist` (every attribute the port builds is named there).
"""

from __future__ import annotations

import keyword


def attribute_name(name: str) -> str:
  """`down.block` -> `down_block`; a name without a dot stays as it is."""
  if "." not in name:
    return name  # other names (HF T5's "0", "1") are placed by the planner as they are
  out = name.replace(".", "_")
  return out if out.isidentifier() and not keyword.iskeyword(out) else name
