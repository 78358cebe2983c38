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


def _walk(
  value: object,
  at: Location,
  out: list[Setting],
  seen: set[int],
  candidate: tp.Callable[[object], bool] = _candidate,
) -> None:
  if len(at) > _MAX_DEPTH or id(value) in seen:
    return
  if candidate(value):
    out.append(Setting(at, tp.cast(int, value)))
    return
  if type(value) is int:
    return
  if isinstance(value, (tuple, list)):
    seen = seen | {id(value)}
    for i, item in enumerate(value):
      _walk(item, (*at, ("item", i)), out, seen, candidate)
    return
  if isinstance(value, dict):
    seen = seen | {id(value)}
    for k, item in value.items():
      if isinstance(k, (str, int)):
        _walk(item, (*at, ("item", k)), out, seen, candidate)
    return
  attrs = _config_attrs(value)
  if attrs is not None:
    seen = seen | {id(value)}
    for name in attrs:
      try:
        item = getattr(value, name)
      except Exception:  # a property that fails: no setting there
        continue
      _walk(item, (*at, ("attr", name)), out, seen, candidate)


def settings(
  module: nn.Module, candidate: tp.Callable[[object], bool] = _candidate
) -> list[Setting]:
  """Every integer setting of `module`'s fields (but `parent` and `name`); `candidate` says
  which integers count (by default widths, counts and lengths: 2 and above)."""
  out: list[Setting] = []
  for f in dataclasses.fields(module):
    if f.name in ("parent", "name"):
      continue
    _walk(getattr(module, f.name, None), (("attr", f.name),), out, set(), candidate)
  return out


def read(value: object, location: Location) -> object:
  for kind, key in location:
    value = getattr(value, tp.cast(str, key)) if kind == "attr" else tp.cast(tp.Any, value)[key]
  return value


def _replaced(value: object, items: tp.Mapping[Step, object], strict: bool = False) -> object:
  """A copy of `value` with its parts replaced, all at once (the original is left alone; a
  config whose checks tie settings, `n_inner == 2 * n_embd`, sees them changed together).
  `strict`: a dataclass whose `__post_init__` refuses the values raises (a configuration its
  own checks forbid is none to check a port at); else they are set on a copy (symbols)."""
  if all(kind == "item" for kind, _ in items):
    if isinstance(value, tuple):
      parts = list(value)
      for (_, key), item in items.items():
        parts[tp.cast(int, key)] = item
      # a NamedTuple rebuilds from its fields
      return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
    out = copy.copy(value)
    for (_, key), item in items.items():
      tp.cast(tp.Any, out)[key] = item
    return out
  named = {tp.cast(str, key): item for (_, key), item in items.items()}
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    try:
      return dataclasses.replace(tp.cast(tp.Any, value), **named)
    except Exception:  # a __post_init__ that checks its values: set on a copy instead
      if strict:
        raise
  if strict and config_objects.settings(value) is not None:
    # An HF-style config rebuilt through its constructor, which checks its values.
    return config_objects.rebuilt(value, named)
  if type(value).__name__ in ("ConfigDict", "FrozenConfigDict"):
    # Its type safety refuses a symbol in an int setting: rebuilt without it.
    found = tp.cast(tp.Any, value).to_dict()
    found.update(named)
    kind: tp.Any = type(value)
    return kind(found, type_safe=False) if kind.__name__ == "ConfigDict" else kind(found)
  out = copy.copy(value)
  for name, item in named.items():
    object.__setattr__(out, name, item)
  return out


def _set(value: object, changes: tp.Mapping[Location, object], strict: bool = False) -> object:
  """`value` with each location (relative to it) set to its item, each object rebuilt once."""
  if () in changes:
    return changes[()]
  by_step: dict[Step, dict[Location, object]] = {}
  for location, item in changes.items():
    by_step.setdefault(location[0], {})[location[1:]] = item
  items: dict[Step, object] = {}
  for (kind, key), rest in by_step.items():
    inner = getattr(value, tp.cast(str, key)) if kind == "attr" else tp.cast(tp.Any, value)[key]
    items[(kind, key)] = _set(inner, rest, strict)
  return _replaced(value, items, strict)


def with_values(
  module: nn.Module, values: tp.Mapping[Location, object], strict: bool = False
) -> nn.Module:
  """A copy of `module` (no parent) with each setting set to its value; the original and the
  objects its fields hold are left as they are. `strict`: a config object's refusal raises."""
  by_field: dict[str, dict[Location, object]] = {}
  for location, item in values.items():
    by_field.setdefault(tp.cast(str, location[0][1]), {})[location[1:]] = item
  changed = {f: _set(getattr(module, f), rest, strict) for f, rest in by_field.items()}
  return module.clone(parent=None, **tp.cast(dict[str, tp.Any], changed))
