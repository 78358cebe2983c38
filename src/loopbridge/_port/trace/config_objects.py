"""Config objects that are no dataclass: HuggingFace's `PretrainedConfig` and its kind.

The evidence for a width (`width_exprs`) and the derived configurations that gather it
(`configs`) read a config's integer settings. A dataclass lists them as fields; an object that
rebuilds from its own dict (`type(config)(**config.to_dict())`) lists them in that dict.
"""

from __future__ import annotations

import typing as tp

from flax import linen as nn


def settings(value: object) -> dict[str, object] | None:
  """The settings of a config object that rebuilds from its own dict, else None."""
  to_dict = getattr(value, "to_dict", None)
  if isinstance(value, (type, nn.Module)) or not callable(to_dict):
    return None
  try:
    found = to_dict()
    if not isinstance(found, dict):
      return None
    type(value)(**tp.cast(dict[str, tp.Any], found))
  except Exception:  # not a config of that kind: no evidence read from it
    return None
  # Only what reads back as set (a dict key that is no attribute is not `config.key`).
  return {k: v for k, v in found.items() if isinstance(k, str) and getattr(value, k, None) == v}


def rebuilt(value: object, changed: tp.Mapping[str, object]) -> object:
  """`value` with the settings in `changed`, rebuilt from its dict."""
  return type(value)(**{**tp.cast(tp.Any, value).to_dict(), **changed})
