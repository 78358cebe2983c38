"""A Linen class that subclasses another user-written Linen class is one TODO, not a wrong port.

The draft ports each class from its own source: a subclass's port would keep the Linen base
(whose inherited `__call__`, `setup` and fields are Linen's), or lose the inherited fields'
defaults. Until bases are ported too, the subclass is one TODO naming the base and the fix.
"""

from __future__ import annotations

from flax import linen as nn


def user_base(cls: type) -> type | None:
  """The first base of `cls` that is a Linen module written outside flax, if any."""
  for base in cls.__bases__:
    if (
      isinstance(base, type)
      and issubclass(base, nn.Module)
      and base is not nn.Module
      and not base.__module__.startswith("flax.")
    ):
      return base
  return None


def reason(cls: type) -> str | None:
  """Why `cls` is not drafted (it subclasses a user Linen class), or None."""
  base = user_base(cls)
  if base is None:
    return None
  return (
    f"{cls.__qualname__} subclasses the Linen class {base.__qualname__} "
    f"({base.__module__}), whose fields and methods it inherits; the draft ports each class "
    f"from its own source and would keep {base.__qualname__} as a Linen base. Write the port "
    f"by hand: an nnx.Module holding {base.__qualname__}'s fields and methods with this "
    "class's overrides (its Linen source is kept below)"
  )
