"""The symbolic trace made at a branch configuration, where a branch builds layers the sample's
configuration does not.

gemma's `Block` builds a norm only `if self.use_post_attn_norm`, and the norm's width is the
input's, which Linen ties to `embed_dim` (the block adds its input to the attention's
output). The branch configuration (`branch_configs.py`) traces the norm at the sample's sizes
only: its scaled variants must keep `embed_dim` (the input fixes it), so its width matches
`embed_dim`, the input's width and a constant 8 alike, and was kept as the sample's number.
The symbolic trace's trial (the same symbols, ties and multiples) made again at the branch
configuration gives the norm's width as the expression it is. It replaces the sample's
symbolic trace only where it traces every layer that one does, and more.
"""

from __future__ import annotations

import dataclasses
import typing as tp

from flax import linen as nn

from ...records import Call
from .symbolic import retraced
from .widths import SymbolicWidths

# At most this many branch configurations are tried (each one abstract init).
MAX_TRIES = 3


def _merged(root: nn.Module, branches: tp.Sequence[nn.Module]) -> nn.Module | None:
  """`root` with each field a branch changed set as that branch has it (the first branch's
  where two change one field), or None where no field changed."""
  updates: dict[str, object] = {}
  for f in dataclasses.fields(root):
    if f.name in ("parent", "name") or not f.init:
      continue
    mine = getattr(root, f.name, None)
    for branch in branches:
      theirs = getattr(branch, f.name, None)
      if theirs is not mine and not _equal(theirs, mine):
        updates[f.name] = theirs
        break
  return root.clone(parent=None, **tp.cast(dict[str, tp.Any], updates)) if updates else None


def _equal(a: object, b: object) -> bool:
  try:
    return bool(a == b)
  except Exception:  # arrays and other values without one truth value
    return False


def at_branches(
  view: SymbolicWidths | None,
  root: nn.Module,
  branches: tp.Sequence[tuple[nn.Module, tp.Any, str]],
  sample: Call,
  streams: tp.Iterable[str],
) -> SymbolicWidths | None:
  """`view`, or the symbolic trace made at the branch configurations (all their changes at
  once, else each alone) where it traces every layer `view`'s does and more."""
  if view is None:
    return None
  unscaled = [m for m, _, label in branches if "scaled" not in label and "distinct" not in label]
  if not unscaled:
    return view
  tries = [_merged(root, unscaled), *(unscaled if len(unscaled) > 1 else [])]
  have = set(view.found.trace.instances)
  for module in [m for m in tries if m is not None][:MAX_TRIES]:
    found = retraced(view.found, module, sample, streams)
    if found is not None and have < set(found.trace.instances):
      return dataclasses.replace(view, found=found)
  return view
