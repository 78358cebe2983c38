"""Per-instance values -> one expression: a literal, a field, or a new constructor argument.

A class is written once for all its instances. A number the trace gives (an input width, a
shape, whether a conditional layer exists) becomes a literal when every instance agrees, a
field when it equals that field in every instance, and otherwise a constructor argument of
its own whose value each instance's parent passes (so no value is ever guessed).
"""

from __future__ import annotations

import dataclasses
import typing as tp

import numpy as np

from .trace import Instance

_MISSING = object()


def literal(value: object) -> str | None:
  """Python source for a plain value (None when it has none that round-trips)."""
  if value is None or isinstance(value, (bool, int, float, str)):
    text = repr(value)
  elif isinstance(value, np.dtype) or (isinstance(value, type) and hasattr(value, "dtype")):
    # A dtype (`jnp.float32` is a scalar type): its name, which every jax dtype= accepts.
    try:
      text = repr(np.dtype(value).name)
    except TypeError:
      return None
  elif isinstance(value, (tuple, list)):
    items = [literal(v) for v in value]
    if any(i is None for i in items):
      return None
    inner = ", ".join(tp.cast(list[str], items))
    text = (
      f"({inner},)"
      if isinstance(value, tuple) and len(items) == 1
      else (f"({inner})" if isinstance(value, tuple) else f"[{inner}]")
    )
  else:
    return None
  return text


@dataclasses.dataclass
class Extra:
  """A constructor argument the draft adds: its name and each instance's value."""

  name: str
  values: dict[tuple[str, ...], object]  # instance path -> value

  def annotation(self) -> str:
    sample = next(iter(self.values.values()))
    return type(sample).__name__ if isinstance(sample, (bool, int, float, tuple)) else "object"


class Resolver:
  """Turns per-instance values into expressions for one class (owns its added arguments)."""

  def __init__(self, instances: tp.Sequence[Instance], fields: tp.Sequence[str]):
    self.instances = list(instances)
    self.fields = list(fields)
    self.extras: dict[str, Extra] = {}

  def expr(self, values: tp.Mapping[tuple[str, ...], object], hint: str) -> str:
    """The expression (valid in `__init__`) equal to `values[path]` in every instance."""
    distinct = list(values.values())
    if distinct and all(v == distinct[0] and type(v) is type(distinct[0]) for v in distinct):
      text = literal(distinct[0])
      if text is not None:
        return text
    for name in self.fields:
      if all(
        type(v) in (int, bool, tuple) and _field(inst, name) == v
        for inst in self.instances
        if (v := values.get(inst.path, _MISSING)) is not _MISSING
      ):
        return f"self.{name}"
    for extra in self.extras.values():
      if extra.values == dict(values):
        return extra.name
    name = hint
    n = 1
    while name in self.extras or name in self.fields:
      n += 1
      name = f"{hint}_{n}"
    self.extras[name] = Extra(name, dict(values))
    return name


def _field(inst: Instance, name: str) -> object:
  return getattr(inst.module, name, _MISSING)
