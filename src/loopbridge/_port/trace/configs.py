"""Other configurations of the module to port: the evidence that tells a width of the class
from a number of one instance.

A width that equals `config.emb_dim` at the user's configuration may be `config.emb_dim`, or
`config.qkv_dim`, or a constant that happens to agree. Tracing the model again with its integer
fields changed tells them apart: what still agrees in every configuration is the expression.
Fields are changed by factors of 2 and 4 (multiples keep the divisibility a model asserts, as
`qkv_features % num_heads`), each field by a pattern of its own across the configurations (the
bits of its position), so that no two fields change alike in all of them.
"""

from __future__ import annotations

import dataclasses
import typing as tp

from flax import linen as nn

from ..errors import PortError, bad_config, config_failed
from ..records import Call, Change
from . import config_objects
from .trace import Trace, trace

# At most this many derived configurations are traced (each is one abstract init).
MAX_DERIVED = 5


def _scalable(value: object) -> bool:
  # A width, a count or a length; 0 and 1 are flags and identities, negatives are axes.
  return type(value) is int and value >= 2


def _config_fields(value: object) -> list[str]:
  """The scalable integer fields of a config dataclass (a field holding one), or the scalable
  integer settings of a config object that rebuilds from its dict."""
  if dataclasses.is_dataclass(value) and not isinstance(value, (type, nn.Module)):
    return [f.name for f in dataclasses.fields(value) if _scalable(getattr(value, f.name, None))]
  found = config_objects.settings(value)
  return [] if found is None else [k for k, v in found.items() if _scalable(v)]


def knobs(module: nn.Module) -> list[tuple[str, str | None]]:
  """(field, config attribute or None) of every integer the derived configurations change."""
  found: list[tuple[str, str | None]] = []
  for f in dataclasses.fields(module):
    if f.name in ("parent", "name"):
      continue
    value = getattr(module, f.name, None)
    if _scalable(value):
      found.append((f.name, None))
    else:
      found += [(f.name, a) for a in _config_fields(value)]
  return found


def changed(module: nn.Module, values: dict[tuple[str, str | None], object]) -> nn.Module:
  """`module` with each (field, config attribute or None) set to its value."""
  updates: dict[str, object] = {}
  for (field, attr), value in values.items():
    if attr is None:
      updates[field] = value
    else:
      inner = updates.get(field, getattr(module, field))
      if dataclasses.is_dataclass(inner):
        updates[field] = dataclasses.replace(inner, **{attr: value})  # pyright: ignore[reportArgumentType]
      else:  # a config object that rebuilds from its dict
        updates[field] = config_objects.rebuilt(inner, {attr: value})
  return module.clone(parent=None, **tp.cast(dict[str, tp.Any], updates))


def _changed(module: nn.Module, factors: dict[tuple[str, str | None], int]) -> nn.Module:
  scaled: dict[tuple[str, str | None], object] = {
    knob: tp.cast(int, _value(module, knob)) * f for knob, f in factors.items()
  }
  return changed(module, scaled)


def derived(
  module: nn.Module, fixed: tp.Collection[tuple[str, str | None]] = ()
) -> list[nn.Module]:
  """Other configurations of `module`: its integer fields (and its config's) scaled, but those
  in `fixed`.

  The first multiplies each by 2 (which most models build with); each next one multiplies the
  fields whose position has bit k set by 4 instead, so two fields differ in at least one.
  """
  found = [k for k in knobs(module) if k not in fixed]
  if not found:
    return []
  bits = max(1, len(found).bit_length())
  plans = [dict.fromkeys(found, 2)]
  for k in range(min(bits, MAX_DERIVED - 1)):
    plans.append({knob: 4 if (i + 1) >> k & 1 else 2 for i, knob in enumerate(found)})
  out = []
  for factors in plans:
    try:
      out.append(_changed(module, factors))
    except Exception:  # a config that refuses these values (its own checks): evidence, not a must
      continue
  return out


def user_configs(module: nn.Module, configs: tp.Sequence[object]) -> list[nn.Module]:
  """The user's `configs=`: other instances of the module's own class."""
  for c in configs:
    if not isinstance(c, nn.Module) or type(c) is not type(module):
      raise PortError(bad_config(type(module), c))
  return [tp.cast(nn.Module, c).clone(parent=None) for c in configs]


def _input_sizes(sample: Call) -> set[int]:
  """Every axis size of the sample call's arrays."""
  import jax

  leaves = jax.tree.leaves((sample.args, dict(sample.kwargs)))
  # Arrays only: a `Mesh` has a `shape` too (a dict of axis names).
  shapes = [leaf.shape for leaf in leaves if hasattr(leaf, "shape") and hasattr(leaf, "dtype")]
  return {int(n) for shape in shapes for n in shape}


def other_configs(
  module: nn.Module,
  configs: tp.Sequence[object] | None,
  sample: Call,
  streams: tp.Iterable[str],
) -> tuple[list[tuple[nn.Module, Trace]], list[tuple[str, str | None]]]:
  """Each other configuration whose sample call runs in Linen, with its trace (a derived one
  that does not build, as a width that must divide another, is left out); and the settings
  kept as they are in the derived ones (those the sample's input fixes)."""
  if configs is not None:
    out = []
    for index, other in enumerate(user_configs(module, configs)):
      try:
        out += _traced([other], sample, streams, strict=True, start=index)
      except PortError as e:
        # The sample call ran at the module's own fields: blame the instance, not the call.
        cause = e.__cause__ if e.__cause__ is not None else e
        raise PortError(config_failed(index, _shown(module, other), cause)) from cause
    return out, []
  out = _traced(derived(module), sample, streams)
  if out:
    return out, []
  # None builds: a setting the sample's input fixes (`num_channels` of the image a model
  # checks) changed with the rest. Keep each such suspect (a number equal to an axis of the
  # input) as it is, one at a time, then all together.
  sizes = _input_sizes(sample)
  suspects = [k for k in knobs(module) if _value(module, k) in sizes]
  for fixed in [*([s] for s in suspects), suspects if len(suspects) > 1 else []]:
    candidates = derived(module, fixed) if fixed else []
    first = _traced(candidates[:1], sample, streams)
    if first:
      return first + _traced(candidates[1:], sample, streams, start=len(first)), fixed
  return [], []


def _shown(module: nn.Module, other: nn.Module) -> str:
  """`other` written by the fields in which it differs from `module`: `Model(n=2)`."""
  fields = [
    f.name
    for f in dataclasses.fields(tp.cast(tp.Any, other))
    if f.init and f.name not in ("parent", "name")
  ]
  changed = [
    f"{name}={getattr(other, name)!r}"
    for name in fields
    if getattr(other, name, None) is not getattr(module, name, None)
    and not _equal(getattr(other, name, None), getattr(module, name, None))
  ]
  return f"{type(other).__qualname__}({', '.join(changed)})"


def _equal(a: object, b: object) -> bool:
  try:
    return bool(a == b)
  except Exception:  # arrays and other values without one truth value
    return False


def _value(module: nn.Module, knob: tuple[str, str | None]) -> object:
  field, attr = knob
  inner = getattr(module, field, None)
  return inner if attr is None else getattr(inner, attr, None)


def _traced(
  candidates: tp.Sequence[nn.Module],
  sample: Call,
  streams: tp.Iterable[str],
  strict: bool = False,
  start: int = 0,
) -> list[tuple[nn.Module, Trace]]:
  out: list[tuple[nn.Module, Trace]] = []
  for other in candidates:
    try:
      traced = trace(
        other, [(sample.method, sample.args, dict(sample.kwargs))], streams, start + len(out) + 1
      )
    except PortError:
      if strict:
        raise
      continue
    out.append((other, traced))
  return out


def literal_notes(ctx: tp.Any, cls: type) -> list[Change]:
  """Report rows for the numbers of `cls` kept literal though they change with the config."""
  port = ctx.ported[cls]
  resolver = port.resolver
  if resolver is None:
    return []
  return [
    Change(
      port.source.file,
      port.source.first_line,
      f"{hint} = {value!r} at the traced configuration",
      f"kept the literal {value!r}",
      f"a width of one instance, not of the class: {why}; write its expression by hand "
      "(the check at another configuration fails until then)",
    )
    for hint, value, why in resolver.unexplained
  ] + [
    Change(
      port.source.file,
      port.source.first_line,
      f"{hint}: no trace built this construction",
      "None",
      "a branch no traced configuration takes: write its value by hand before taking it; "
      "building the port there fails until then",
    )
    for hint in resolver.untraced
  ]
