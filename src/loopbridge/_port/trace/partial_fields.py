"""A configuration with what each partial in a field binds changed: the check for a port that
kept the sample's bound values.

A field may hold a partial of a class (rlpd-style `base_cls=partial(MLP, hidden_dims=(256,
256))`, a ResNet's `norm=partial(nn.BatchNorm, momentum=0.9)`). Its bound values are settings
of the model, though no field of the class holds them: the scaled and distinct-valued
configurations never change them, so a port that wrote them as the sample's numbers passed
every check there and was wrong at another. Here each integer bound (a width, each integer
in a bound tuple) takes a fresh value and each float another; a configuration Linen runs is
checked (`class_check._branch_checks`) and its widths are evidence.
"""

from __future__ import annotations

import dataclasses
import functools
import typing as tp

from flax import linen as nn

from ..records import Call
from .trace import Trace, trace
from .tracing.distinct import fresh_width, input_sizes, other_float
from .tracing.settings import settings


def _other(value: object, used: set[int]) -> object:
  """Another value of a bound setting; the value itself where it is none (a flag, a name)."""
  if type(value) is int and value >= 2:
    return fresh_width(used)
  if type(value) is float and value != 0.0:
    return other_float(value)
  if isinstance(value, tuple) and value and all(type(v) is int for v in value):
    return tuple(fresh_width(used) if v >= 2 else v for v in value)
  return value


def partial_field_configs(
  module: nn.Module, sample: Call, streams: tp.Iterable[str], first_index: int
) -> list[tuple[nn.Module, Trace, str]]:
  """(module, trace, what changed) of the configuration with every field's partial binding
  other values, where there is one and Linen runs it; else []."""
  used = {s.value for s in settings(module)} | input_sizes(sample)
  changed: dict[str, object] = {}
  for f in dataclasses.fields(module):
    value = getattr(module, f.name, None)
    if f.name in ("parent", "name") or not isinstance(value, functools.partial):
      continue
    bound = {k: _other(v, used) for k, v in value.keywords.items()}
    if any(bound[k] is not v for k, v in value.keywords.items()):
      changed[f.name] = functools.partial(value.func, *value.args, **bound)
  if not changed:
    return []
  try:
    other = module.clone(parent=None, **tp.cast(dict[str, tp.Any], changed))
    got = trace(other, [(sample.method, sample.args, dict(sample.kwargs))], streams, first_index)
  except Exception:  # values the model refuses: no evidence, no check
    return []
  for inst in got.instances.values():
    inst.config = first_index
  names = ", ".join(changed)
  return [(other, got, f"what the partial in {names} binds changed")]
