"""A user's class built through the module that holds it (magvit's StyleGAN block builds
`model_utils.BlurPool2D(filter_size=4)`).

The draft writes the port of every user class into its own file, under the class's name, and
imports the user's modules for what else the code reads. Kept as written, `model_utils.X(...)`
would build the user's Linen class (which takes no `rngs=`, and holds no NNX state) instead of
its port beside it. The construction names the drafted class instead. Hook:
`emit/construction.py` (a user class's construction).
"""

from __future__ import annotations

import typing as tp

from ..plan.source import dotted, libcst, resolve

WHY = "the class's port is drafted in this file: built by its name, not through its Linen module"


def drafted_name(planner: tp.Any, site: tp.Any, cls: type) -> str | None:
  """`BlurPool2D` where the construction's callee is `module.BlurPool2D`, the very class `cls`
  the draft ports; None for any other callee (a plain name, a local, a field)."""
  func = site.node.func
  if not isinstance(func, libcst().Attribute):
    return None
  return cls.__name__ if resolve(dotted(func), planner.src.namespace) is cls else None
