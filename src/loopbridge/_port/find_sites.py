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
  guards: list[tuple[tp.Any, bool]] = dataclasses.field(default_factory=list)  # (if test, else)
  inner_lift: tp.Any = None  # `nn.scan(block)` over `block = nn.remat(Block)`: the remat call
  local: str | None = None  # `dense = nn.Dense(4)`: the local the construction is assigned to
  local_lines: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # its calls
  lift: tp.Any = None  # `block = nn.remat(Block)`: the lift call a local construction goes through
  setup_attr: str | None = None  # `self.<attr> = <site>` in setup
  setup_list: bool = False  # `self.<attr> = [<site> for ...]` in setup
  comp: tp.Any = None  # that list comprehension
  nested_in: tp.Any = None  # `nn.RNN(nn.LSTMCell(8))`: the construction this one is an argument of


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

  conditions: dict[int, list[tuple[tp.Any, bool]]] = {}

  def context(node) -> tuple[str, tp.Any, int, bool, tp.Any]:
    method, loop, depth, cond, stmt = "", None, 0, False, None
    n = node
    guards: list[tuple[tp.Any, bool]] = []
    while n in parents:
      child, n = n, parents[n]
      if isinstance(n, c.If) and loop is None:
        guards.append((n.test, child is n.orelse))
      elif isinstance(n, c.IfExp) and child is not n.test:
        guards.append((None, False))  # a conditional expression: decided by presence
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
    conditions[id(node)] = guards
    return method, loop, depth, cond, stmt

  from .linen_api import is_lift

  lifted_locals: dict[tuple[str, str], tuple[type, tp.Any, tp.Any]] = {}

  def lifted_class(node: tp.Any) -> tuple[type, tp.Any, tp.Any] | None:
    """`nn.remat(Block, ...)` -> (Block, that call, None); `nn.scan(block, ...)` over a local
    `block = nn.remat(Block)` -> (Block, the scan call, the remat call)."""
    if not isinstance(node, c.Call) or not is_lift(resolve(dotted(node.func), namespace)):
      return None
    if not node.args or node.args[0].keyword is not None:
      return None
    first = node.args[0].value
    if isinstance(first, c.Name) and (context(node)[0], first.value) in lifted_locals:
      cls, inner, _ = lifted_locals[(context(node)[0], first.value)]
      return cls, node, inner
    target = resolve(dotted(first), namespace)
    if isinstance(target, type) and issubclass(target, nn.Module):
      return target, node, None
    return None

  class Locals(c.CSTVisitor):
    def visit_Assign(self, node: tp.Any) -> None:
      found = lifted_class(node.value)
      target: tp.Any = node.targets[0].target if len(node.targets) == 1 else None
      if found is not None and isinstance(target, c.Name):
        lifted_locals[(context(node)[0], target.value)] = found

  module.visit(Locals())

  class Visitor(c.CSTVisitor):
    def visit_Call(self, node: tp.Any) -> None:
      func: tp.Any = node.func
      name = dotted(func)
      lifted = None
      if isinstance(func, c.Name) and (context(node)[0], func.value) in lifted_locals:
        lifted = lifted_locals[(context(node)[0], func.value)]
      elif isinstance(func, c.Call):
        lifted = lifted_class(func)
      if lifted is not None:
        cls, lift, inner = lifted
        method, loop, depth, cond, _ = context(node)
        pos = positions[node]
        parent = parents.get(node)
        outer = parent if isinstance(parent, c.Call) and parent.func is node else None
        site = Site(
          "construct", node, method, (pos.start.line, pos.end.line), loop, depth, cond, cls, outer
        )
        site.lift, site.inner_lift = lift, inner
        site.local = _assigned_local(parent)
        sites.append(site)
        return
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
        site.local = _assigned_local(parent)
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
      elif name and name.split(".")[0] in linen_names and is_lift(target):
        sites.append(Site("lift", node, method, lines, loop, depth, cond, target, outer))

  module.visit(Visitor())
  local_calls: dict[tuple[str, str], list[tuple[int, int]]] = {}

  class LocalCalls(c.CSTVisitor):
    def visit_Call(self, node: tp.Any) -> None:
      if isinstance(node.func, c.Name):
        pos = positions[node]
        key = (context(node)[0], node.func.value)
        local_calls.setdefault(key, []).append((pos.start.line, pos.end.line))

  module.visit(LocalCalls())
  constructs = {id(s.node): s for s in sites if s.kind == "construct"}
  for site in sites:
    arg: tp.Any = parents.get(site.node)
    call = parents.get(arg) if isinstance(arg, c.Arg) else None
    if site.kind == "construct" and call is not None and id(call) in constructs:
      site.nested_in = call
    site.guards = conditions.get(id(site.node), [])
    if site.local is not None:
      site.local_lines = local_calls.get((site.method, site.local), [])
  return sites


def _assigned_local(parent: tp.Any) -> str | None:
  """`x = <construction>`: the name x (None for any other parent)."""
  c = libcst()
  if isinstance(parent, c.Assign) and len(parent.targets) == 1:
    target = parent.targets[0].target
    if isinstance(target, c.Name):
      return target.value
  return None
