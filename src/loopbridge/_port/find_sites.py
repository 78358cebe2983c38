"""Find, in one class's source, every place that drafting must change (one read-only pass).

A *site* is a Linen construction (`nn.Dense(4)`, `Block(...)`), a variable declaration
(`self.param`, `self.variable`), or a Linen idiom (`self.make_rng`, `self.sow`, ...). Each site
knows its method, its enclosing `for` loop (a construction made once per iteration) and its
statement, so the rewrite can hoist or replace it.
"""

from __future__ import annotations

import ast
import dataclasses
import typing as tp

from .source import dotted, libcst, resolve

if tp.TYPE_CHECKING:
  import libcst as cst


@dataclasses.dataclass
class Site:
  kind: str  # "construct" | "param" | "variable" | "self_api" | "lift" | "linen_ref"
  node: tp.Any  # cst.Call (or cst.Attribute for "linen_ref")
  method: str
  lines: tuple[int, int]  # first and last line in the class text
  loop: tp.Any = None  # the enclosing cst.For inside the method, if any
  loop_depth: int = 0
  conditional: bool = False  # under an `if` (inside the method / loop body)
  target: object = None  # the resolved class / function
  outer_call: tp.Any = None  # `nn.Dense(4)(x)`: the call of the construction
  setup_attr: str | None = None  # `self.<attr> = <site>` in setup
  setup_list: bool = False  # `self.<attr> = [<site> for ...]` in setup
  comp: tp.Any = None  # that list comprehension


def explicit_name(site: Site) -> str | None:
  for arg in site.node.args:
    if arg.keyword is not None and arg.keyword.value == "name":
      try:
        value = ast.literal_eval(libcst().Module([]).code_for_node(arg.value))
      except (ValueError, SyntaxError):
        return None
      return value if isinstance(value, str) else None
  return None


def find_sites(
  wrapper: cst.MetadataWrapper, namespace: tp.Mapping[str, object], linen_names: set[str]
) -> list[Site]:
  c = libcst()
  meta = c.metadata
  positions = wrapper.resolve(meta.PositionProvider)
  parents = wrapper.resolve(meta.ParentNodeProvider)
  module = wrapper.module
  sites: list[Site] = []
  from flax import linen as nn

  def context(node) -> tuple[str, tp.Any, int, bool, tp.Any]:
    method, loop, depth, cond, stmt = "", None, 0, False, None
    n = node
    while n in parents:
      n = parents[n]
      if isinstance(n, (c.SimpleStatementLine, c.For, c.If, c.While, c.With)) and stmt is None:
        stmt = n
      if isinstance(n, c.For):
        depth += 1
        loop = loop or n
      if isinstance(n, (c.If, c.IfExp)) and loop is None:
        cond = True
      if isinstance(n, c.FunctionDef):
        method = n.name.value
        break
    return method, loop, depth, cond, stmt

  class Visitor(c.CSTVisitor):
    def visit_Call(self, node: tp.Any) -> None:
      func: tp.Any = node.func
      name = dotted(func)
      pos = positions[node]
      lines = (pos.start.line, pos.end.line)
      method, loop, depth, cond, _ = context(node)
      if not method:
        return
      parent: tp.Any = parents.get(node)
      outer = parent if isinstance(parent, c.Call) and parent.func is node else None
      if isinstance(func, c.Attribute) and dotted(func.value) == "self":
        attr = func.attr.value
        kind = {"param": "param", "variable": "variable"}.get(attr)
        if kind is None and attr in ("make_rng", "sow", "is_initializing", "is_mutable_collection"):
          kind = "self_api"
        if kind is None:
          from .linen_api import UNTRANSLATED_SELF

          if attr in UNTRANSLATED_SELF:
            kind = "self_api"
        if kind is not None:
          sites.append(Site(kind, node, method, lines, loop, depth, cond, attr, outer))
        return
      target = resolve(name, namespace)
      if isinstance(target, type) and issubclass(target, nn.Module):
        site = Site("construct", node, method, lines, loop, depth, cond, target, outer)
        assign: tp.Any = parent
        if isinstance(parent, c.ListComp) and parent.elt is node:
          site.comp = parent
        if isinstance(assign, (c.ListComp, c.List, c.Tuple, c.Element)):
          while assign in parents and not isinstance(assign, c.Assign):
            assign = parents[assign]
            site.setup_list = True
        if (
          isinstance(assign, c.Assign)
          and len(assign.targets) == 1
          and isinstance(assign.targets[0].target, c.Attribute)
          and dotted(assign.targets[0].target.value) == "self"
        ):
          site.setup_attr = assign.targets[0].target.attr.value
        sites.append(site)
      elif name and name.split(".")[0] in linen_names:
        from .linen_api import is_lift

        if is_lift(target):
          sites.append(Site("lift", node, method, lines, loop, depth, cond, target, outer))

  module.visit(Visitor())
  return sites
