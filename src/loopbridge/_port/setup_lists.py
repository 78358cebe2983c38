"""Layers that `setup` collects in a list before assigning it (published Linen's idiom).

HuggingFace ResNet/RegNet write `layers = [X(..., name="0")]`, then
`layers.append(X(..., name=str(i + 1)))` in a loop, then `self.layers = layers`; diffusers
append `block = X(...)` to a local list in a loop. The port keeps that code as it is, with each
construction written as its NNX construction in place and the list wrapped as an `nnx.List`;
the element's index in the list (its position in a literal, or `len(layers)` when appended)
picks its traced values.
"""

from __future__ import annotations

import re
import typing as tp

from .source import dotted, libcst

if tp.TYPE_CHECKING:
  from .find_sites import Site
  from .hoist import Hoist
  from .rewrite_class import Planner


def _slot(node: tp.Any, parents: tp.Mapping[tp.Any, tp.Any]) -> tuple[str, str, str] | None:
  """Where a construction lands: ('local'|'attr', name, index expression), or None."""
  c = libcst()
  parent: tp.Any = parents.get(node)
  if isinstance(parent, c.Element):
    seq: tp.Any = parents.get(parent)
    assign: tp.Any = parents.get(seq)
    if not isinstance(seq, (c.List, c.Tuple)) or not isinstance(assign, c.Assign):
      return None
    if len(assign.targets) != 1 or assign.value is not seq:
      return None
    position = str(list(seq.elements).index(parent))
    target: tp.Any = assign.targets[0].target
    if isinstance(target, c.Name):
      return "local", target.value, position
    if isinstance(target, c.Attribute) and dotted(target.value) == "self":
      return "attr", target.attr.value, position
    return None
  if isinstance(parent, c.Arg):
    call: tp.Any = parents.get(parent)
    func: tp.Any = getattr(call, "func", None)
    if (
      isinstance(func, c.Attribute)
      and func.attr.value == "append"
      and isinstance(func.value, c.Name)
      and len(call.args) == 1
    ):
      return "local", func.value.value, f"len({func.value.value})"
  return None


def mark_setup_lists(
  module: tp.Any,
  sites: list[Site],
  parents: tp.Mapping[tp.Any, tp.Any],
  method_of: tp.Callable[[tp.Any], str],
) -> None:
  """Set `list_attr`/`list_index` on setup constructions that land in a list setup assigns."""
  c = libcst()
  appended: dict[str, str] = {}  # `layers.append(block)` in setup: block -> layers
  assigned: dict[str, str] = {}  # `self.layers = layers` in setup: layers -> 'layers'

  class Scan(c.CSTVisitor):
    def visit_Call(self, node: tp.Any) -> None:
      func: tp.Any = node.func
      if (
        isinstance(func, c.Attribute)
        and func.attr.value == "append"
        and isinstance(func.value, c.Name)
        and len(node.args) == 1
        and isinstance(node.args[0].value, c.Name)
        and method_of(node) == "setup"
      ):
        appended[node.args[0].value.value] = func.value.value

    def visit_Assign(self, node: tp.Any) -> None:
      target: tp.Any = node.targets[0].target if len(node.targets) == 1 else None
      if (
        isinstance(target, c.Attribute)
        and dotted(target.value) == "self"
        and isinstance(node.value, c.Name)
        and method_of(node) == "setup"
      ):
        assigned[node.value.value] = target.attr.value

  module.visit(Scan())
  for site in sites:
    if site.kind != "construct" or site.method != "setup" or site.nested_in is not None:
      continue
    slot = _slot(site.node, parents)
    if slot is None and site.local is not None and site.local in appended:
      local = appended[site.local]
      slot = ("local", local, f"len({local})")
    if slot is None:
      continue
    kind, name, index = slot
    attr = name if kind == "attr" else assigned.get(name)
    if attr is None or (kind == "attr" and site.comp is not None):
      continue
    site.list_attr, site.list_index = attr, index


def plan_setup_list(planner: Planner, site: Site, explicit: str | None) -> Hoist | str:
  """The hoist of one construction landing in a setup list, or why it cannot be paired.

  Linen names an element `<attr>_<i>` (or its own `name=`); the trace's submodules of the
  construction's class under those names, claimed by explicit names first, are its children
  in list order.
  """
  from .hoist import Hoist
  from .rewrite_class import _handed_in

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
      for k in planner.ctx.trace.children(inst.path)
      if not _handed_in(inst, k) and pattern.fullmatch(k.path[-1])
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
