"""A child class rematerialized at module level (`Block = nn.remat(Block)` after the class, then
`Block(4)(x)` in a parent): the name the parent builds is Linen's lifted subclass
(`CheckpointBlock`), which no NNX layer stands for.

The construction is planned as one of the user's class inside (its params are the same, under
the same names) and written as `remat_class(Block)(...)`: the draft's helper
(`flag_remat.py`) whose call runs the class's own call under `nnx.remat`. The options of the
wrapping line (`nn.remat(Block, prevent_cse=False)`) are kept where it is such a call;
rebound through a helper of the user's, the options cannot be read and `nnx.remat`'s defaults
apply (a missing `static_argnums` raises where a Python value is traced; the others change
memory and speed only). Hooks: `plan/find_sites.py` (the class), `emit/construction.py`.
"""

from __future__ import annotations

import ast
import sys
import typing as tp

from ..plan.source import dotted, resolve
from . import flag_remat
from .module_level_lift import is_lifted_user_class, transforms_of, user_class, wrapping_statement

WHY = (
  "Linen's nn.remat at module level makes a subclass whose call is rematerialized; the port "
  "builds the draft's remat_class of the class (its call under nnx.remat)"
)
_REMAT = frozenset({"Checkpoint", "Remat"})
_KEPT = frozenset({"prevent_cse", "static_argnums", "policy"})


def rematerialized(obj: object) -> bool:
  """A subclass Linen's `nn.remat` (only) made around a class of the user's."""
  from flax import linen as nn

  return (
    isinstance(obj, type)
    and issubclass(obj, nn.Module)
    and is_lifted_user_class(obj)
    and set(transforms_of(obj)) <= _REMAT
  )


def _options(inner: type) -> str:
  """`, prevent_cse=False` from the wrapping line `Block = nn.remat(Block, prevent_cse=False)`;
  '' where it has none or is not such a call."""
  from flax import linen as nn

  found = wrapping_statement(inner)
  if found is None:
    return ""
  try:
    stmt = ast.parse(found[1]).body[0]
  except SyntaxError:
    return ""
  value = getattr(stmt, "value", None)
  namespace = vars(sys.modules[inner.__module__])
  if not isinstance(value, ast.Call):
    return ""
  if resolve(ast.unparse(value.func), namespace) not in (nn.remat, nn.checkpoint):
    return ""
  kept = [k for k in value.keywords if k.arg in _KEPT]
  return "".join(f", {k.arg}={ast.unparse(k.value)}" for k in kept)


def construction(planner: tp.Any, site: tp.Any, cls: type) -> str | None:
  """`remat_class(Block)` for a construction of the module-level rematerialized `Block`."""
  target = resolve(dotted(site.node.func), planner.src.namespace)
  if not rematerialized(target) or user_class(tp.cast(type, target)) is not cls:
    return None
  planner.ctx.helpers.add(flag_remat.HELPER)
  return f"{flag_remat.HELPER}({cls.__name__}{_options(cls)})"
