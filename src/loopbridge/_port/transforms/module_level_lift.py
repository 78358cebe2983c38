"""A class wrapped by a Linen lifted transform at module level (`Layer = nn.vmap(Layer, ...)`).

Linen's `nn.vmap`/`nn.scan`/`nn.remat` over a class make a subclass in `flax.linen.transforms`
(`VmapLayer`, `ScanLayer`, `CheckpointLayer`) and the module name is rebound to it, often
through a helper (`Layer = clone_layer(Layer)`). The draft ports the user's class inside.
Rematerialization (`nn.remat`, `nn.jit`) does not change what the layer computes, so that port
is the port of the wrapped class. Any other lift (a vmap over members, a scan over steps)
changes the variables' shapes and the call: the port of the class inside is one member, and a
TODO names the line that wraps it and the NNX transform to wrap the port with. Hook: `draft.py`
(the root's class) and the draft's `init_kwargs`.
"""

from __future__ import annotations

import ast
import inspect
import sys

from ..records import Change, Todo

# Lifted subclasses are named `transform.__name__.capitalize() + class name`; these transforms
# leave the computation as it is (remat is `checkpoint`).
_SAME_COMPUTATION = ("Checkpoint", "Remat", "Jit", "Named_call")

_NNX = {
  "Vmap": "nnx.vmap",
  "Scan": "nnx.scan",
  "Checkpoint": "nnx.remat",
  "Remat": "nnx.remat",
  "Jit": "nnx.jit",
}


def user_class(cls: type) -> type:
  """The user's class under the subclasses Linen's lifted transforms make (itself if none)."""
  from ..trace.trace import unlifted

  return unlifted(cls)[0]


def transforms_of(cls: type) -> tuple[str, ...]:
  """The lifted transforms around the user's class of `cls`, outermost first (`Vmap`)."""
  names: list[str] = []
  while cls.__module__.startswith("flax.linen.transforms") and len(cls.__bases__) == 1:
    base = cls.__bases__[0]
    names.append(cls.__name__[: len(cls.__name__) - len(base.__name__)] or cls.__name__)
    cls = base
  return tuple(names)


def is_lifted_user_class(cls: type) -> bool:
  """A class Linen's lifted transforms made around a class the user wrote."""
  from ..plan.standard_layers import is_linen_layer

  inner = user_class(cls)
  return inner is not cls and not is_linen_layer(inner)


def wrapping_statement(inner: type) -> tuple[int, str] | None:
  """The module-level statement that rebinds the class's name (`Layer = nn.vmap(Layer)`):
  its line and text, the last such assignment after the class."""
  module = sys.modules.get(inner.__module__)
  try:
    text = inspect.getsource(module) if module is not None else None
    first = inspect.getsourcelines(inner)[1]
  except (OSError, TypeError):
    return None
  if text is None:
    return None
  found = None
  for stmt in ast.parse(text).body:
    if isinstance(stmt, ast.Assign) and stmt.lineno > first:
      names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
      if inner.__name__ in names:
        found = (stmt.lineno, ast.get_source_segment(text, stmt) or inner.__name__)
  return found


def root_notes(cls: type, file: str, first_line: int) -> tuple[list[Todo], list[Change]]:
  """What the draft says about the root `cls` when Linen's lifts wrap it: a change for a lift
  that computes the same (remat), else a TODO naming the wrapping line and its NNX fix."""
  lifts = transforms_of(cls)
  if not lifts:
    return [], []
  inner = user_class(cls)
  where = wrapping_statement(inner)
  line, original = where if where is not None else (first_line, inner.__name__)
  if all(lift in _SAME_COMPUTATION for lift in lifts):
    lifted = ", ".join(f"nn.{lift.lower()}" for lift in lifts)
    why = f"Linen's {lifted} at module level (computes the same); ported unwrapped"
    fix = " / ".join(_NNX.get(lift, "") for lift in lifts)
    return [], [Change(file, line, original.splitlines()[0], f"{inner.__name__} ({fix})", why)]
  changed = [lift for lift in lifts if lift not in _SAME_COMPUTATION]
  nnx_names = ", ".join(
    _NNX.get(lift, f"the NNX counterpart of nn.{lift.lower()}") for lift in changed
  )
  reason = (
    f"`{original.splitlines()[0]}` wraps {inner.__name__} in Linen's lifted "
    f"{', '.join(f'nn.{lift.lower()}' for lift in changed)} at module level, which changes its "
    f"variables' shapes and its call; the port below is of {inner.__name__} itself (one member "
    f"or step). Fix: wrap the port the same way with {nnx_names}: build the members in "
    "__init__ with nnx.split_rngs + nnx.vmap over the rngs (the params on the axis "
    "variable_axes names), and call them through nnx.vmap with the same in_axes/out_axes "
    "(or nnx.scan over the steps); then lb.checkpoint.linen_to_nnx moves the variables"
  )
  return [Todo(file, line, reason, original)], []
