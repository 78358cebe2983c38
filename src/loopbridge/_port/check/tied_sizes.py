"""The port at a setting changed together with the input axes that follow it.

A block that adds its input to a layer of `config.ch` channels runs in Linen only where the
input has `config.ch` channels: a configuration that changes `ch` alone, or an input that
changes its channels alone, is refused, so neither the derived configurations nor the check at
another input size ever tell a width written `self.config.ch` (or `x_features`) from the
sample's number. Changed together (an axis twice the setting's value twice the new one),
Linen runs, and the port is checked there. Only where the check at another input size found
no size Linen takes (`class_check.other_input_size`). Also at each configuration on the other
side of a test (gemma's `Block` builds a norm of the input's width only
`if self.use_post_attn_norm`): a width only that configuration builds is traced at the sample's
sizes alone there, where a setting and the input axis it equals cannot be told apart.
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
# Of the branch configurations, at most this many are checked so (one check each).
MAX_BRANCHES = 3


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


def _branches(result: tp.Any) -> list[tuple[tp.Any, str]]:
  """(module, label) of each configuration on the other side of a test the draft traced (a
  flag flipped, a tuple one item longer: `trace/other_sides.py`) at the user's numbers: a layer
  only such a configuration builds has widths the sample's configuration never checks."""
  labels: tp.Sequence[str] = result.config_labels or ("",) * len(result.configs)
  return [
    (module, label)
    for (module, _), label in zip(result.configs, labels, strict=False)
    if label and "scaled" not in label and not label.startswith("every setting distinct")
  ][:MAX_BRANCHES]


def at_tied_sizes(result: tp.Any, verdict: Check) -> Check:
  """`verdict`, merged with the port's check where a setting and the input axes that follow it
  change together (only where the draft was equal so far): at the sample's configuration, then
  at each branch configuration (`_branches`)."""
  if not verdict.equal or other_input_size(result) is not None:
    return verdict
  plans = _plans(result)
  bases = [(result.linen_module, "", MAX_CHECKS), *((m, lab, 1) for m, lab in _branches(result))]
  for base, label, max_checks in bases:
    verdict, known = _at(result, base, label, plans, max_checks, verdict)
    if not known or not verdict.equal:
      return verdict
  return verdict


def _at(
  result: tp.Any,
  base: tp.Any,
  label: str,
  plans: list[tuple[list[Setting], int, dict[tuple[int | str, int], int]]],
  max_checks: int,
  verdict: Check,
) -> tuple[Check, bool]:
  """`verdict` merged with the checks of `plans` applied to `base` (at most `max_checks`), and
  False where the port's arguments there are unknown (no check can run)."""
  sample: Call = result.calls[0]
  tries = checks = 0
  for group, new, sizes in plans:
    if tries >= MAX_TRIES or checks >= max_checks:
      break
    try:
      other = with_values(base, {s.location: new for s in group}, strict=True)
    except Exception:  # a config object that refuses the value: no configuration to check
      continue
    kwargs = _port_kwargs(result, other, sizes)
    if kwargs is None:
      return verdict, False
    tries += 1
    call = with_sizes(sample, sizes)
    if not inits_in_linen(other, call):
      continue  # not a configuration Linen runs at
    checks += 1
    changed = ", ".join(
      [f"{s.source('')[1:]}={new}" for s in group]
      + [f"{argument_label(w)}.shape[{ax}]={n}" for (w, ax), n in sizes.items()]
    )
    at = f", at {label}" if label else ""
    where = f"a setting changed with the input axes that follow it ({changed}{at})"
    resized = dataclasses.replace(result, linen_module=other, init_kwargs=kwargs)
    verdict = merged(verdict, checked_at(result, other, resized.build, call), where)
    if not verdict.equal:
      return verdict, True
  return verdict, True
