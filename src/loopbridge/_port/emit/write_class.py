"""The NNX port of one Linen class: the planner's plan, the methods rewritten (`rewrite_methods`),
and `__init__` written: its signature, setup's body and the call methods' constructions (loops
rebuilt around lists, nested loops replayed with counters)."""

from __future__ import annotations

import dataclasses
import functools
import typing as tp

from ..plan.class_port import ClassPort, Context
from ..plan.hoist import Hoist, list_local
from ..plan.names import available, loop_targets, names_in
from ..plan.rewrite_class import Planner
from ..plan.shape_guards import note_shape_guard
from ..plan.source import ClassSource, dotted, libcst, resolve
from ..transforms import call_time_args, own_call_subclass
from ..transforms.factory_fields import signature_and_init
from ..transforms.field_defaults import default_text
from ..transforms.layer_subclass import (
  abstract_counterpart,
  subclassable,
)
from .rewrite_methods import Rewriter
from .unread_loop_targets import mark_unread_targets


def _loop_index(planner: Planner, loop: tp.Any) -> tuple[str, str | None]:
  """The loop's index name, and its new `enumerate` header target (None: header unchanged)."""
  c = libcst()
  it: tp.Any = loop.iter
  if (
    isinstance(loop.target, c.Name)
    and isinstance(it, c.Call)
    and dotted(it.func) == "range"
    and len(it.args) == 1
  ):
    return loop.target.value, None
  taken = set(planner.src.namespace) | loop_targets(loop) | set(planner.counter_names)
  name = "layer"
  while name in taken:
    name += "_"
  planner.counter_names.append(name)  # a running counter of the same loop must not take it
  target = planner.code(loop.target)
  if isinstance(loop.target, c.Tuple) and not loop.target.lpar:
    target = f"({target})"  # `for i, f in ...` -> `for layer, (i, f) in enumerate(...)`
  return name, f"{name}, {target}"


def _is_field(stmt, fields: set[str]) -> bool:
  c = libcst()
  if not isinstance(stmt, c.SimpleStatementLine) or len(stmt.body) != 1:
    return False
  node = stmt.body[0]
  return (
    isinstance(node, c.AnnAssign)
    and isinstance(node.target, c.Name)
    and (node.target.value in fields)
  )


def _hoisted_lines(planner: Planner, loops: dict[int, tuple[str, str | None]]) -> list[str]:
  """`__init__` lines of the call methods' constructions (loops rebuilt around lists)."""
  # Setup's own locals are not repeated: its body runs in `__init__` as written, in order
  # (HF CLIP's `num_positions = self.num_patches + 1` reads an attribute set just before).
  lines: list[str] = [
    f"{name} = {planner.rewrite_expr(code)}"
    for method, aliases in planner.aliases.items()
    if method != "setup"
    for name, code in aliases.items()
    if name in planner.used_aliases
  ]
  seen_loops: set[int] = set()
  unit = planner.module.default_indent
  for hoist in planner.hoists.values():
    site = hoist.site
    if site.setup_attr is not None or id(site.node) not in planner.hoisted_code:
      continue
    if hoist.counter:
      local, nest, depth = planner.counter_nest[id(site.node)]
      code = planner.hoisted_code[id(site.node)]
      lines.append(f"{local} = []")
      lines.append("\n".join([*nest, f"{unit * depth}{local}.append({code})"]) + "\n")
      lines.append(f"self.{hoist.attr} = {planner.list_of(local)}")
      planner.port.attributes[hoist.attr] = planner.src.line(site.lines[0])
      continue
    if id(site.comp) in planner.comp_index:
      # A list comprehension that built and called layers: `__init__` builds the list.
      code = planner.hoisted_code[id(site.node)]
      comp: tp.Any = site.comp
      header = planner.comp_index[id(comp)][1]
      target = header or planner.code(comp.for_in.target)
      it = planner.code(comp.for_in.iter)
      it = f"enumerate({it})" if header is not None else it
      lines.append(f"self.{hoist.attr} = {planner.list_of(f'[{code} for {target} in {it}]')}")
      planner.port.attributes[hoist.attr] = planner.src.line(site.lines[0])
      continue
    if not hoist.is_list:
      code = planner.hoisted_code[id(site.node)]
      if hoist.lifted is not None:
        block = hoist.lifted.init_lines(hoist.attr, code, unit)
      else:
        block = [f"self.{hoist.attr} = {code}", *hoist.post]
      present = {p: bool(kids) for p, kids in hoist.children.items()}
      cond = planner.guard(site, present, hoist.attr)
      if cond is None:
        note_shape_guard(planner, site)
      else:
        # Every line of every statement under the guard (a lifted stack's builder is several).
        inner = [ln for statement in block for ln in statement.splitlines()]
        block = [f"if {cond}:\n" + "\n".join(f"{unit}{ln}" for ln in inner)]
      lines += block
      planner.port.attributes[hoist.attr] = planner.src.line(site.lines[0])
      continue
    loop = site.loop
    if id(loop) in seen_loops:
      continue
    seen_loops.add(id(loop))
    members = [
      h
      for h in planner.hoists.values()
      if h.site.loop is loop
      and id(h.site.node) in planner.hoisted_code
      and h.is_list
      and not h.counter  # a list under an `if` in this loop has its own replay
    ]
    header = loops[id(loop)][1]
    target = header or planner.code(loop.target)
    it = planner.code(loop.iter)
    if header is not None:
      it = f"enumerate({it})"
    locals_ = {id(h): list_local(planner, h) for h in members}
    block = [f"{locals_[id(h)]} = []" for h in members]
    body = "".join(
      f"{unit}{locals_[id(h)]}.append({planner.hoisted_code[id(h.site.node)]})\n" for h in members
    )
    block.append(f"for {target} in {it}:\n{body}")
    for h in members:
      block.append(f"self.{h.attr} = {planner.list_of(locals_[id(h)])}")
      planner.port.attributes[h.attr] = planner.src.line(h.site.lines[0])
    # A loop under an `if` `__init__` can evaluate (big_vision's `else:` of `if self.scan:`):
    # its layers exist where Linen makes them, not in a configuration taking the other branch.
    conds = {planner.written_guard(h.site.loop_guards, h.site.method) for h in members}
    cond = conds.pop() if len(conds) == 1 else None
    if cond is not None:
      inner = [ln for statement in block for ln in statement.rstrip("\n").splitlines()]
      block = [f"if {cond}:\n" + "\n".join(f"{unit}{ln}" for ln in inner)]
    lines += block
  return lines


def _unique(name: str, taken: set[str]) -> str:
  while name in taken:
    name += "_"
  return name


def _plan_counter(planner: Planner, hoist: Hoist) -> None:
  """Layers made in nested loops, or under an `if` in a loop: `__init__` replays the loops and
  the `if`s, the call counts the layers.

  `__init__` runs the same loop headers, `if` tests and the plain assignments before the
  construction (`strides = (2, 2) if i > 0 else (1, 1)`) when they read fields, globals and
  loop targets only; a per-layer traced value is indexed by the layers built so far
  (`len(...)`). A test `__init__` cannot evaluate (it reads the call) is a TODO.
  """
  c = libcst()
  site = hoist.site
  ns = planner.init_namespace
  aliases = planner.aliases.get(site.method, {})
  outer_first = list(reversed(site.loops))
  known = set(aliases)
  lines: list[str] = []
  unit = planner.module.default_indent
  local = list_local(planner, hoist)
  # The nodes from the outermost loop down to the site's statement.
  path: list[tp.Any] = []
  node: tp.Any = site.node
  while node in planner.parents and node is not outer_first[0]:
    path.append(node)
    node = planner.parents[node]
  path.append(outer_first[0])
  path.reverse()
  depth = 0
  for i, step in enumerate(path):
    after = path[i + 1] if i + 1 < len(path) else None
    if isinstance(step, c.For):
      if not available(step.iter, ns, known):
        planner.todo(site, call_time_args.LOOP_OVER_CALL)
        return
      planner.used_aliases.update(n for n in names_in(step.iter) if n in aliases)
      known |= loop_targets(step)
      lines.append(f"{unit * depth}for {planner.code(step.target)} in {planner.code(step.iter)}:")
      depth += 1
    elif isinstance(step, c.If) and after is not None and after is not step.test:
      if not available(step.test, ns, known):
        planner.todo(site, "a layer built under an `if` whose test reads the call, in a loop")
        return
      planner.used_aliases.update(n for n in names_in(step.test) if n in aliases)
      test = planner.code(step.test)
      lines.append(f"{unit * depth}if {test if after is step.body else f'not ({test})'}:")
      depth += 1
    elif isinstance(step, c.IndentedBlock) and after is not None:
      for stmt in step.body:  # the plain assignments before the statement holding the site
        if stmt is after:
          break
        if (
          isinstance(stmt, c.SimpleStatementLine)
          and isinstance(stmt.body[0], c.Assign)
          and isinstance(stmt.body[0].targets[0].target, c.Name)
          and available(stmt.body[0].value, ns, known)
        ):
          lines.append(f"{unit * depth}{planner.code(stmt.body[0])}")
          planner.used_aliases.update(n for n in names_in(stmt.body[0].value) if n in aliases)
          known.add(stmt.body[0].targets[0].target.value)
    elif isinstance(step, (c.While, c.Try, c.IfExp)) or (
      isinstance(step, c.If) and after is step.test
    ):
      planner.todo(site, f"a layer built in a loop under a {type(step).__name__.lower()}")
      return
  statement: tp.Any = site.node
  while not isinstance(statement, c.SimpleStatementLine):
    statement = planner.parents[statement]
  taken = set(planner.src.namespace) | known | set(planner.counter_names)
  counter = _unique("layer", taken)
  planner.counter_names.append(counter)
  planner.scope_names[id(site.node)] = known
  planner.counter_plans[id(site.node)] = hoist
  hoist.index = counter
  planner.counter_nest[id(site.node)] = (local, lines, depth)
  planner.counter_inits.setdefault(id(outer_first[0]), []).append(counter)
  planner.increments[id(statement)] = counter


@functools.cache
def _transformer_class() -> type:
  return type("Rewriter", (Rewriter, libcst().CSTTransformer), {})


def _transformer(planner: Planner, loops: dict[int, tuple[str, str | None]]) -> tp.Any:
  """A `Rewriter` that is a libcst transformer (libcst is imported here, when drafting)."""
  return _transformer_class()(planner, loops)


def port_class(src: ClassSource, ctx: Context) -> ClassPort:
  """The NNX port of one Linen class (its code, TODOs, changes and added arguments)."""
  c = libcst()
  port = ClassPort(src.cls, src)
  # A subclass of a flax layer whose `__call__` is its own takes only the layer's fields it
  # reads (`transforms/own_call_subclass`).
  port.dropped |= own_call_subclass.unread_fields(src.cls)
  wrapper = c.MetadataWrapper(src.tree())
  planner = Planner(port, ctx, wrapper)
  planner.plan()
  loops: dict[int, tuple[str, str | None]] = {}
  for hoist in planner.hoists.values():
    loop = hoist.site.loop
    if hoist.counter:
      _plan_counter(planner, hoist)
      continue
    if hoist.is_list and loop is not None and hoist.site.setup_attr is None:
      aliases = planner.aliases.get(hoist.site.method, {})
      if not available(loop.iter, planner.init_namespace, set(aliases)):
        planner.todo(hoist.site, call_time_args.LOOP_OVER_CALL)
        continue
      planner.used_aliases.update(n for n in names_in(loop.iter) if n in aliases)
      loops.setdefault(id(loop), _loop_index(planner, loop))
    elif hoist.is_list and hoist.site.comp is not None and hoist.site.setup_attr is None:
      comp: tp.Any = hoist.site.comp
      if id(comp) not in planner.comp_index:
        planner.comp_index[id(comp)] = _loop_index(planner, comp.for_in)
  rewriter = _transformer(planner, loops)
  module = planner.module.visit(rewriter)
  classdef: tp.Any = module.body[0]
  fields = port.field_names()
  unit = module.default_indent
  body: list[tp.Any] = list(classdef.body.body)
  doc: list[tp.Any] = []
  if (
    body
    and isinstance(body[0], c.SimpleStatementLine)
    and isinstance(body[0].body[0], c.Expr)
    and isinstance(body[0].body[0].value, (c.SimpleString, c.ConcatenatedString))
  ):
    doc = [body.pop(0)]
  field_stmts = [s for s in body if _is_field(s, set(fields))]
  setup = [s for s in body if isinstance(s, c.FunctionDef) and s.name.value == "setup"]
  rest = [s for s in body if s not in field_stmts and s not in setup]
  # The signature: the dataclass fields in order, then the added arguments and rngs.
  params: list[str] = []
  field_inits: dict[str, str] = {}  # `dataclasses.field(...)` fields: their __init__ line

  def rewritten(node: tp.Any) -> str:
    return planner.rewrite_expr(planner.code(node))

  by_name = {s.body[0].target.value: s.body[0] for s in field_stmts}
  for f in dataclasses.fields(src.cls):
    if f.name in ("parent", "name") or f.name in port.dropped:
      continue
    node = by_name.get(f.name)
    if node is not None:
      annotation = planner.code(node.annotation.annotation)
      if annotation in {f"{n}.Module" for n in planner.ctx.linen_names}:
        annotation = "nnx.Module"  # a submodule handed in is the NNX port of one
      text = f"{f.name}: {annotation}"
      as_field = (
        None
        if node.value is None
        else signature_and_init(f.name, annotation, node.value, src.namespace, rewritten)
      )
      if as_field is not None:
        text, field_inits[f.name] = as_field
      elif node.value is not None:
        text += f" = {default_text(planner, f, node.value)}"
    elif (inherited := own_call_subclass.inherited_default(src.cls, f.name)) is not None:
      text = f"{f.name}={inherited}"  # a field of the flax layer the class subclasses
    else:
      text = f.name if f.default is dataclasses.MISSING else f"{f.name}={f.default!r}"
    params.append(text)
  extras = tp.cast(tp.Any, port.resolver).extras
  hoisted = _hoisted_lines(planner, loops)
  init_lines = [field_inits.get(f, f"self.{f} = {f}") for f in fields if f not in port.dropped]
  if port.uses_rngs_attr:
    init_lines.append("self.rngs = rngs")

  # Linen runs setup before a call method builds its layers, which may read what setup
  # assigned (maskgit's VQGAN reads `self.channel_multipliers`): where every line moved to
  # `__init__` comes from a call method, setup's body runs first, as in Linen.
  setup_first = bool(setup) and all(
    h.site.method != "setup"
    for h in planner.hoists.values()
    if id(h.site.node) in planner.hoisted_code and h.site.setup_attr is None
  )

  def build_init() -> tp.Any:
    kw = [e.parameter() for e in extras.values()] + ["rngs: nnx.Rngs"]
    signature = ", ".join(["self", *params, "*", *kw])
    moved = planner.declarations + hoisted
    init_src = (
      f"def __init__({signature}):\n"
      + "".join(f"{unit}{ln}\n" for block in init_lines for ln in block.splitlines())
      + f"{unit}pass\n"
    )
    moved_src = "".join("".join(f"{unit}{ln}\n" for ln in block.splitlines()) for block in moved)
    config = c.PartialParserConfig(default_indent=unit)
    init: tp.Any = c.parse_statement(init_src, config=config)
    init_body = list(init.body.body)[:-1]
    moved_body: list[tp.Any] = []
    if moved_src:
      holder: tp.Any = c.parse_statement(f"def _():\n{moved_src}", config=config)
      moved_body = list(holder.body.body)
    setup_body = [stmt for s in setup for stmt in s.body.body]
    init_body += [*setup_body, *moved_body] if setup_first else [*moved_body, *setup_body]
    return init.with_changes(
      body=init.body.with_changes(body=init_body or [c.parse_statement("pass")])
    )

  init = build_init()
  # An added argument whose line stayed in the call method (lm1b's `length = inputs.shape[1]`
  # is read by the call only) is read by nothing in the port: left in, the parent would pass
  # the sample's number for it. Dropped before any parent builds this class.
  read = set().union(*(names_in(n) for n in [*init.body.body, *rest]))
  unread = [name for name in extras if name not in read]
  if unread:
    for name in unread:
      del extras[name]
    init = build_init()
  init = mark_unread_targets(init)
  orig_class: tp.Any = planner.module.body[0]
  orig_body: list[tp.Any] = list(orig_class.body.body)
  orig_setup = [s for s in orig_body if isinstance(s, c.FunctionDef) and s.name.value == "setup"]
  orig_fields = [s for s in orig_body if _is_field(s, set(fields))]
  if setup:
    planner.change(
      planner.positions[orig_setup[0]].start.line,
      "def setup(self):",
      "def __init__(..., *, rngs: nnx.Rngs):",
      "setup's body runs in __init__",
    )
  if field_stmts:
    planner.change(
      planner.positions[orig_fields[0]].start.line,
      f"{len(fields)} dataclass fields",
      "__init__ arguments",
      "NNX modules take their configuration in __init__",
    )
  from ..transforms.linen_machinery import (
    DROPPED_BASE,
    DROPPED_DECORATOR,
    DROPPED_INIT_METHOD,
    calls_linen_init,
    is_mixin_base,
  )

  for fn in orig_body:
    if isinstance(fn, c.FunctionDef) and fn.name.value != "setup" and calls_linen_init(fn):
      first, last = planner.positions[fn].start.line, planner.positions[fn].end.line
      lines = range(src.line(first), src.line(last) + 1)
      port.todos = [t for t in port.todos if not (t.file == src.file and t.line in lines)]
      rest = [s for s in rest if getattr(s, "name", None) is None or s.name.value != fn.name.value]
      planner.change(first, f"def {fn.name.value}(...)", "removed", DROPPED_INIT_METHOD)
  new_body = [
    *doc,
    *[s for s in rest if not isinstance(s, c.FunctionDef)],
    init,
    *[s for s in rest if isinstance(s, c.FunctionDef)],
  ]
  for decorator in orig_class.decorators:
    code = planner.code(decorator.decorator)
    planner.change(
      planner.positions[decorator].start.line, f"@{code}", "removed", DROPPED_DECORATOR
    )
  classdef = classdef.with_changes(decorators=[])
  bases = []
  for base in classdef.bases:
    name = dotted(base.value) or ""
    if is_mixin_base(resolve(name, src.namespace)):
      planner.change(planner.positions[orig_class].start.line, name, "removed", DROPPED_BASE)
      continue
    if name.split(".")[0] in ctx.linen_names and name.endswith(".Module"):
      bases.append(base.with_changes(value=c.parse_expression("nnx.Module")))
      planner.change(
        planner.positions[orig_class].start.line,
        f"class ...({name})",
        "nnx.Module",
        "the base class",
      )
    elif own_call_subclass.flax_base(src.cls) is resolve(name, src.namespace):
      bases.append(base.with_changes(value=c.parse_expression("nnx.Module")))
      planner.change(
        planner.positions[orig_class].start.line,
        f"class ...({name})",
        "nnx.Module",
        f"the base class: its own __call__ replaces {name}'s, which the port never runs; "
        "it takes the fields of the layer it reads",
      )
    elif (spec := subclassable(tp.cast(tp.Any, resolve(name, src.namespace)))) is not None:
      layer = spec.nnx_name
      bases.append(base.with_changes(value=c.parse_expression(f"nnx.{layer}")))
      planner.change(
        planner.positions[orig_class].start.line,
        f"class ...({name})",
        f"nnx.{layer}",
        f"the base class: the methods the class inherits are nnx.{layer}'s, reading the "
        "attributes its fields become; its own setup makes the variables",
      )
    elif (abstract := abstract_counterpart(resolve(name, src.namespace))) is not None:
      bases.append(base.with_changes(value=c.parse_expression(abstract)))
      planner.change(
        planner.positions[orig_class].start.line,
        f"class ...({name})",
        abstract,
        f"the base class: {abstract} is NNX's counterpart of Linen's",
      )
    else:
      bases.append(base)
  classdef = classdef.with_changes(bases=bases, body=classdef.body.with_changes(body=new_body))
  port.code = module.with_changes(body=[classdef]).code
  return port
