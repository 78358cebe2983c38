"""Plan a construction that lands in a setup list (`setup_lists` marked it): its hoist."""

from __future__ import annotations

import re
import typing as tp

from .hoist import Hoist, handed_in

if tp.TYPE_CHECKING:
  from .find_sites import Site

# The planner (`rewrite_class.Planner`) is passed in; typed loosely so this module stays below it.
Planner = tp.Any


def plan_setup_list(planner: Planner, site: Site, explicit: str | None) -> Hoist | str:
  """The hoist of one construction landing in a setup list, or why it cannot be paired.

  Linen names an element `<attr>_<i>` (or its own `name=`); the trace's submodules of the
  construction's class under those names, claimed by explicit names first, are its children
  in list order.
  """
  attr = tp.cast(str, site.list_attr)
  cls = site.target
  # Linen names an unnamed element `<attr>_<i>`; bare numbers only where the list's own
  # constructions pass `name=` (another list's `"0"` is not this one's).
  named = any(
    s.list_attr == attr
    and any(a.keyword is not None and a.keyword.value == "name" for a in s.node.args)
    for s in planner.sites
  )
  pattern = re.compile(rf"{re.escape(attr)}_(\d+)" + (r"|(\d+)" if named else ""))
  children = {}
  for inst in planner.instances:
    # Every element of the list, in list order: the index expression picks this one's.
    kids = [
      k
      for k in planner.trace.children(inst.path)
      if not handed_in(inst, k) and pattern.fullmatch(k.path[-1])
    ]
    kids.sort(key=lambda k: _number(pattern, k.path[-1]))
    children[inst.path] = kids
  made = [k for kids in children.values() for k in kids]
  name = getattr(cls, "__name__", str(cls))
  if not made:
    return f"no submodule the trace saw matches this construction of {name} into self.{attr}"
  # Elements of other classes are fine for a drafted class: its index picks its own element,
  # and the values of the others are never read (HF RegNet: conv, SE, conv in one list).
  if any(k.cls is not cls for k in made) and cls not in planner.ctx.ported:
    return (
      f"the list self.{attr} holds layers of several classes "
      f"({', '.join(sorted({k.cls.__name__ for k in made}))}); build it by hand"
    )
  if explicit is not None and not all(
    any(k.path[-1] == explicit for k in kids) for kids in children.values() if kids
  ):
    return f"the layer named {explicit!r} is not in the list self.{attr} the trace saw"
  return Hoist(attr, site, children, True)


def _number(pattern: re.Pattern[str], name: str) -> int:
  found = tp.cast(re.Match, pattern.fullmatch(name))
  return int(next(g for g in found.groups() if g is not None))
