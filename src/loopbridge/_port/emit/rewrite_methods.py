"""Rewrite a planned class's methods: its sites replaced (`write_class` builds `__init__`).

One libcst transformer applies the plan of `rewrite_class.Planner`: a construction becomes the
attribute `__init__` builds, `self.param`/`self.variable` the NNX Variable, a Linen idiom the NNX
one, and anything the plan marked untranslatable turns its whole statement into a TODO block
that keeps the original lines and raises, so a port with a TODO can never pass its check.
The Variables are `variable_rewrites`', Linen's module API through `self` is `self_api`'s.
"""

from __future__ import annotations

import typing as tp

from ..plan import standard_layers
from ..plan.hoist import Hoist
from ..plan.names import available, inline_aliases
from ..plan.rewrite_class import Planner
from ..plan.source import dotted, libcst
from ..records import Todo
from ..transforms import call_time_args, lazy_variables
from ..transforms.cell_carry import carry_call
from ..transforms.chosen_class import guard
from ..transforms.module_handed_out import linen_api_used
from ..transforms.never_called import never_called_code
from ..transforms.none_before_a_layer import data_placeholder
from ..transforms.scanned_method import lifted_method, linen_lift
from ..transforms.tied_embeddings import apply_with_params, built_where_called, variables_read
from . import self_api, variable_rewrites
from .construction import construction
from .removed_lines import removed_line
from .todo_blocks import todo_block
from .unread_loop_targets import loop_names, mark_unread_targets

if tp.TYPE_CHECKING:
  import libcst as cst


class Rewriter:
  """Applies the plan to the class's methods (and to `setup`, whose body moves to `__init__`).

  The methods of a libcst `CSTTransformer`, joined to that base only when drafting runs
  (`write_class._transformer`): a base named here would import libcst with the package.
  """

  def __init__(self, planner: Planner, loops: dict[int, tuple[str, str | None]]):
    super().__init__()
    self.p = planner
    self.loops = loops
    self.stack: list[cst.CSTNode] = []
    self.marks: dict[int, list[str]] = {}
    self.param_attrs: dict[str, str] = {}  # setup attribute -> param name (read as a value)
    self.var_attrs: dict[str, str] = {}  # setup attribute -> variable name (a Variable)
    self.method = ""
    self.original_fn: tp.Any = None  # the method being finished (its reads before the rewrite)
    self.local_vars: set[str] = set()  # locals holding a variable (`v = self.variable(...)`)
    self.declared = lazy_variables.declared(planner.sites)
    # Variables a method makes on first use (sized by the call), and the statements creating
    # them, by id of the statement they go before.
    self.late = lazy_variables.made_on_first_use(planner.sites, planner.init_namespace)
    self.before: dict[int, list[tp.Any]] = {}
    self.reads = lazy_variables.variable_reads(planner.sites, planner.parents, self.declared)
    self.read_of = {id(outer): name for outer, name in self.reads.values()}

  # --- statements: a TODO replaces the innermost statement holding an untranslated site ---

  def _push(self, node) -> bool:
    self.stack.append(node)
    return True

  def _pop(self, original, updated):
    c = libcst()
    self.stack.pop()
    reasons = self.marks.pop(id(original), None)
    before = self.before.pop(id(original), [])
    if reasons:
      return self._todo_block(original, reasons)
    if before:
      # The statement's comments stay above the lines that now open it.
      before[0] = before[0].with_changes(leading_lines=updated.leading_lines)
      updated = updated.with_changes(leading_lines=[])
    counter = self.p.increments.get(id(original))
    after = [c.parse_statement(f"{counter} += 1\n")] if counter is not None else []
    if before or after:
      return c.FlattenSentinel([*before, updated, *after])
    return updated

  def _todo_block(self, original, reasons: list[str]):
    pos = self.p.positions[original]
    code = self.p.code(original).strip("\n")
    line = self.p.src.line(pos.start.line)
    reason = "; ".join(dict.fromkeys(reasons))
    self.p.port.todos.append(Todo(self.p.src.file, line, reason, code))
    return todo_block(reason, code, self.p.src.file, line)

  def _mark(self, reason: str) -> None:
    self.marks.setdefault(id(self.stack[-1]), []).append(reason)

  visit_SimpleStatementLine = _push
  leave_SimpleStatementLine = _pop
  visit_For = _push
  visit_If = _push
  leave_If = _pop
  visit_While = _push
  leave_While = _pop
  visit_With = _push
  leave_With = _pop

  def leave_For(self, original, updated):
    counters = self.p.counter_inits.get(id(original))
    if counters:
      done = self._leave_for(original, updated)
      if isinstance(done, libcst().For):
        starts = [libcst().parse_statement(f"{counter} = 0\n") for counter in counters]
        return libcst().FlattenSentinel([*starts, done])
      return done
    return self._leave_for(original, updated)

  def _leave_for(self, original, updated):
    loop = self.loops.get(id(original))
    if loop is not None and loop[1] is not None:
      c = libcst()
      updated = updated.with_changes(
        target=c.parse_expression(loop[1]),
        iter=c.parse_expression(f"enumerate({self.p.code(original.iter)})"),
      )
    return self._pop(original, updated)

  def visit_FunctionDef(self, node) -> bool:
    self.method = node.name.value
    return True

  def leave_FunctionDef(self, original, updated):
    self.original_fn = original
    kept = []
    for orig, d in zip(original.decorators, updated.decorators):
      name = dotted(orig.decorator) or ""
      if name.split(".")[0] in self.p.ctx.linen_names and name.endswith((".compact", ".nowrap")):
        pos = self.p.positions[orig]
        self.p.change(
          pos.start.line,
          f"@{name}",
          "(removed)",
          "NNX builds submodules in __init__; methods are plain methods",
        )
        continue
      lift = linen_lift(orig, self.p.src.namespace)
      if lift is not None:
        lifted = lifted_method(self.p, updated, orig, lift)
        if isinstance(lifted, str):
          # The method as Linen wrote it, kept in a TODO block: no Linen transform runs on
          # an NNX module.
          todo = self._todo_block(original, [lifted])
          return updated.with_changes(decorators=[], body=libcst().IndentedBlock(body=[todo]))
        updated = lifted
        continue
      kept.append(d)
    updated = updated.with_changes(decorators=kept)
    added = self.p.port.threaded.get(original.name.value, {})
    if added:
      c = libcst()
      params = updated.params
      new = [
        c.Param(c.Name(n), default=c.Name("None"), equal=c.AssignEqual())
        for n in added
        if n not in {p.name.value for p in [*params.params, *params.kwonly_params]}
      ]
      star = (
        params.star_arg if isinstance(params.star_arg, (c.Param, c.ParamStar)) else c.ParamStar()
      )
      updated = updated.with_changes(
        params=params.with_changes(star_arg=star, kwonly_params=[*params.kwonly_params, *new])
      )
      for n, field in added.items():
        self.p.change(
          self.p.positions[original].start.line,
          f"self.{field}(...)",
          f"{n}= call argument",
          f"Linen bound {n} through the factory field {field}; NNX takes it at the call",
        )
    return self._drop_moved_aliases(updated)

  def _drop_moved_aliases(self, fn):
    """Remove lines only the moved constructions read, then mark loop targets left unread.

    `init = nn.with_...(...)`, `conv = partial(nn.Conv, ...)` and the loop's `strides = ...`
    now run in `__init__`; a line with a comment above it is kept (the comment with it). A
    loop target no longer read becomes `_name` (what linters expect of an unused target).
    """
    c = libcst()
    method = fn.name.value
    moved = {n for n in self.p.aliases.get(method, {}) if n in self.p.used_aliases}
    moved |= {local for m, local in self.p.partials if m == method}
    moved |= {s.class_alias for s in self.p.sites if s.method == method and s.class_alias}
    moved |= set().union(
      *[
        self.p.scope_names[id(h.site.node)] - loop_names(h.site.loops)
        for h in self.p.counter_plans.values()
        if h.site.method == method
      ]
    )

    def reads(node) -> dict[str, int]:
      counts: dict[str, int] = {}

      class Reads(c.CSTVisitor):
        def visit_Attribute(self, attribute) -> bool:
          attribute.value.visit(self)  # `self.conv` reads `self`, not a name `conv`
          return False

        def visit_Arg(self, arg) -> bool:
          arg.value.visit(self)  # `max_pool(x, strides=s)` reads `s`, not a name `strides`
          return False

        def visit_Name(self, name) -> None:
          counts[name.value] = counts.get(name.value, 0) + 1

      node.visit(Reads())
      return counts

    outer = self

    class Drop(c.CSTTransformer):
      def leave_SimpleStatementLine(self, original, updated):
        body = updated.body[0]
        if isinstance(body, c.Assign) and isinstance(body.targets[0].target, c.Name):
          name = body.targets[0].target.value
          if (
            name in moved
            and counts.get(name, 0) == 1
            and not any(line.comment for line in updated.leading_lines)
          ):
            removed_line(outer, name)
            return c.RemoveFromParent()
        return updated

    counts = reads(fn)
    before = reads(self.original_fn) if self.original_fn is not None else {}
    # A line whose value only the moved constructions read (`d = x.shape[-1]` for a Dense
    # now built in __init__) goes too.
    moved |= {n for n, k in counts.items() if k == 1 and before.get(n, 0) > 1}
    fn = fn.visit(Drop())
    return mark_unread_targets(fn)

  # --- expressions ------------------------------------------------------------------------

  def _setup_layer_call(self, original, updated):
    """`self.dropout_layer(x, deterministic)`, a flax layer made in setup and called in a
    method: the positional arguments NNX takes by keyword get their keyword (None: no such
    call)."""
    name = dotted(original.func)
    if name is None or not name.startswith("self.") or name.count(".") != 1:
      return None
    made = {
      s.target
      for s in self.p.sites
      if s.kind == "construct" and s.setup_attr == name[5:] and not s.setup_list
    }
    if len(made) != 1:
      return None
    args = _keyworded(list(updated.args), tp.cast(type, made.pop()))
    return updated.with_changes(args=args) if args != list(updated.args) else None

  def leave_Call(self, original, updated):
    c = libcst()
    key = id(original)
    if key in self.p.todo_nodes:
      self._mark(self.p.todo_nodes[key])
      return updated
    carry = carry_call(self.p, original, updated)
    if carry is not None:
      return c.parse_expression(carry)
    stand_in = never_called_code(self.p, original)
    if stand_in is not None:
      return c.parse_expression(stand_in)
    hoist = self.p.hoists.get(key)
    if hoist is not None:
      site = hoist.site
      if site.lift is not None and site.outer_call is None and hoist.lifted is None:
        self._mark("a module made through a lifted transform and called later")
        return updated
      return self._hoisted(hoist, original, updated)
    if key in self.p.lift_rewrites:
      code = self.p.lift_rewrites[key]
      self.p.change(
        self.p.site_of[key].lines,
        self.p.code(original),
        code,
        "rematerialization moves from the class to the call (nnx.remat)",
      )
      return c.parse_expression(code)
    func = original.func
    lifted_local = (
      self.p.lifted_locals.get((self.method, func.value)) if isinstance(func, c.Name) else None
    )
    for h in self.p.hoists.values():
      if (h.site.outer_call is original or h is lifted_local) and h.lifted is not None:
        if any(a.keyword is not None or a.star for a in updated.args) or not updated.args:
          self._mark(f"a call of an nn.{h.lifted.lift} module with keyword or star arguments")
          return updated
        module = self.p.code(updated.func) if h is not lifted_local else func.value
        args = [self.p.code(a.value) for a in updated.args]
        code = h.lifted.call(module, args)
        self.p.change(
          self.p.positions[original].start.line, self.p.code(original), code, h.lifted.why
        )
        return c.parse_expression(code)
      if h.site.outer_call is original and h.site.lift is not None:
        # `block(config, name=...)(y, mask)` -> `block(self.layers[i], y, mask)`; written
        # inline, `nn.remat(Block)(config)(y)` -> `nnx.remat(...)(self.CheckpointBlock_0, y)`.
        lift = h.site.node.func
        lift_code = self.p.lift_rewrites.get(id(lift)) or self.p.code(lift)
        extra = [c.parse_expression(f"f({kw})").args[0] for kw in h.call_kwargs]
        return updated.with_changes(
          func=c.parse_expression(lift_code),
          args=[c.Arg(updated.func), *updated.args, *extra],
        )
      child = self.p.ctx.ported.get(tp.cast(type, h.site.target))
      if h.site.outer_call is original and child is not None and child.threaded.get("__call__"):
        extra_args = []
        for n, field in child.threaded["__call__"].items():
          value = self._threaded_value(h, field, n)
          if value is None:
            self._mark(
              f"{n} reaches {child.cls.__name__} through its factory field {field}, "
              "bound by an expression the draft cannot read"
            )
            return updated
          extra_args.append(c.parse_expression(f"f({n}={value})").args[0])
        return updated.with_changes(args=[*updated.args, *extra_args])
      if h.site.outer_call is original:
        args = _keyworded(list(updated.args), tp.cast(type, h.site.target))
        extra = [c.parse_expression(f"f({kw})").args[0] for kw in h.call_kwargs]
        return updated.with_changes(args=[*args, *extra])
    layer_call = self._setup_layer_call(original, updated) or apply_with_params(
      self, original, updated
    )
    if layer_call is not None:
      return layer_call
    handed_out = linen_api_used(self.p.src.namespace, original)
    if handed_out is not None:
      self._mark(handed_out)
      return updated
    site = self.p.site_of.get(key)
    if site is None:
      return updated
    if site.kind == "param":
      return self._param(site, original, updated)
    if site.kind == "variable":
      return self._variable(site, original, updated)
    if site.kind == "self_api":
      return self._self_api(site, original, updated)
    return updated

  def _threaded_value(self, hoist: Hoist, field: str, name: str) -> str | None:
    """The expression the parent bound `name` to, in the partial it passes as `field`."""
    c = libcst()
    arg = next((a for a in hoist.site.node.args if a.keyword and a.keyword.value == field), None)
    if arg is None or not isinstance(arg.value, c.Name):
      return None
    partial = self.p.partials.get((hoist.site.method, arg.value.value))
    if partial is None:
      return None
    bound = next((a for a in partial.args[1:] if a.keyword and a.keyword.value == name), None)
    return None if bound is None else self.p.code(bound.value)

  def _hoisted(self, hoist: Hoist, original, updated):
    c = libcst()
    site = hoist.site
    # A construction in setup's own line that no attribute names (HF T5's `self.layer +=
    # (X(..., name=str(k)),)`) stays where it is, as setup's lines do.
    in_place = site.method == "setup" and not hoist.attr.isidentifier()
    if site.setup_attr is not None or site.list_attr is not None or in_place:
      index = site.list_index
      if site.comp is not None:
        target = site.comp.for_in.target
        if (
          isinstance(target, c.Name)
          and dotted(
            site.comp.for_in.iter.func
            if isinstance(site.comp.for_in.iter, c.Call)
            else site.comp.for_in.iter
          )
          == "range"
        ):
          index = target.value
        else:
          self._mark("a list comprehension of layers not over range(...)")
          return updated
      code, why = construction(self.p, hoist, index)
      if code is None:
        self._mark(why)
        return updated
      self.p.change(
        site.lines,
        self.p.code(original),
        code,
        "standard layer -> NNX, input width from the trace"
        if "nnx." in code.split("(")[0]
        else "submodule built with rngs",
      )
      return c.parse_expression(code)
    if hoist.counter:
      local = self.p.counter_nest[id(site.node)][0]
      code, why = construction(self.p, hoist, f"len({local})")
      index = hoist.index
    elif id(site.comp) in self.p.comp_index:
      index = self.p.comp_index[id(site.comp)][0]
      code, why = construction(self.p, hoist, index)
    else:
      index = self.loops[id(site.loop)][0] if hoist.is_list else None
      code, why = construction(self.p, hoist, index)
    if code is None:
      self._mark(why)
      return updated
    ref = f"self.{hoist.attr}[{index}]" if hoist.is_list else f"self.{hoist.attr}"
    if hoist.call_settings:
      lines = call_time_args.statements(ref, hoist.call_settings)
      self.before.setdefault(id(self.stack[-1]), []).extend(map(c.parse_statement, lines))
    self.p.hoisted_code[id(original)] = code
    self.p.change(
      site.lines,
      self.p.code(original),
      f"{ref}  (built in __init__: {code})",
      "a construction in a compact method moves to __init__",
    )
    return c.parse_expression(ref)

  def _through_aliases(self, node, method: str) -> str | None:
    """`node`'s code for `__init__` with the method's aliases inlined (None: it reads the
    call otherwise)."""
    aliases = self.p.aliases.get(method, {})
    if not available(node, self.p.init_namespace, set(aliases)):
      return None
    inlined = inline_aliases(node, aliases)
    # The added arguments (an input width no field explains) are `__init__`'s too.
    if not available(inlined, self.p.init_namespace, set(self.p.resolver.extras)):
      return None
    return self.p.rewrite_expr(self.p.code(inlined))

  # `self.param` / `self.variable` as NNX Variables (`variable_rewrites.py`).
  _param = variable_rewrites._param
  _computed_attribute = variable_rewrites._computed_attribute
  _setup_assign = variable_rewrites._setup_assign
  _variable = variable_rewrites._variable
  _made_on_first_use = variable_rewrites._made_on_first_use

  # Linen's module API through `self` as NNX's (`self_api.py`).
  _self_api = self_api._self_api
  _bare_make_rng = self_api.bare_make_rng
  leave_UnaryOperation = self_api.leave_UnaryOperation
  leave_BooleanOperation = self_api.leave_BooleanOperation

  def leave_ListComp(self, original, updated):
    """`[nn.Dense(w)(x) for w in ws]` -> `[self.Dense[layer](x) for layer, w in enumerate(ws)]`."""
    header = self.p.comp_index.get(id(original), (None, None))[1]
    if header is None:
      return updated
    c = libcst()
    for_in = updated.for_in.with_changes(
      target=c.parse_expression(header),
      iter=c.parse_expression(f"enumerate({self.p.code(original.for_in.iter)})"),
    )
    return updated.with_changes(for_in=for_in)

  def leave_Attribute(self, original, updated):
    c = libcst()
    site = self.p.site_of.get(id(original))
    if id(original) in self.reads:
      return updated  # `self.variables[col][name]`: the subscript around it is rewritten
    if site is not None and site.kind == "self_api":  # `self.variables[...]`, `self.scope`
      self._mark(
        f"self.{site.target} (Linen's variable dict and scope; an NNX module holds its "
        "Variables as attributes: read those)"
      )
      return updated
    name = dotted(original)
    if name is None:
      return updated
    if name == "self.make_rng":
      return self._bare_make_rng(original, updated)
    head, _, rest = name.partition(".")
    if head in self.local_vars and rest == "value" and self.p.ctx.modern:
      return c.parse_expression(f"{head}[...]")
    if head == "self" and rest.startswith("config."):
      new = self.p.rewrite_expr(name)  # a field the model's config mixin mirrors
      if new != name:
        return c.parse_expression(new)
    if head == "self" and self.method != "setup":
      if rest in self.p.param_attrs:
        return c.parse_expression(self.p.value_access(self.p.param_attrs[rest]))
      attr, _, tail = rest.partition(".")
      if attr in self.p.var_attrs and tail == "value":
        return c.parse_expression(self.p.value_access(self.p.var_attrs[attr]))
      if rest in self.p.var_attrs:
        return c.parse_expression(f"self.{self.p.var_attrs[rest]}")
      return updated
    if head in self.p.ctx.linen_names and rest:
      new = self.p.rewrite_expr(name)
      if new != name:
        return c.parse_expression(new)
    return updated

  def leave_Subscript(self, original, updated):
    name = self.read_of.get(id(original))
    if name is None:
      return variables_read(self, original) or updated
    new = self.p.value_access(name)
    self.p.change(
      self.p.positions[original].start.line,
      self.p.code(original),
      new,
      "Linen's variable dict read: the NNX module holds the variable as an attribute",
    )
    return libcst().parse_expression(new)

  def leave_Assign(self, original, updated):
    c = libcst()
    value = original.value
    placeholder = data_placeholder(self, original, updated)
    if placeholder is not None:
      return placeholder
    if self.p.ctx.modern and isinstance(value, (c.ListComp, c.List)):
      elements = [value.elt] if isinstance(value, c.ListComp) else [e.value for e in value.elements]
      local = isinstance(updated.targets[0].target, c.Name)
      if not local and any(
        id(e) in self.p.hoists and self.p.hoists[id(e)].is_list for e in elements
      ):
        # A Python list of layers is an nnx.List on flax versions that have one.
        updated = updated.with_changes(
          value=c.parse_expression(f"nnx.List({self.p.code(value)})").with_changes(
            args=[c.Arg(updated.value)]
          )
        )
    if (
      self.p.ctx.modern
      and isinstance(value, c.Tuple)
      and self.method == "setup"
      and not isinstance(updated.targets[0].target, c.Name)
      and any(id(e.value) in self.p.hoists for e in value.elements)
    ):
      # HF T5's `self.layer = (X(..., name=str(0)),)`, grown by `+=` after: a tuple of layers
      # is static data to flax 0.12's NNX (refused); an nnx.List holds them, and `+=` a tuple
      # extends it.
      items = ", ".join(self.p.code(e.value) for e in tp.cast(tp.Any, updated.value).elements)
      updated = updated.with_changes(value=c.parse_expression(f"nnx.List([{items}])"))
    if self.p.ctx.modern and isinstance(value, c.Name) and self.method == "setup":
      target: tp.Any = original.targets[0].target if len(original.targets) == 1 else None
      attr = target.attr.value if isinstance(target, c.Attribute) else None
      if attr is not None and any(
        h.site.list_attr == attr and h.site.setup_attr is None for h in self.p.hoists.values()
      ):
        # `self.layers = layers`, a list setup filled with layers: an nnx.List.
        updated = updated.with_changes(value=c.parse_expression(f"nnx.List({value.value})"))
    choice = self.p.choices.get(id(value))
    if choice is not None:
      # `layer = A if c else B`: the port of the class the trace saw, behind a guard.
      updated = updated.with_changes(value=c.Name(choice.drafted.__name__))
      if choice.other is not choice.drafted:
        test = self.p.code(tp.cast(tp.Any, original.value).test)
        statement = c.parse_statement(guard(choice, test))
        self.before.setdefault(id(self.stack[-1]), []).append(statement)
    name = self.p.renames.get(id(original))
    if name is not None:
      target = updated.targets[0].with_changes(target=c.parse_expression(f"self.{name}"))
      updated = updated.with_changes(targets=[target])
    return built_where_called(self, original, updated)


def _keyworded(args: list[tp.Any], cls: type) -> list[tp.Any]:
  """A flax layer's call arguments, those Linen passes by position and NNX takes by keyword
  (`nn.Dropout(r)(x, True)` -> `deterministic=True`) given their keyword."""
  layer = standard_layers.lookup(cls)
  if layer is None:
    return args
  c = libcst()
  positional = [a for a in args if a.keyword is None and not a.star]
  names = standard_layers.call_keywords(cls, layer, len(positional))
  return [
    a.with_changes(keyword=c.Name(n), equal=_tight_equal())
    if a.keyword is None and not a.star and i < len(names) and (n := names[i])
    else a
    for i, a in enumerate(args)
  ]


def _tight_equal() -> tp.Any:
  """`=` of a keyword argument as black and ruff write it (`f(x=1)`): the draft has the same
  formatting whether or not ruff is installed to format it."""
  c = libcst()
  return c.AssignEqual(
    whitespace_before=c.SimpleWhitespace(""), whitespace_after=c.SimpleWhitespace("")
  )
