"""Layers that `setup` collects in a list before assigning it (published Linen's idiom).

HuggingFace ResNet/RegNet write `layers = [X(..., name="0")]`, then
`layers.append(X(..., name=str(i + 1)))` in a loop, then `self.layers = layers`; diffusers
append `block = X(...)` to a local list in a loop. The port keeps that code as it is, with each
construction written as its NNX construction in place and the list wrapped as an `nnx.List`;
the element's index in the list (its position in a literal, or `len(layers)` when appended)
picks its traced values.
"""

from __future__ import annotations

import typing as tp

from .source import dotted, libcst

# `find_sites` calls this module: its record (a `Site`) is typed loosely here so this module
# stays below it.
Site = tp.Any


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
