"""A method handing the module itself to a plain function of its file that uses Linen's module
API on it: big_vision's `get_posemb(self, self.posemb, (h, w), c, "pos_embedding", x.dtype)`,
whose body runs `self.param(name, ...)`.

The port's module is an NNX module: the same call would reach `.param` on it and fail when the
port runs. The draft cannot move what the function makes into `__init__` without porting the
function, so the call is a TODO saying what the function does and what to write instead.
"""

from __future__ import annotations

import inspect
import re
import types
import typing as tp

from ..plan.source import libcst

# Linen's module API: what an NNX module does not have (or has with other meaning).
LINEN_API = (
  "param",
  "variable",
  "sow",
  "make_rng",
  "put_variable",
  "get_variable",
  "has_variable",
  "has_rng",
  "variables",
  "is_initializing",
  "is_mutable_collection",
)


def linen_api_used(namespace: tp.Mapping[str, object], call: tp.Any) -> str | None:
  """For `f(..., self, ...)` with `f` a plain function of the module's file whose body uses
  Linen's API on the parameter `self` is given as: the TODO's reason; else None."""
  c = libcst()
  func = call.func
  if not isinstance(func, c.Name):
    return None
  fn = namespace.get(func.value)
  if not isinstance(fn, types.FunctionType):
    return None
  handed = next(
    (
      (i, a)
      for i, a in enumerate(call.args)
      if isinstance(a.value, c.Name) and a.value.value == "self" and not a.star
    ),
    None,
  )
  if handed is None:
    return None  # the common case: no source is read
  try:
    params = list(inspect.signature(fn).parameters)
    source = inspect.getsource(fn)
  except (OSError, TypeError, ValueError):
    return None
  i, arg = handed
  name = arg.keyword.value if arg.keyword is not None else params[i] if i < len(params) else None
  if name is None:
    return None
  used = sorted(set(re.findall(rf"\b{re.escape(name)}\.({'|'.join(LINEN_API)})\b", source)))
  if not used:
    return None
  api = ", ".join(f"{name}.{u}" for u in used)
  return (
    f"{func.value}(...) is handed the module and uses Linen's module API on it ({api}), "
    "which an NNX module does not have: make what it makes in __init__ (a param is "
    "`self.NAME = nnx.Param(init(rngs.params(), shape, dtype))`) and pass that to the "
    "function, or port the function as a method"
  )
