"""Find, in one class's source, every place that drafting must change (one read-only pass).

A *site* is a Linen construction (`nn.Dense(4)`, `Block(...)`), a variable declaration
(`self.param`, `self.variable`), or a Linen idiom (`self.make_rng`, `self.sow`, ...). Each site
knows its method, its enclosing `for` loop (a construction made once per iteration) and its
statement, so the rewrite can hoist or replace it.
"""

from __future__ import annotations

import dataclasses
import functools
import typing as tp

from ..emit.literals import string_literal
from .global_partials import global_partial
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
  # The `if`s around the outermost loop the site is in (its layers exist only where they hold).
  loop_guards: list[tuple[tp.Any, bool]] = dataclasses.field(default_factory=list)
  inner_lift: tp.Any = None  # `nn.scan(block)` over `block = nn.remat(Block)`: the remat call
  local: str | None = None  # `dense = nn.Dense(4)`: the local the construction is assigned to
  local_lines: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # its calls
  lift: tp.Any = None  # `block = nn.remat(Block)`: the lift call a local construction goes through
  setup_attr: str | None = None  # `self.<attr> = <site>` in setup
  setup_list: bool = False  # `self.<attr> = [<site> for ...]` in setup
  comp: tp.Any = None  # that list comprehension
  partial: tp.Any = None  # `conv = partial(nn.Conv, ...)`, then `conv(8)`: that partial call
  local_name: str | None = None  # the partial local the construction calls
  factory_field: str | None = None  # `self.conv(8)` where the field `conv` holds a factory
  loops: list[tp.Any] = dataclasses.field(default_factory=list)  # enclosing for loops, inner first
  # `nn.RNN(nn.LSTMCell(8))`: the construction this one is an argument of
  nested_in: tp.Any = None
  nested_index: int | None = None  # its position in a nn.Sequential's list
  # Built in setup into a list (`[X(name="0"), ...]`, `layers.append(X(...))`) that setup
  # assigns to `self.<list_attr>`: that attribute and the element's index expression.
  list_attr: str | None = None
  chosen_class: tp.Any = None  # `layer(...)` with `layer = A if c else B`: that choice
  # `conv = nn.Conv` once in the method, then `conv(8)`: the local naming the class
  class_alias: str | None = None
  list_index: str | None = None


def explicit_name(site: Site) -> str | None:
  for arg in site.node.args:
    if arg.keyword is not None and arg.keyword.value == "name":
      return string_literal(arg.value)
  return None


def counted_name(site: Site) -> tuple[str, str] | None:
  """`(prefix, suffix)` when `name=` is built from one counter: `str(i)` (HuggingFace Flax's
  `[Block(config, name=str(i)) for i in range(n)]`) or `f"h_{i}"`; whether the names really
  count 0, 1, ... is read from the trace, not assumed."""
  c = libcst()
  arg = next(
    (a for a in site.node.args if a.keyword is not None and a.keyword.value == "name"), None
  )
  if arg is None:
    return None
  value = arg.value
  if (
    isinstance(value, c.Call)
    and isinstance(value.func, c.Name)
    and value.func.value == "str"
    and len(value.args) == 1
    and isinstance(value.args[0].value, c.Name)
  ):
    return "", ""
  if isinstance(value, c.FormattedString):
    parts = value.parts
    holes = [i for i, p in enumerate(parts) if isinstance(p, c.FormattedStringExpression)]
    if len(holes) != 1:
      return None
    hole = parts[holes[0]]
    if not isinstance(hole.expression, c.Name) or hole.format_spec or hole.conversion:
      return None
    text = [p.value if isinstance(p, c.FormattedStringText) else None for p in parts]
    return "".join(t or "" for t in text[: holes[0]]), "".join(
      t or "" for t in text[holes[0] + 1 :]
    )
  return None


def find_sites(
  wrapper: cst.MetadataWrapper,
  namespace: tp.Mapping[str, object],
  linen_names: set[str],
  fields: tp.Collection[str] = (),
  classes_in_fields: tp.Mapping[str, type] | None = None,
) -> list[Site]:
  """Every place of the class's source the draft rewrites.

  `classes_in_fields`: fields holding one Linen class in every instance (flax's ResNet's
  `conv: ModuleDef = nn.Conv`), so that `partial(self.conv, ...)` is a partial of that class.
  """
  c = libcst()
  meta = c.metadata
  positions = wrapper.resolve(meta.PositionProvider)
  parents = wrapper.resolve(meta.ParentNodeProvider)
  module = wrapper.module
  sites: list[Site] = []
  from flax import linen as nn

  conditions: dict[int, list[tuple[tp.Any, bool]]] = {}
  outer_conditions: dict[int, list[tuple[tp.Any, bool]]] = {}
  loops_of: dict[int, list[tp.Any]] = {}

  def context(node) -> tuple[str, tp.Any, int, bool, tp.Any]:
    method, loop, depth, cond, stmt = "", None, 0, False, None
    n = node
    guards: list[tuple[tp.Any, bool]] = []
    outer: list[tuple[tp.Any, bool]] = []
    found_loops: list[tp.Any] = []
    while n in parents:
      child, n = n, parents[n]
      if isinstance(n, c.If) and loop is None:
        guards.append((n.test, child is n.orelse))
      elif isinstance(n, c.If):
        outer.append((n.test, child is n.orelse))
      elif isinstance(n, c.IfExp) and child is not n.test:
        guards.append((None, False))  # a conditional expression: decided by presence
      if isinstance(n, (c.SimpleStatementLine, c.For, c.If, c.While, c.With)) and stmt is None:
        stmt = n
      if isinstance(n, c.For):
        depth += 1
        loop = loop or n
        found_loops.append(n)
      if isinstance(n, (c.If, c.IfExp)) and loop is None:
        cond = True
      if isinstance(n, c.FunctionDef):
        method = n.name.value
        break
    conditions[id(node)] = guards
    # Only the `if`s outside the outermost loop (one between two loops is a counter's own).
    outer_conditions[id(node)] = outer if len(found_loops) <= 1 else []
    loops_of[id(node)] = found_loops
    return method, loop, depth, cond, stmt

  from ..transforms import flag_remat, module_level_remat
  from ..transforms.axes_params import KIND as AXES_PARAM
  from ..transforms.axes_params import is_param_with_axes
  from .linen_api import is_lift

  lifted_locals: dict[tuple[str, str], tuple[type, tp.Any, tp.Any]] = {}
  partial_locals: dict[tuple[str, str], tuple[type, tp.Any]] = {}
  class_locals: dict[tuple[str, str], tp.Any] = {}  # local -> the `A if c else B` choosing it
  # local -> the Module class it names (`conv_fn = nn.Conv`, maskgit's VQGAN); None where the
  # method binds the local more than once (no one class to tell)
  class_aliases: dict[tuple[str, str], type | None] = {}

  def partial_of_class(node: tp.Any) -> tuple[type, tp.Any] | None:
    """`partial(nn.Conv, use_bias=False)` -> (nn.Conv, that call)."""
    if (
      not isinstance(node, c.Call) or resolve(dotted(node.func), namespace) is not functools.partial
    ):
      return None
    if not node.args or node.args[0].keyword is not None:
      return None
    name = dotted(node.args[0].value) or ""
    target = resolve(name, namespace)
    if name.startswith("self.") and classes_in_fields:
      target = classes_in_fields.get(name[len("self.") :])
    if isinstance(target, type) and issubclass(target, nn.Module):
      return target, node
    return None

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
      made = partial_of_class(node.value)
      if made is not None and isinstance(target, c.Name):
        partial_locals[(context(node)[0], target.value)] = made
      value = node.value
      if isinstance(target, c.Name):
        key = (context(node)[0], target.value)
        named = resolve(dotted(value), namespace) if dotted(value) else None
        is_class = isinstance(named, type) and issubclass(named, nn.Module)
        once = key not in class_aliases and key not in seen_locals
        if not is_class:
          # `nn.remat(Block) if cfg.remat else Block`: Block's construction either way.
          named = flag_remat.chosen_class(value, namespace)
          is_class = named is not None
        class_aliases[key] = tp.cast(type, named) if is_class and once else None
        seen_locals.add(key)
      if isinstance(value, c.IfExp) and isinstance(target, c.Name):
        # `layer = Bottleneck if self.config.layer_type == "bottleneck" else Basic` (HF ResNet).
        chosen = [resolve(dotted(v), namespace) for v in (value.body, value.orelse)]
        if all(isinstance(k, type) and issubclass(k, nn.Module) for k in chosen):
          class_locals[(context(node)[0], target.value)] = value

  seen_locals: set[tuple[str, str]] = set()
  module.visit(Locals())
  global_partials: set[tuple[str, str]] = set()

  class Visitor(c.CSTVisitor):
    def visit_Attribute(self, node: tp.Any) -> None:
      # `self.variables[...]` / `self.scope`: Linen's variable dict and scope, read without a
      # call (a call `self.<name>(...)` is a site of its own, below).
      parent: tp.Any = parents.get(node)
      if (
        dotted(node.value) != "self"
        or node.attr.value not in ("variables", "scope")
        or node.attr.value in fields
        or (isinstance(parent, c.Call) and parent.func is node)
      ):
        return
      method, loop, depth, cond, _ = context(node)
      if method:
        pos = positions[node]
        lines = (pos.start.line, pos.end.line)
        sites.append(Site("self_api", node, method, lines, loop, depth, cond, node.attr.value))

    def visit_Call(self, node: tp.Any) -> None:
      func: tp.Any = node.func
      name = dotted(func)
      lifted = None
      if isinstance(func, c.Name) and (context(node)[0], func.value) in lifted_locals:
        lifted = lifted_locals[(context(node)[0], func.value)]
      elif isinstance(func, c.Call):
        lifted = lifted_class(func)
      key = (context(node)[0], func.value) if isinstance(func, c.Name) else None
      if key is not None and key in class_locals:
        method, loop, depth, cond, _ = context(node)
        pos = positions[node]
        lines = (pos.start.line, pos.end.line)
        site = Site("construct", node, method, lines, loop, depth, cond, None)
        site.chosen_class = class_locals[key]
        sites.append(site)
        return
      parent0: tp.Any = parents.get(node)
      inline = isinstance(parent0, c.Call) and parent0.func is node
      factory = (
        isinstance(func, c.Attribute)
        and dotted(func.value) == "self"
        and func.attr.value in fields
        and inline
      )
      if key is not None and key not in partial_locals and key not in seen_locals:
        found = global_partial(func.value, namespace)  # `Conv3x3 = partial(nn.Conv, ...)`
        if found is not None:
          partial_locals[key] = found
          global_partials.add(key)
      if (key is not None and key in partial_locals) or factory:
        method, loop, depth, cond, _ = context(node)
        pos = positions[node]
        target = partial_locals[key][0] if key in partial_locals else None
        site = Site(
          "construct",
          node,
          method,
          (pos.start.line, pos.end.line),
          loop,
          depth,
          cond,
          target,
          parent0 if inline else None,
        )
        if key in partial_locals:
          site.partial = partial_locals[key][1]
          site.local_name = None if key in global_partials else func.value
        else:
          site.factory_field = func.attr.value
        site.local = _assigned_local(parent0)
        site.setup_attr = _setup_target(node, parents)
        sites.append(site)
        return
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
      if module_level_remat.rematerialized(target):
        target = module_level_remat.user_class(tp.cast(type, target))  # `Block = nn.remat(Block)`
      if is_param_with_axes(target):  # T5X's `param_with_axes(...)`: a Linen param
        sites.append(Site("param", node, method, lines, loop, depth, cond, AXES_PARAM, outer))
        return
      alias = class_aliases.get(key) if key is not None else None
      if alias is not None:
        target = alias
      if isinstance(target, type) and issubclass(target, nn.Module):
        site = Site("construct", node, method, lines, loop, depth, cond, target, outer)
        site.class_alias = tp.cast(tp.Any, func).value if alias is not None else None
        site.local = _assigned_local(parent)
        assign: tp.Any = parent
        if isinstance(parent, c.ListComp) and parent.elt is node:
          site.comp = parent
        held: tp.Any = parents.get(outer) if outer is not None else None
        if isinstance(held, c.ListComp) and held.elt is outer:
          site.comp = held  # `[nn.Dense(w)(x) for w in self.widths]`: built and called
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
        elif (unpacked := _setup_target(node, parents)) is not None:
          site.setup_attr, site.setup_list = unpacked, False
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
  from .setup_lists import mark_setup_lists

  mark_setup_lists(module, sites, parents, lambda n: context(n)[0])
  constructs = {id(s.node): s for s in sites if s.kind == "construct"}
  for site in sites:
    arg: tp.Any = parents.get(site.node)
    call = parents.get(arg) if isinstance(arg, c.Arg) else None
    if site.kind == "construct" and call is not None and id(call) in constructs:
      site.nested_in = call
    elif site.kind == "construct" and isinstance(arg, c.Element):
      # `nn.Sequential([nn.Conv(...), Block(...)])`: element i is the Sequential's `layers_i`.
      seq: tp.Any = parents.get(arg)
      holder: tp.Any = parents.get(seq)
      owner = parents.get(holder) if isinstance(holder, c.Arg) else None
      if isinstance(seq, (c.List, c.Tuple)) and owner is not None and id(owner) in constructs:
        site.nested_in = owner
        site.nested_index = [e.value for e in seq.elements].index(site.node)
        site.setup_attr, site.setup_list = None, False
    site.guards = conditions.get(id(site.node), [])
    site.loop_guards = outer_conditions.get(id(site.node), [])
    site.loops = loops_of.get(id(site.node), [])
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


def _setup_target(node: tp.Any, parents: tp.Mapping[tp.Any, tp.Any]) -> str | None:
  """`self.q = dense()` -> 'q'; `self.q, self.k = dense(), dense()` -> 'q' or 'k' (the target
  at the construction's position): the attribute one construction is assigned to, else None."""
  c = libcst()
  parent: tp.Any = parents.get(node)
  while isinstance(parent, c.IfExp) and parent.test is not node:
    # `self.pooler = Pooler(...) if self.add_pooling_layer else None` (HF ViT, BEiT).
    node, parent = parent, tp.cast(tp.Any, parents.get(parent))
  if isinstance(parent, c.Assign):
    targets: list[tp.Any] = [t.target for t in parent.targets]
    if len(targets) == 1 and isinstance(targets[0], c.Attribute):
      return targets[0].attr.value if dotted(targets[0].value) == "self" else None
    return None
  element: tp.Any = parent
  values: tp.Any = parents.get(element) if isinstance(element, c.Element) else None
  assign: tp.Any = parents.get(values) if isinstance(values, c.Tuple) else None
  if not isinstance(assign, c.Assign) or len(assign.targets) != 1:
    return None
  target: tp.Any = assign.targets[0].target
  if not isinstance(target, (c.Tuple, c.List)) or len(target.elements) != len(values.elements):
    return None
  index = list(values.elements).index(element)
  attr: tp.Any = target.elements[index].value
  if isinstance(attr, c.Attribute) and dotted(attr.value) == "self":
    return attr.attr.value
  return None
