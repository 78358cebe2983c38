"""The port at a setting changed together with the input axes that follow it.

A block that adds its input to a layer of `config.ch` channels runs in Linen only where the
input has `config.ch` channels: a configuration that changes `ch` alone, or an input that
changes its channels alone, is refused, so neither the derived configurations nor the check at
another input size ever tell a width written `self.config.ch` (or `x_features`) from the
sample's number. Changed together (an axis twice the setting's value twice the new one),
Linen runs, and the port is checked there. Only where the check at another input size found
no size Linen takes (`class_check.other_input_size`).
"""

from __future__ import annotations

import dataclasses
import typing as tp

from ..records import Call, Check, PortOf
from ..trace.tracing.settings import Setting, settings, with_values
from .class_check import (
  argument_label,
  call_arrays,
  checked_at,
  inits_in_linen,
  int_settings,
  merged,
  other_input_size,
  with_sizes,
)

# At most this many Linen inits are spent looking for a configuration Linen takes, and at most
# this many of those are checked (each builds, converts and runs the port once).
MAX_TRIES = 6
MAX_CHECKS = 2


def _new_size(value: int, taken: set[int]) -> int:
  """A multiple of `value` (which keeps the divisibility a model asserts) nothing else has."""
  for factor in (2, 3, 4, 5):
    if value * factor not in taken:
      return value * factor
  return value * 6


def _plans(
  result: tp.Any,
) -> list[tuple[list[Setting], int, dict[tuple[int | str, int], int]]]:
  """(settings changed, their new value, input axes resized and their sizes) per setting value
  and input axis size that is a multiple of it (equal first): each such setting alone, then all
  of that value together, the non-batch axes of that size as many times the new value as they
  were the old one."""
  sample: Call = result.calls[0]
  arrays = call_arrays(sample)
  found = settings(result.linen_module)
  taken = int_settings(result.linen_module) | {int(d) for a in arrays.values() for d in a.shape}
  axes: dict[int, list[tuple[int | str, int]]] = {}
  for where, a in arrays.items():
    for axis in range(1, a.ndim):
      axes.setdefault(int(a.shape[axis]), []).append((where, axis))
  out = []
  pairs = [(size // v, v, size) for v in {s.value for s in found} for size in axes if size % v == 0]
  for ratio, value, size in sorted(pairs):
    new = _new_size(value, taken)
    tied = [s for s in found if s.value == value]
    groups = [[s] for s in tied] + ([tied] if len(tied) > 1 else [])
    out += [(group, new, dict.fromkeys(axes[size], ratio * new)) for group in groups]
  return out


def _port_kwargs(
  result: tp.Any, other: tp.Any, sizes: dict[tuple[int | str, int], int]
) -> dict[str, object] | None:
  """The root port's arguments at `other` with the input resized, or None where an argument
  the draft added is neither an input size nor unset (its value there is unknown)."""
  fields = {f.name for f in dataclasses.fields(other)}
  kwargs: dict[str, object] = {}
  for name, value in result.init_kwargs.items():
    if isinstance(value, PortOf):
      return None  # a port handed in is built at its own instance's numbers
    if name in fields:
      kwargs[name] = getattr(other, name)
    elif name in result.input_sizes:
      kwargs[name] = sizes.get(tuple(result.input_sizes[name]), value)
    elif value is None:
      kwargs[name] = None
    else:
      return None
  return kwargs


def at_tied_sizes(result: tp.Any, verdict: Check) -> Check:
  """`verdict`, merged with the port's check where a setting and the input axes that follow it
  change together (only where the draft was equal so far)."""
  if not verdict.equal or other_input_size(result) is not None:
    return verdict
  sample: Call = result.calls[0]
  tries = checks = 0
  for group, new, sizes in _plans(result):
    if tries >= MAX_TRIES or checks >= MAX_CHECKS:
      break
    try:
      other = with_values(result.linen_module, {s.location: new for s in group}, strict=True)
    except Exception:  # a config object that refuses the value: no configuration to check
      continue
    kwargs = _port_kwargs(result, other, sizes)
    if kwargs is None:
      return verdict
    tries += 1
    call = with_sizes(sample, sizes)
    if not inits_in_linen(other, call):
      continue  # not a configuration Linen runs at
    checks += 1
    changed = ", ".join(
      [f"{s.source('')[1:]}={new}" for s in group]
      + [f"{argument_label(w)}.shape[{ax}]={n}" for (w, ax), n in sizes.items()]
    )
    where = f"a setting changed with the input axes that follow it ({changed})"
    resized = dataclasses.replace(result, linen_module=other, init_kwargs=kwargs)
    verdict = merged(verdict, checked_at(result, other, resized.build, call), where)
    if not verdict.equal:
      return verdict
  return verdict
