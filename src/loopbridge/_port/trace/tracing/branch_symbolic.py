"""The symbolic trace made at a branch configuration, where a branch builds layers the sample's
configuration does not.

gemma's `Block` builds a norm only `if self.use_post_attn_norm`, and the norm's width is the
input's, which Linen ties to `embed_dim` (the block adds its input to the attention's
output). The branch configuration (`branch_configs.py`) traces the norm at the sample's sizes
only: its scaled variants must keep `embed_dim` (the input fixes it), so its width matches
`embed_dim`, the input's width and a constant 8 alike, and was kept as the sample's number.
The symbolic trace's trial (the same symbols, ties and multiples) made again at the branch
configuration gives the norm's width as the expression it is. It replaces the sample's
symbolic trace only where it traces every layer that one does (each of the same class), and
more; a class only a branch builds in place of another (Wav2Vec2's layer-norm conv layer for
its group-norm one) reads, while it is ported, the symbolic trace made at that branch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing as tp

from flax import linen as nn

from ...records import Call
from .. import config_objects
from ..configs import changed
from .symbolic import Symbolic, retraced
from .widths import SymbolicWidths

# At most this many branch configurations are tried (each one abstract init).
MAX_TRIES = 3


def _merged(root: nn.Module, branches: tp.Sequence[nn.Module]) -> nn.Module | None:
  """`root` with every field, and every attribute of a config object, that a branch changed
  set as that branch has it (the first branch's where two change one), or None where none."""
  values: dict[tuple[str, str | None], object] = {}
  for f in dataclasses.fields(root):
    if f.name in ("parent", "name") or not f.init:
      continue
    mine = getattr(root, f.name, None)
    attrs = _attributes(mine)
    for branch in branches:
      theirs = getattr(branch, f.name, None)
      if theirs is mine or _equal(theirs, mine):
        continue
      if attrs is None or type(theirs) is not type(mine):
        values.setdefault((f.name, None), theirs)
        continue
      for a in attrs:
        new = getattr(theirs, a, None)
        if not _equal(new, getattr(mine, a, None)):
          values.setdefault((f.name, a), new)
  if not values:
    return None
  try:
    return changed(root, values)
  except Exception:  # a config object that refuses the changes together
    return None


def _attributes(value: object) -> list[str] | None:
  """The attributes of a config object (a dataclass, or one that rebuilds from its dict)."""
  if dataclasses.is_dataclass(value) and not isinstance(value, (type, nn.Module)):
    return [f.name for f in dataclasses.fields(value)]
  found = config_objects.settings(value)
  return None if found is None else list(found)


def _equal(a: object, b: object) -> bool:
  try:
    return bool(a == b)
  except Exception:  # arrays and other values without one truth value
    return False


def _pairs(found: tp.Any) -> set[tuple[tuple[str, ...], type]]:
  return {(path, inst.cls) for path, inst in found.trace.instances.items()}


def at_branches(
  view: SymbolicWidths | None,
  root: nn.Module,
  branches: tp.Sequence[tuple[nn.Module, tp.Any, str]],
  sample: Call,
  streams: tp.Iterable[str],
) -> tuple[SymbolicWidths | None, list[Symbolic]]:
  """`view`, or the symbolic trace made at the branch configurations (all their changes at
  once, else each alone) where it traces every layer `view`'s does, of the same classes, and
  more; and each symbolic trace made there (`class_view` reads a class only they trace)."""
  if view is None:
    return None, []
  unscaled = [m for m, _, label in branches if "scaled" not in label and "distinct" not in label]
  if not unscaled:
    return view, []
  tries = [_merged(root, unscaled), *(unscaled if len(unscaled) > 1 else [])]
  made = [retraced(view.found, m, sample, streams) for m in tries[:MAX_TRIES] if m is not None]
  found = [f for f in made if f is not None]
  have = _pairs(view.found)
  wider = next((f for f in found if have < _pairs(f)), None)
  return (view if wider is None else dataclasses.replace(view, found=wider)), found


def _traces(found: Symbolic, cls: type) -> bool:
  return any(inst.cls is cls for inst in found.trace.instances.values())


@contextlib.contextmanager
def class_view(ctx: tp.Any, cls: type, extras: tp.Sequence[Symbolic]) -> tp.Iterator[None]:
  """While `cls` is ported: where the symbolic trace has no instance of it and one made at a
  branch configuration has (Wav2Vec2's layer-norm conv, built in place of the group-norm one),
  that trace is the symbolic one (the same symbols, at the same position among the traces)."""
  view: SymbolicWidths | None = ctx.symbolic
  found = (
    None
    if view is None or _traces(view.found, cls)
    else next((f for f in extras if _traces(f, cls)), None)
  )
  if view is None or found is None:
    yield
    return
  for inst in found.trace.instances.values():
    inst.config = view.index + 1  # as `symbolic_widths` numbers the symbolic trace's
  saved = ctx.alt_traces[view.index]
  ctx.alt_traces[view.index] = found.trace
  ctx.symbolic = dataclasses.replace(view, found=found)
  try:
    yield
  finally:
    ctx.alt_traces[view.index] = saved
    ctx.symbolic = view
