"""What a Linen class carries for Linen's own machinery, left out of its port (each reported).

diffusers' Flax models are the example: `@flax_register_to_config` (it reads the Linen
dataclass's fields when the model is built), the bases `FlaxModelMixin, ConfigMixin` beside
`nn.Module` (loading and saving Linen variables), and `init_weights`, whose body is
`self.init(...)["params"]`: an NNX module creates its variables in its constructor, so none of
them has a meaning for the port.
"""

from __future__ import annotations

import typing as tp

from ..plan.source import dotted, libcst

# Linen's entry points that build a model's variables.
_INIT_CALLS = frozenset({"init", "init_with_output", "lazy_init"})

DROPPED_DECORATOR = "a class decorator wraps the Linen dataclass (its fields, its __init__)"
DROPPED_BASE = (
  "a mixin beside nn.Module works on the Linen model (its variables, its dataclass fields); "
  "add it back if the port needs it"
)
DROPPED_INIT_METHOD = (
  "it builds the Linen variables with self.init; the NNX port creates them in __init__"
)


def calls_linen_init(fn: tp.Any) -> bool:
  """Whether a method calls `self.init(...)` (or `init_with_output`, `lazy_init`)."""
  c = libcst()
  found = False

  class Finder(c.CSTVisitor):
    def visit_Call(self, node: tp.Any) -> None:
      nonlocal found
      func = node.func
      if (
        isinstance(func, c.Attribute)
        and dotted(func.value) == "self"
        and func.attr.value in _INIT_CALLS
      ):
        found = True

  fn.visit(Finder())
  return found


def is_mixin_base(base: object) -> bool:
  """A base class that is not a Linen module (`FlaxModelMixin`, `ConfigMixin`)."""
  from flax import linen as nn

  return isinstance(base, type) and not issubclass(base, nn.Module) and base is not object
