"""Python source for a plain value: the one spelling every drafted literal shares."""

from __future__ import annotations

import ast
import typing as tp

import numpy as np

from ..plan.source import libcst


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


def string_literal(node: tp.Any) -> str | None:
  """The string a libcst expression spells literally (`"cache"`, `'0'`), else None."""
  try:
    value = ast.literal_eval(libcst().Module([]).code_for_node(node))
  except (ValueError, SyntaxError):
    return None
  return value if isinstance(value, str) else None
