"""Configurations where every setting takes a value of its own: the check of a width matched
by value.

A width the symbolic trace does not decide (a setting kept concrete, a float setting, a trace
that failed) is matched by value across configurations; equal values collide there
(`emb == hidden`), and a scaled configuration keeps them equal. Here every integer setting
(fields, tuple and dict items, config objects' attributes) takes a distinct prime no other
setting or input size has, in the order of the sample's values, and every float setting
another value, so a width written as the wrong setting, or kept as the sample's number,
differs from Linen's there. Where Linen refuses every such configuration (a setting that must
divide another), distinct powers of two in the sample's order are tried, which keep it; where
Linen refuses those too (a bound between settings, as a rotary width within the head width),
the sample's values scaled by one factor with equal ones moved apart, which keep every relation
but those between equal-valued settings.
"""

from __future__ import annotations

import dataclasses
import typing as tp

from flax import linen as nn

from .settings import Location, _config_attrs, settings, with_values

# Two spreads: primes just above each value, and above 2.5 times it (a rounding that maps a
# value and its next prime to the same width, `make_divisible`, differs at the second).
SPREADS = (1.0, 2.5)


def _is_prime(n: int) -> bool:
  return n >= 2 and all(n % k for k in range(2, int(n**0.5) + 1))


def _floats(value: object, at: Location, out: list[tuple[Location, float]], depth: int) -> None:
  if depth > 4:
    return
  if type(value) is float and value != 0.0:
    out.append((at, value))
  elif isinstance(value, (tuple, list)):
    for i, item in enumerate(value):
      _floats(item, (*at, ("item", i)), out, depth + 1)
  elif (attrs := _config_attrs(value)) is not None:
    for name in attrs:
      try:
        item = getattr(value, name)
      except Exception:  # a property that fails: no setting there
        continue
      _floats(item, (*at, ("attr", name)), out, depth + 1)


def float_settings(module: nn.Module) -> list[tuple[Location, float]]:
  out: list[tuple[Location, float]] = []
  for f in dataclasses.fields(module):
    if f.name not in ("parent", "name"):
      _floats(getattr(module, f.name, None), (("attr", f.name),), out, 0)
  return out


def other_float(value: float) -> float:
  """Another value of a float setting: a probability stays below 1."""
  return value * 1.5 if value >= 1.0 or value * 1.5 < 1.0 else (value + 1.0) / 2


def distinct_values(
  module: nn.Module, taken: tp.Collection[int], spread: float, keep: tp.Collection[int] = ()
) -> dict[Location, object]:
  """Each setting's value in the configuration of `spread` (see `SPREADS`); a setting whose
  sample value is in `keep` (an input size the model checks it against) is left as it is."""
  found = sorted(settings(module), key=lambda s: s.value)
  used = set(taken) | {s.value for s in found}
  values: dict[Location, object] = {}
  n = 2
  for s in found:
    if s.value in keep:
      continue
    n = max(n, int(s.value * spread) + 1)
    while not _is_prime(n) or n in used:
      n += 1
    used.add(n)
    values[s.location] = n
  for location, value in float_settings(module):
    values[location] = other_float(value)
  return values


# Powers of two up to this, or up to `_MAX_GROWTH` times a setting's sample value: beyond,
# the widths make a check too large to run (a setting as large as 3072 in the sample, HF's
# default `hidden_dim`, runs at the next power of two).
_MAX_POWER = 2**12
_MAX_GROWTH = 4


def ordered_values(module: nn.Module, keep: tp.Collection[int] = ()) -> dict[Location, object]:
  """Each setting's value in a configuration that keeps the sample's order and divisibility:
  distinct powers of two, each above its sample value, increasing in the sample's order (a
  smaller setting divides a larger one, as `heads` divides `features`; a setting twice another
  adjacent in that order stays twice it). {} where a power grows past `_MAX_POWER` and past
  `_MAX_GROWTH` times its sample value."""
  values: dict[Location, object] = {}
  power = 1
  for s in sorted(settings(module), key=lambda s: s.value):
    if s.value in keep:
      continue
    power *= 2
    while power <= s.value:
      power *= 2
    if power > max(_MAX_POWER, _MAX_GROWTH * s.value):
      return {}
    values[s.location] = power
  for location, value in float_settings(module):
    values[location] = other_float(value)
  return values


# The common factors `split_values` tries (each a kind of its own), and the factors a setting's
# value moves by from there where it is taken: down first where another setting has it (a
# setting equal to another is often bounded by a ratio of others, as a rotary width by the
# head width), up first where only an input size has it (no bound of a setting).
_SCALES = (4, 8, 16)
_DOWN_FIRST = (1.0, 0.5, 0.25, 2.0, 4.0)
_UP_FIRST = (1.0, 2.0, 4.0, 0.5, 0.25)


def split_values(
  module: nn.Module, scale: int, taken: tp.Collection[int] = (), keep: tp.Collection[int] = ()
) -> dict[Location, object]:
  """Each setting's value in a configuration that keeps every relation of the sample between
  settings of different values (a divisor, a bound, a ratio): all scaled by `scale`, and
  settings of equal sample value moved apart by powers of two, each distinct from the others
  and from the input's sizes. {} where that gives no distinct values."""
  used: set[int] = set()
  values: dict[Location, object] = {}
  for s in sorted(settings(module), key=lambda s: s.value):
    if s.value in keep:
      continue
    moves = _DOWN_FIRST if s.value * scale in used else _UP_FIRST
    moved = [s.value * scale * f for f in moves]
    free = [int(v) for v in moved if v % 1 == 0 and v >= 2 and int(v) not in {*used, *taken}]
    if not free:
      return {}
    used.add(free[0])
    values[s.location] = free[0]
  for location, value in float_settings(module):
    values[location] = other_float(value)
  return values


# How the values of a distinct-valued configuration are chosen: its label's words, and the
# values (of the module, the input sizes, the sizes kept) for each kind, in the order tried.
KINDS: tuple[tuple[str, tp.Callable[..., dict[Location, object]]], ...] = (
  *(("", lambda m, taken, keep, s=s: distinct_values(m, taken, s, keep)) for s in SPREADS),
  (
    "powers of two in the sample's order, as Linen refused the primes",
    lambda m, taken, keep: ordered_values(m, keep),
  ),
  *(
    (
      f"the sample's values times {k}, equal ones moved apart, as Linen refused the primes "
      "and the powers of two",
      lambda m, taken, keep, k=k: split_values(m, k, taken, keep),
    )
    for k in _SCALES
  ),
)


def distinct_configs(
  module: nn.Module, taken: tp.Collection[int], values_of: tp.Callable[..., dict]
) -> list[nn.Module]:
  """The configurations of one kind, in the order to try: every setting distinct, then the
  settings equal to an input size kept (`num_channels` of the image the model checks)."""
  out = []
  for keep in ((), taken):
    try:
      values = values_of(module, taken, keep)
      if values:
        out.append(with_values(module, values, strict=True))
    except Exception:  # a config object that refuses the values: no such configuration
      continue
  return out


def describe(module: nn.Module, other: nn.Module) -> str:
  """`hidden=11, mlp_ratio=3.0, layer_sizes[1]=13`: where `other`'s settings differ."""
  from .settings import read

  parts = []
  locations = [s.location for s in settings(module)] + [loc for loc, _ in float_settings(module)]
  for location in locations:
    try:
      a, b = read(module, location), read(other, location)
    except Exception:  # not readable in the other: not described
      continue
    if a != b:
      text = "".join(f".{k}" if kind == "attr" else f"[{k!r}]" for kind, k in location)[1:]
      parts.append(f"{text}={b}")
  return ", ".join(parts[:8]) + (", ..." if len(parts) > 8 else "")


LABEL = "every setting distinct"


def input_sizes(sample: tp.Any) -> set[int]:
  """Every axis size of the sample call's arrays."""
  import jax

  leaves = jax.tree.leaves((sample.args, dict(sample.kwargs)))
  return {int(n) for a in leaves if hasattr(a, "shape") and hasattr(a, "dtype") for n in a.shape}


def fresh_width(used: set[int]) -> int:
  """A width above every one in `used` (settings, input sizes, those taken before), which it
  joins."""
  n = max([*used, 2]) + 1
  used.add(n)
  return n


def distinct_traces(
  reference: nn.Module,
  bases: tp.Sequence[tuple[nn.Module, str]],
  sample: tp.Any,
  streams: tp.Iterable[str],
  start: int,
) -> list[tuple[nn.Module, tp.Any, str]]:
  """(configuration, its trace, its label) of the distinct-valued configurations of each
  (base, what it changed) whose sample call runs in Linen: per spread, the first that does."""
  from ...errors import PortError
  from ..trace import trace

  taken = input_sizes(sample)
  out: list[tuple[nn.Module, tp.Any, str]] = []
  call = [(sample.method, sample.args, dict(sample.kwargs))]
  for base, note in bases:
    before = len(out)
    for kind, values_of in KINDS:
      if kind and len(out) > before:
        break  # the primes ran: the order-keeping values are only for where Linen refuses them
      for other in distinct_configs(base, taken, values_of):
        try:
          traced = trace(other, call, streams, start + len(out) + 1)
        except PortError:  # Linen refuses these values (a width one must divide): the next
          continue
        notes = [n for n in (kind, note) if n]
        changed = describe(reference, other)
        label = LABEL + (f": {changed}" if changed else "") + "".join(f" ({n})" for n in notes)
        out.append((other, traced, label))
        break
  return out


def add_distinct(
  reference: nn.Module,
  bases: tp.Sequence[tuple[nn.Module, str]],
  sample: tp.Any,
  streams: tp.Iterable[str],
  others: list[tuple[nn.Module, tp.Any]],
) -> tuple[str, ...]:
  """`distinct_traces` of `bases` appended to `others` (configuration, trace); their labels."""
  found = distinct_traces(reference, bases, sample, streams, len(others))
  others += [(other, traced) for other, traced, _ in found]
  return tuple(label for _, _, label in found)
