"""The configurations on the other side of a test the sources make: an optional width flipped,
a flag changed (`branch_configs.optional_configs`), each tuple of widths one item longer
(`tuple_lengths`), a loop's count of 1 set to 2 (`loop_counts`), what a field's partial binds
changed (`partial_fields`). Each is evidence for the widths and a configuration the check runs
the port at; one whose label another kind already traced is not traced twice."""

from __future__ import annotations

import typing as tp

from flax import linen as nn

from ..plan.source import ClassSource
from ..records import Call
from .branch_configs import optional_configs
from .loop_counts import loop_count_configs
from .partial_fields import partial_field_configs
from .trace import Trace
from .tuple_lengths import tuple_length_configs


def other_sides(
  module: nn.Module,
  sources: tp.Mapping[type, ClassSource],
  traced: Trace,
  sample: Call,
  streams: tp.Iterable[str],
  first_index: int,
  scaled: tp.Callable[[nn.Module], list[nn.Module]],
  done: tp.Collection[str],
) -> list[tuple[nn.Module, Trace, str]]:
  """(module, trace, label) of each such configuration, numbered from `first_index`."""
  out = [
    b
    for b in optional_configs(module, sources, traced, sample, streams, first_index, scaled)
    if b[2] not in done
  ]
  out += tuple_length_configs(module, sample, streams, first_index + len(out), scaled)
  out += loop_count_configs(
    module, sources.values(), sample, streams, first_index + len(out), scaled
  )
  out += partial_field_configs(module, sample, streams, first_index + len(out))
  return out
