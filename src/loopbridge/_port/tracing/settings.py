"""The integer settings of a Linen module, where they live, and copies with other values.

A setting is an integer a width may be computed from: a field (`self.hidden`), an element of a
tuple, list or dict field (`self.layer_sizes[1]`, `self.dims['mlp']`), an attribute of a config
object in a field (a dataclass, `ml_collections.ConfigDict`, HF's `PretrainedConfig`:
`self.config.mlp_dim`), nested. Each is located by its steps from the module and written in the
source's own spelling, so an expression of settings reads as the class's code.
"""

from __future__ import annotations

import copy
import dataclasses
import typing as tp

from flax import linen as nn

from .. import config_objects

# One step from a value to a part of it: ("attr", name) or ("item", index or key).
Step = tuple[str, object]
Location = tuple[Step, ...]

# Deeper than this, a setting is no width anyone writes.
_MAX_DEPTH = 4


@dataclasses.dataclass(frozen=True)
class Setting:
  """One integer setting of the module: where it is and its value at the sample."""

  location: Location
  value: int

  def source(self, owner: str = "self") -> str:
    """`self.config.mlp_dim`, `self.layer_sizes[1]`: the setting as the class reads it."""
    text = owner
    for kind, key in self.location:
      text += f".{key}" if kind == "attr" else f"[{key!r}]"
    return text


def _candidate(value: object) -> bool:
  # A width, a count or a length; 0 and 1 are flags and identities, negatives are axes.
  return type(value) is int and value >= 2


def _config_attrs(value: object) -> list[str] | None:
  """The attributes of a config object, or None when `value` is none."""
  if isinstance(value, (type, nn.Module)):
    return None
  if dataclasses.is_dataclass(value):
    return [f.name for f in dataclasses.fields(value)]
  found = config_objects.settings(value)
  if found is not None:
    return list(found)
  if type(value).__name__ in ("ConfigDict", "FrozenConfigDict"):  # ml_collections
    return [k for k in tp.cast(tp.Any, value) if isinstance(k, str)]
  return None


def _walk(value: object, at: Location, out: list[Setting], seen: set[int]) -> None:
  if len(at) > _MAX_DEPTH or id(value) in seen:
    return
  if _candidate(value):
    out.append(Setting(at, tp.cast(int, value)))
    return
  if isinstance(value, (tuple, list)):
    seen = seen | {id(value)}
    for i, item in enumerate(value):
      _walk(item, (*at, ("item", i)), out, seen)
    return
  if isinstance(value, dict):
    seen = seen | {id(value)}
    for k, item in value.items():
      if isinstance(k, (str, int)):
        _walk(item, (*at, ("item", k)), out, seen)
    return
  attrs = _config_attrs(value)
  if attrs is not None:
    seen = seen | {id(value)}
    for name in attrs:
      try:
        item = getattr(value, name)
      except Exception:  # a property that fails: no setting there
        continue
      _walk(item, (*at, ("attr", name)), out, seen)


def settings(module: nn.Module) -> list[Setting]:
  """Every integer setting of `module`'s fields (but `parent` and `name`)."""
  out: list[Setting] = []
  for f in dataclasses.fields(module):
    if f.name in ("parent", "name"):
      continue
    _walk(getattr(module, f.name, None), (("attr", f.name),), out, set())
  return out


def read(value: object, location: Location) -> object:
  for kind, key in location:
    value = getattr(value, tp.cast(str, key)) if kind == "attr" else tp.cast(tp.Any, value)[key]
  return value


def _replaced(value: object, step: Step, item: object, strict: bool = False) -> object:
  """A copy of `value` with one part replaced (the original is left alone). `strict`: a
  dataclass whose `__post_init__` refuses the value raises (a configuration its own checks
  forbid is none to check a port at); else the value is set on a copy (a symbol)."""
  kind, key = step
  if kind == "item":
    if isinstance(value, tuple):
      items = list(value)
      items[tp.cast(int, key)] = item
      # a NamedTuple rebuilds from its fields
      return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    out = copy.copy(value)
    tp.cast(tp.Any, out)[key] = item
    return out
  name = tp.cast(str, key)
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    try:
      return dataclasses.replace(tp.cast(tp.Any, value), **{name: item})
    except Exception:  # a __post_init__ that checks its values: set on a copy instead
      if strict:
        raise
  if strict and config_objects.settings(value) is not None:
    # An HF-style config rebuilt through its constructor, which checks its values.
    return config_objects.rebuilt(value, {name: item})
  if type(value).__name__ in ("ConfigDict", "FrozenConfigDict"):
    # Its type safety refuses a symbol in an int setting: rebuilt without it.
    found = tp.cast(tp.Any, value).to_dict()
    found[name] = item
    kind: tp.Any = type(value)
    return kind(found, type_safe=False) if kind.__name__ == "ConfigDict" else kind(found)
  out = copy.copy(value)
  object.__setattr__(out, name, item)
  return out


def _set(value: object, location: Location, item: object, strict: bool = False) -> object:
  if not location:
    return item
  head, rest = location[0], location[1:]
  kind, key = head
  inner = getattr(value, tp.cast(str, key)) if kind == "attr" else tp.cast(tp.Any, value)[key]
  return _replaced(value, head, _set(inner, rest, item, strict), strict)


def with_values(
  module: nn.Module, values: tp.Mapping[Location, object], strict: bool = False
) -> nn.Module:
  """A copy of `module` (no parent) with each setting set to its value; the original and the
  objects its fields hold are left as they are. `strict`: a config object's refusal raises."""
  by_field: dict[str, object] = {}
  for location, item in values.items():
    field = tp.cast(str, location[0][1])
    current = by_field.get(field, getattr(module, field))
    by_field[field] = _set(current, location[1:], item, strict)
  return module.clone(parent=None, **tp.cast(dict[str, tp.Any], by_field))
