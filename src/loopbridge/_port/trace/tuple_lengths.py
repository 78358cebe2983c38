"""Configurations with each tuple of widths one item longer: the evidence, and the check, for a
width read from a tuple's position.

An MLP built from `layer_sizes=(8, 8)` reads the width after its loop as `self.layer_sizes[1]`
in every scaled or distinct-valued configuration, where `self.layer_sizes[-1]` is what it means;
a loop's next layer takes the previous item, whatever the count. Those configurations change a
tuple's items, never its length, so nothing there tells the two apart, and a draft written from
them fails to build (or, worse, builds) where a user adds a layer. Here each tuple (or list) of
integer settings, a field or an item of a config object, gets one item more, a width no setting
has. Each configuration Linen runs is traced: its widths are evidence, and the check runs the
port there (`class_check._branch_checks`), so a width kept at one position is never `ok`.
"""

from __future__ import annotations

import typing as tp

from flax import linen as nn

from ..records import Call
from .trace import Trace
from .tracing.distinct import fresh_width, input_sizes
from .tracing.settings import Location, read, settings

# At most this many longer configurations are traced (each one abstract init), and kept.
MAX_TRIES = 4
MAX_KEPT = 2


def _width_tuple(value: object) -> bool:
  """A tuple or list of integers, one of them a width (0 and 1 are flags, not widths)."""
  return (
    isinstance(value, (tuple, list))
    and not hasattr(value, "_fields")  # a NamedTuple's length is its type's
    and bool(value)
    and all(type(v) is int for v in value)
    and any(tp.cast(int, v) >= 2 for v in value)
  )


def width_tuples(module: nn.Module) -> dict[Location, tuple[int, ...] | list[int]]:
  """Each tuple or list of integer settings of `module` (by where it is), as `settings` finds
  their items: a field's, a config object's, nested."""
  found: dict[Location, tp.Any] = {}
  for s in settings(module):
    if not s.location or s.location[-1][0] != "item" or not isinstance(s.location[-1][1], int):
      continue
    where = s.location[:-1]
    if where in found:
      continue
    try:
      value = read(module, where)
    except Exception:  # not readable back: no such tuple
      continue
    if _width_tuple(value):
      found[where] = value
  return found


def _longer(value: tp.Any, item: int) -> tp.Any:
  return [*value, item] if isinstance(value, list) else (*value, item)


def _describe(where: Location, value: object) -> str:
  text = "".join(f".{k}" if kind == "attr" else f"[{k!r}]" for kind, k in where)[1:]
  return f"{text}={value!r}"


def tuple_length_configs(
  module: nn.Module,
  sample: Call,
  streams: tp.Iterable[str],
  first_index: int,
  scaled: tp.Callable[[nn.Module], list[nn.Module]],
) -> list[tuple[nn.Module, Trace, str]]:
  """(module, trace, what changed) of each configuration with tuples of widths one item longer
  that Linen runs: all of them at once, else each alone; then each kept one at its first scaled
  configuration (`scaled`), as `branch_configs` returns a change and its variants."""
  from .branch_configs import each_change

  tuples = width_tuples(module)
  if not tuples:
    return []
  fresh = fresh_width({s.value for s in settings(module)} | input_sizes(sample))
  longer = {where: _longer(v, fresh) for where, v in tuples.items()}
  tries = [longer] + ([{w: v} for w, v in longer.items()] if len(longer) > 1 else [])

  def describe(change: tp.Mapping[Location, object]) -> str:
    return ", ".join(_describe(w, v) for w, v in change.items()) + " (a tuple one item longer)"

  return each_change(
    module, tries[:MAX_TRIES], describe, sample, streams, first_index, scaled, MAX_KEPT
  )
