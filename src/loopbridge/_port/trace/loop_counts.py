"""Configurations with a loop's count of 1 set to 2: the evidence, and the check, for the widths
of a loop's later layers.

m3ae's MLP builds `depth` Dense layers, the first from the input and the rest from
`hidden_dim`. At `depth=1` the loop builds one layer, so every trace (the scaled
configurations change widths and counts of 2 and above; 1 is a flag or an identity to them)
reads its width from the input, and a port written from them builds every layer from the
input: equal at `depth=1`, broken at any other depth, and no check builds a second layer.
Here each integer setting of value 1 that a `range(...)` of the traced classes' sources reads
(a field, a config object's attribute) is set to 2. Each configuration Linen runs is traced:
its widths are evidence (the second layer's input is the first's output), and the check runs
the port there (`class_check._branch_checks`), so a loop kept at one layer's widths is never
`ok`.
"""

from __future__ import annotations

import re
import typing as tp

from flax import linen as nn

from ..plan.source import ClassSource
from ..records import Call
from .trace import Trace
from .tracing.settings import Location, Setting, settings

# At most this many configurations are traced (each one abstract init), and kept.
MAX_TRIES = 3
MAX_KEPT = 2


def _one(value: object) -> bool:
  return type(value) is int and value == 1


def _name(setting: Setting) -> str | None:
  """The last attribute a source reads the setting by (`depth` of `self.config.depth`)."""
  kind, key = setting.location[-1]
  return tp.cast(str, key) if kind == "attr" else None


def _counted(text: str, name: str) -> bool:
  """Whether `text` reads `.name` inside the parentheses of a `range(...)` call."""
  return re.search(rf"\brange\([^()]*(?:\([^()]*\)[^()]*)*\.{re.escape(name)}\b", text) is not None


def loop_counts(module: nn.Module, sources: tp.Iterable[ClassSource]) -> list[Setting]:
  """The settings of `module` of value 1 that a `range(...)` of `sources` reads by name."""
  texts = [src.text for src in sources]
  return [
    s
    for s in settings(module, candidate=_one)
    if (name := _name(s)) is not None and any(_counted(text, name) for text in texts)
  ]


def loop_count_configs(
  module: nn.Module,
  sources: tp.Iterable[ClassSource],
  sample: Call,
  streams: tp.Iterable[str],
  first_index: int,
  scaled: tp.Callable[[nn.Module], list[nn.Module]],
) -> list[tuple[nn.Module, Trace, str]]:
  """(module, trace, what changed) of each configuration with loop counts of 1 set to 2 that
  Linen runs: all of them at once, else each alone; then each kept one at its first scaled
  configuration (`scaled`), as `branch_configs` returns a change and its variants."""
  from .branch_configs import each_change

  counts = loop_counts(module, sources)
  if not counts:
    return []
  every: dict[Location, object] = {s.location: 2 for s in counts}
  tries = [every] + ([{s.location: 2} for s in counts] if len(counts) > 1 else [])
  by_location = {s.location: s for s in counts}

  def describe(change: tp.Mapping[Location, object]) -> str:
    named = ", ".join(f"{by_location[w].source('')[1:]}=2" for w in change)
    return f"{named} (a loop's count of 1 set to 2)"

  return each_change(
    module, tries[:MAX_TRIES], describe, sample, streams, first_index, scaled, MAX_KEPT
  )
