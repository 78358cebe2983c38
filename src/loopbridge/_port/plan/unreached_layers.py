"""A setup layer that no traced call reached, and whose input width nothing shows.

Linen makes a layer's variables at its first call. vqgan-jax's `ResnetBlock` builds
`self.temb_proj = nn.Dense(...)` in setup and calls it only `if temb is not None`; where no call
passes `temb`, Linen's variables have no `temb_proj` and nothing says the width it would be
given. The port takes that width as an argument (`temb_proj_in_features: int | None = None`)
and builds the layer only where it is given: by default what Linen holds after the calls
traced, and the layer for a caller that passes the width. Only for a layer the source does
nothing with but call: one whose attributes are read (`self.conv.features`) must be built,
and stays a TODO.
"""

from __future__ import annotations

import typing as tp

from .source import dotted, libcst

# `rewrite_class.Planner` and `hoist.Hoist`, typed loosely so this module stays below them.
Planner = tp.Any
Hoist = tp.Any

# The NNX arguments that are a layer's input width, which Linen reads at the first call.
INPUT_WIDTHS = frozenset({"in_features", "num_features"})

WHY = (
  "no traced call reached this layer, so Linen made no variables for it and nothing says the "
  "width it is given: the port builds it only where that width is passed, as Linen at its "
  "first call"
)


def optional_widths(planner: Planner, hoist: Hoist, missing: tp.Sequence[str]) -> dict[str, str]:
  """{NNX argument: the added constructor argument holding it} for a setup layer only called
  and never reached; {} where that does not hold (the construction stays a TODO)."""
  attr = hoist.site.setup_attr
  if (
    attr is None
    or hoist.is_list
    or hoist.site.method != "setup"
    or not set(missing) <= INPUT_WIDTHS
    or not only_called(planner.src.text, attr)
  ):
    return {}
  added: dict[str, str] = {}
  for name in missing:
    extra = f"{attr}_{name}"
    planner.resolver.add_extra(extra, {i.path: None for i in planner.instances}, [], default="None")
    added[name] = extra
  planner.change(
    hoist.site.lines,
    f"self.{attr}: no traced call",
    ", ".join(f"{n}={a} (built when given)" for n, a in added.items()),
    WHY,
  )
  return added


def when_given(code: str, added: tp.Mapping[str, str]) -> str:
  """`code` built only where every added width is given, else None."""
  test = " and ".join(f"{a} is not None" for a in added.values())
  return f"({code} if {test} else None)"


def only_called(text: str, attr: str) -> bool:
  """Whether every read of `self.<attr>` in the class source `text` is a call of it."""
  c = libcst()
  reads = 0
  calls = 0
  assigned = 0

  class Find(c.CSTVisitor):
    def visit_Attribute(self, node) -> None:
      nonlocal reads
      if node.attr.value == attr and dotted(node.value) == "self":
        reads += 1

    def visit_Call(self, node) -> None:
      nonlocal calls
      func = node.func
      if isinstance(func, c.Attribute) and func.attr.value == attr and dotted(func.value) == "self":
        calls += 1

    def visit_AssignTarget(self, node) -> None:
      nonlocal assigned
      target = node.target
      if (
        isinstance(target, c.Attribute)
        and target.attr.value == attr
        and dotted(target.value) == "self"
      ):
        assigned += 1

  c.parse_module(text).visit(Find())
  return assigned == 1 and reads == calls + assigned
