"""A layer built through a local that chooses its class (`layer = A if c else B`, HF ResNet).

The port keeps the local, bound to the port of the class the trace saw built, with a guard
before it: a configuration whose condition chooses the other class raises, naming it, since
the construction's arguments were bound (and checked) for the traced class only.
"""

from __future__ import annotations

import dataclasses
import typing as tp

from ..plan.names import available
from ..plan.source import dotted, resolve

if tp.TYPE_CHECKING:
  from ..plan.find_sites import Site

# The planner (`rewrite_class.Planner`) is passed in; typed loosely so this module stays below it.
Planner = tp.Any


@dataclasses.dataclass
class Choice:
  """How the port writes the local: the class it binds and the branch that must hold."""

  drafted: type  # the class the trace saw this local build
  other: type
  taken: bool  # the value of the condition where `drafted` is chosen


def plan_chosen_class(planner: Planner, site: Site, refused: str) -> str | None:
  """Point `site` at the drafted class its local chooses, or say why not (`refused`, the
  generic reason, where the condition is not one `__init__` can evaluate on every instance)."""
  choice: tp.Any = site.chosen_class
  namespace = planner.init_namespace
  branches = [
    tp.cast(type, resolve(dotted(v), planner.src.namespace)) for v in (choice.body, choice.orelse)
  ]
  if not available(choice.test, namespace, set()):
    return refused
  test = planner.code(choice.test)
  values: set[bool] = set()
  for inst in planner.instances:
    try:
      # The Linen instance holds the fields the condition reads, as the port's `self` will.
      values.add(bool(eval(test, dict(namespace), {"self": inst.module})))
    except Exception:
      return refused
  if len(values) != 1:
    return refused
  taken = values.pop()
  drafted, other = branches if taken else branches[::-1]
  if drafted not in planner.ctx.ported:
    return f"{drafted.__qualname__}, the class {test} chooses here, was not drafted"
  site.target = drafted
  if id(choice) not in planner.choices:
    planner.choices[id(choice)] = Choice(drafted, other, taken)
    if other is not drafted:
      assign = planner.parents[choice]
      planner.change(
        planner.positions[assign].start.line,
        planner.code(assign),
        f"= {drafted.__name__}, after a guard that raises where the condition chooses "
        f"{other.__name__}",
        f"the sample configuration builds {drafted.__name__} here; {other.__name__} was not "
        "traced, so no port of it is drafted",
      )
  return None


def guard(choice: Choice, test: str) -> str:
  """The statement before the local: raises where the condition picks the class not drafted."""
  condition = f"not ({test})" if choice.taken else f"({test})"
  message = f"{choice.other.__name__} is not drafted (the sample built {choice.drafted.__name__})"
  return f"if {condition}:\n  raise NotImplementedError({message!r})\n"
