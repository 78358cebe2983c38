"""Rewrite one Linen class into its NNX port: plan the attributes, then rewrite the methods.

The plan pairs each construction site with the submodules the trace saw it make (by the line
that called them, or the attribute `setup` assigned), names each attribute as Linen named it
(the converter pairs by path) and writes their NNX constructions into `__init__`.
"""

from __future__ import annotations

import functools
import re
import typing as tp

from flax import linen as nn

from ..records import Change
from ..trace.trace import Instance, Trace
from ..transforms import flag_remat, keyword_dicts
from ..transforms.call_filled_locals import filled_during_call
from ..transforms.cell_carry import is_detached, plan_detached
from ..transforms.chosen_class import Choice, plan_chosen_class
from ..transforms.factory_fields import drop_factory_field, factory_class
from ..transforms.mixin_config import WHY as CONFIG_WHY
from ..transforms.mixin_config import mirrored_fields
from ..transforms.never_called import plan_never_called
from ..transforms.scan_lift import plan_scan
from ..transforms.vmap_lift import plan_vmap
from . import config_evidence, inline_constructions, standard_layers
from .call_shapes import in_init
from .class_port import ClassPort, Context
from .find_sites import Site, counted_name, explicit_name, find_sites
from .hoist import Hoist, handed_in, match_child
from .names import assignment_counts, available, bound_in_methods, names_in
from .setup_list_plan import plan_setup_list
from .source import dotted, libcst, resolve
from .values import Resolver

if tp.TYPE_CHECKING:
  import libcst as cst


def _list_run(names: list[str]) -> tuple[str, int, int] | None:
  """`('Dense', 0, 1)` for `['Dense_0', 'Dense_1']`, `('Conv', 1, 2)` for `['Conv_1',
  'Conv_2']` (the names a loop made, in order, numbered on), else None."""
  m = re.fullmatch(r"(.+)_(\d+)", names[0]) if names else None
  if m is None:
    return None
  prefix, first = m.group(1), int(m.group(2))
  wanted = [f"{prefix}_{first + i}" for i in range(len(names))]
  return (prefix, first, first + len(names) - 1) if names == wanted else None


CHOSEN_CLASS = (
  "a layer built through a local bound to a choice of classes ({choice}): the draft does not "
  "choose between the ports; write the construction of each port under the same condition"
)

NO_MATCH = (
  "no submodule the trace saw matches this construction (it is built outside the "
  "method that calls it, or named by a variable); build it where it is called with a "
  "literal name='...', or in setup"
)

# Lifts written with the construction that goes through them: the plan of each, or why not.
_PLANNED_LIFTS = {"scan": plan_scan, "vmap": plan_vmap}

# nn.remat's arguments that nnx.remat takes as they are (static_argnums counts self in both).
_REMAT_ARGS = frozenset({"prevent_cse", "static_argnums", "policy"})


class Planner:
  """Pairs a class's sites with the traced submodules and writes their NNX constructions."""

  def __init__(self, port: ClassPort, ctx: Context, wrapper: cst.MetadataWrapper):
    self.port = port
    self.ctx = ctx
    self.src = port.source
    self.module = wrapper.module
    # The globals `__init__` can read: the module's, less the names a method binds itself.
    shadowed = bound_in_methods(tp.cast(tp.Any, self.module.body[0]))
    self.init_namespace = {k: v for k, v in self.src.namespace.items() if k not in shadowed}
    self.instances = ctx.trace.of_class(port.cls)
    alts = [{p: i for p, i in t.instances.items() if i.cls is port.cls} for t in ctx.alt_traces]
    # The trace the class's own instances come from: the user's, or for a class only a config
    # branch builds (`branch_configs.py`), the first configuration that built it (whose
    # instances are then not evidence twice).
    self.trace = ctx.trace
    if not self.instances:
      home = next((k for k, found in enumerate(alts) if found), None)
      if home is not None:
        self.trace = ctx.alt_traces[home]
        self.instances = list(alts[home].values())
        alts[home] = {}
    # `self.config.NAME` reads of a field a config mixin mirrors (`mixin_config`).
    self.config_mirror = mirrored_fields(port.cls, [i.module for i in self.instances])
    self.config_reads: set[str] = set()  # those rewritten, each reported once
    root = ctx.trace.instances.get(())
    self.resolver = port.resolver = Resolver(
      self.instances,
      port.field_names(),
      alts,
      root is not None and root.cls is port.cls,
      ctx.symbolic,
    )
    self.sites = find_sites(
      wrapper, self.src.namespace, ctx.linen_names, port.field_names(), self._classes_in_fields()
    )
    self.hoists: dict[int, Hoist] = {}  # id(site.node) -> hoist
    self.todo_nodes: dict[int, str] = {}  # id(node) -> reason
    self.renames: dict[int, str] = {}  # id(setup Assign) -> the attribute it must assign
    self.lift_rewrites: dict[int, str] = {}  # id(lift call) -> its NNX form
    self.never_called: dict[int, str] = {}  # id(construction) -> why (never_called.py)
    # (method, local) -> the hoist of the nn.scan / nn.vmap module the local holds
    self.lifted_locals: dict[tuple[str, str], Hoist] = {}
    # Layers made in nested loops (`write_class._plan_counter`), by id of their site:
    self.counter_plans: dict[int, Hoist] = {}
    self.choices: dict[int, Choice] = {}  # id(`A if c else B` a local holds) -> its plan
    self.counter_nest: dict[int, tuple[str, list[str], int]] = {}  # list local, loop lines, depth
    self.scope_names: dict[int, set[str]] = {}  # names `__init__` has at the construction
    self.counter_inits: dict[int, list[str]] = {}  # id(outermost loop) -> its counters
    self.counter_names: list[str] = []  # every running counter, so that each is unique
    # id(list comprehension building and calling layers) -> its index name, new target or None
    self.comp_index: dict[int, tuple[str, str | None]] = {}
    self.increments: dict[int, str] = {}  # id(statement) -> the counter it advances
    self.positions = wrapper.resolve(libcst().metadata.PositionProvider)
    self.parents = wrapper.resolve(libcst().metadata.ParentNodeProvider)
    self.site_of = {id(s.node): s for s in self.sites}
    self.hoisted_code: dict[int, str] = {}
    # id(`initialize_carry` call) -> the detached cell it is made on (`cell_carry.py`)
    self.carry_calls: dict[int, Site] = {}
    self.param_attrs: dict[str, str] = {}  # setup attribute -> param name (read as a value)
    self.var_attrs: dict[str, str] = {}  # setup attribute -> variable name (a Variable)
    self.declarations: list[str] = []  # `self.x = nnx.Param(...)` of the call methods
    self.aliases = self._aliases()
    # (method, local) -> the `partial(Cls, ...)` call assigned to it
    self.partials = {
      (s.method, s.local_name): s.partial
      for s in self.sites
      if s.partial is not None and s.local_name
    }  # method -> {local: code} of `config = self.config` lines
    self.used_aliases: set[str] = set()

  def _aliases(self) -> dict[str, dict[str, str]]:
    """Per method, the locals assigned once, at the top, from fields and globals only.

    `config = self.config` then `nn.Dense(config.mlp_dim)`: the construction moves to
    `__init__`, where the same line gives `config` the same value.
    """
    c = libcst()
    found: dict[str, dict[str, str]] = {}
    classdef: tp.Any = self.module.body[0]
    for fn in classdef.body.body:
      if not isinstance(fn, c.FunctionDef):
        continue
      counts = assignment_counts(fn)
      filled = filled_during_call(fn)  # not the value `__init__` would copy
      mine: dict[str, str] = {}
      for stmt in fn.body.body:
        if not (isinstance(stmt, c.SimpleStatementLine) and isinstance(stmt.body[0], c.Assign)):
          continue
        assign = stmt.body[0]
        target = assign.targets[0].target
        if isinstance(target, c.Name) and target.value in filled:
          continue
        if (
          len(assign.targets) == 1
          and isinstance(target, c.Name)
          and counts.get(target.value) == 1
          and available(assign.value, self.init_namespace, set(mine))
        ):
          mine[target.value] = self.code(assign.value)
        elif (
          len(assign.targets) == 1 and isinstance(target, c.Name) and counts.get(target.value) == 1
        ):
          # `out = inputs.shape[-1] if self.out_dim is None else self.out_dim`: kept, sized
          # by what the traces say the input's shape is (`call_shapes`).
          code = in_init(self, fn, assign.value, set(mine))
          if code is not None:
            mine[target.value] = code
      found[fn.name.value] = mine
    return found

  def guard(self, site: Site, present: tp.Mapping[tuple[str, ...], bool], attr: str) -> str | None:
    """The `__init__` condition under which a call-method site's attribute exists (None: always).

    The site's own `if` tests when `__init__` can evaluate them (fields, globals, aliases);
    otherwise whether the trace saw it in each instance: always, or an added bool argument.
    """
    if not site.guards:
      return None
    written = self.written_guard(site.guards, site.method)
    if written is not None:
      return written
    values = list(present.values())
    if all(values):
      return None
    return self.resolver.expr(dict(present), f"has_{attr}")

  def written_guard(self, guards: list[tuple[tp.Any, bool]], method: str) -> str | None:
    """The `if` tests as one `__init__` condition, when it can evaluate them all (fields,
    globals, aliases); else None."""
    aliases = self.aliases.get(method, {})
    if not guards or not all(
      t is not None and available(t, self.init_namespace, set(aliases)) for t, _ in guards
    ):
      return None
    parts = []
    for test, negated in reversed(guards):
      self.used_aliases.update(n for n in names_in(test) if n in aliases)
      code = self.code(test)
      parts.append(f"not ({code})" if negated else code)
    return " and ".join(f"({p})" if len(parts) > 1 else p for p in parts)

  def declare(self, site: Site, name: str, decl: str) -> None:
    """Record a variable: built in `__init__` (setup: in place, under the Linen name)."""
    c = libcst()
    assign: tp.Any = self.parents.get(site.node)
    if site.method == "setup" and isinstance(assign, c.Assign):
      target = assign.targets[0].target
      if isinstance(target, c.Attribute) and dotted(target.value) == "self":
        table = self.param_attrs if site.kind == "param" else self.var_attrs
        table[target.attr.value] = name
        self.renames[id(assign)] = name
        self.port.attributes[name] = self.src.line(site.lines[0])
        return
    if site.method == "setup":
      self.todo(site, "a variable declared in setup without `self.<attr> = ...`")
      return
    present = {i.path: any(k[1] == name for k in i.variables) for i in self.instances}
    cond = self.guard(site, present, name)
    unit = self.module.default_indent
    line = f"self.{name} = {decl}"
    self.declarations.append(line if cond is None else f"if {cond}:\n{unit}{line}")
    self.port.attributes[name] = self.src.line(site.lines[0])

  def code(self, node: cst.CSTNode) -> str:
    return self.module.code_for_node(node)

  def _no_match(self, site: Site) -> str:
    """Why nothing the traces saw pairs with `site`: the branch it is under, when no trace
    took it (maskgit's `if self.hidden_size:` with the default None), else `NO_MATCH`."""
    tests = [
      f"not ({self.code(test)})" if negated else self.code(test)
      for test, negated in reversed(site.guards)
      if test is not None
    ]
    if not tests:
      return NO_MATCH
    return (
      f"no trace took the branch this construction is under (`if {' and '.join(tests)}`), so "
      "nothing tells what it builds; pass draft(configs=[...]) an instance of the model at "
      "which that holds (its widths are read there and the port is checked there too), or "
      "port the branch by hand"
    )

  def todo(self, site: Site, reason: str) -> None:
    self.todo_nodes[id(site.node)] = reason

  def change(self, lines: tuple[int, int] | int, old: str, new: str, why: str) -> None:
    line = lines[0] if isinstance(lines, tuple) else lines
    old1 = " ".join(old.split())
    self.port.changes.append(Change(self.src.file, self.src.line(line), old1[:90], new, why))

  # --- pairing ----------------------------------------------------------------------------

  def plan(self) -> None:
    used_lifts = {id(s.lift): s for s in self.sites if s.lift is not None}
    used_lifts.update({id(s.inner_lift): s for s in self.sites if s.inner_lift is not None})
    for site in self.sites:
      if site.kind == "lift" and id(site.node) in used_lifts:
        self._plan_lift(site)
      elif site.kind == "lift" and flag_remat.rewrite(self, site):
        continue
      elif site.kind == "lift":
        name = getattr(site.target, "__name__", "a lifted transform")
        self.todo(
          site,
          f"nn.{name} (a Linen lifted transform) has no drafted NNX form here; "
          "port it by hand (nnx.vmap/nnx.scan/nnx.remat over an NNX module)",
        )
      elif site.kind == "construct" and site.nested_in is None:
        self._plan_construct(site)
    fields = set(self.port.field_names())
    for key, hoist in list(self.hoists.items()):
      if hoist.attr in fields:
        # Linen keeps a field and a submodule of one name apart; an NNX module has one
        # attribute per name.
        del self.hoists[key]
        self.todo(
          hoist.site,
          f"the submodule {hoist.attr!r} has the name of a field of the class; an NNX module "
          "has one attribute per name: rename one of them (the submodule with name='...')",
        )

  def _plan_lift(self, site: Site) -> None:
    """`block = nn.remat(Block, ...)` -> `block = nnx.remat(lambda module, *args: ...)`."""
    name = getattr(site.target, "__name__", "")
    node = site.node
    if name in _PLANNED_LIFTS:
      return  # written with the construction that goes through it (`plan_scan`, `plan_vmap`)
    extra = [a for a in node.args[1:] if a.keyword is None or a.keyword.value not in _REMAT_ARGS]
    if name not in ("checkpoint", "remat") or extra:
      self.todo(
        site,
        f"nn.{name} over a module (only nn.remat/nn.checkpoint with "
        f"{', '.join(sorted(_REMAT_ARGS))} is drafted: nnx.remat)",
      )
      return
    cls = self.code(node.args[0].value)
    kwargs = "".join(f", {a.keyword.value}={self.code(a.value)}" for a in node.args[1:])
    # Through the module's own call (not `{cls}.__call__`): its class's call is what runs, as
    # for any other module call (subclasses and tools that wrap a module's call see it).
    del cls
    self.lift_rewrites[id(node)] = f"nnx.remat(lambda module, *args: module(*args){kwargs})"

  def _lift_name(self, site: Site) -> str:
    """`scan` for a construction through `nn.scan` (however imported); '' for none."""
    if site.lift is None:
      return ""
    return getattr(resolve(dotted(site.lift.func), self.src.namespace), "__name__", "")

  def _plan_construct(self, site: Site) -> None:
    if is_detached(site):
      plan_detached(self, site)
      return
    if site.chosen_class is not None:
      why = plan_chosen_class(self, site, CHOSEN_CLASS.format(choice=self.code(site.chosen_class)))
      if why is not None:
        self.todo(site, why)
        return
    if site.factory_field is not None:
      made = {factory_class(getattr(i.module, site.factory_field, None)) for i in self.instances}
      if len(made) != 1 or None in made:
        self.todo(
          site,
          f"self.{site.factory_field}(...) builds {sorted(map(str, made))}: not "
          "one Linen module class in every instance",
        )
        return
      site.target = made.pop()
      drop_factory_field(self, site.factory_field)
    cls = tp.cast(type, site.target)
    if cls in standard_layers.TABLE and plan_never_called(self, site, cls):
      return
    if not (cls in standard_layers.TABLE or cls in self.ctx.ported):
      traced = any(t.of_class(cls) for t in [self.ctx.trace, *self.ctx.alt_traces])
      why = (
        f"{cls.__module__}.{cls.__qualname__} has no NNX counterpart in the draft's table"
        if standard_layers.is_linen_layer(cls)
        else (
          # Only another configuration built it, and its source does not read (`draft.py`).
          f"{cls.__qualname__} was traced in another configuration, but its source cannot be "
          "read (no file defines it): define it in a module's file, or port it by hand"
        )
        if traced
        else (
          f"{cls.__qualname__} was not traced: neither the sample call nor a configuration "
          "with one setting changed reached it; pass draft(configs=[...]) an instance of the "
          "model whose call builds it, or port it by hand"
        )
      )
      if not traced and plan_never_called(self, site, cls):
        return
      self.todo(site, why)
      return
    lift = self._lift_name(site)
    if lift in _PLANNED_LIFTS and (site.method == "setup" or site.loop is not None):
      where = "in setup" if site.method == "setup" else "in a loop"
      self.todo(
        site,
        f"nn.{lift} built {where} (drafted where a compact method builds and calls it, "
        "outside loops)",
      )
      return
    children: dict[tuple[str, ...], list[Instance]] = {}
    explicit = explicit_name(site)
    if site.list_attr is not None:
      planned = plan_setup_list(self, site, explicit)
      if isinstance(planned, str):
        self.todo(site, planned)
      else:
        self.hoists[id(site.node)] = planned
      return
    counted = counted_name(site) if site.setup_list else None
    for inst in self.instances:
      children[inst.path] = self.made_by(site, inst, self.trace)
    names = {tuple(k.path[-1] for k in made) for made in children.values()}
    if site.setup_attr is not None and not site.setup_list:
      self.hoists[id(site.node)] = Hoist(site.setup_attr, site, children, False)
      return
    if counted is not None and site.setup_attr is not None:
      # Linen names each layer by the counter (`0`, `1`, ...: no list prefix); the port keeps
      # them in the setup attribute's list, paired layer by layer in order.
      prefix, suffix = counted
      if not all(list(n) == [f"{prefix}{i}{suffix}" for i in range(len(n))] for n in names):
        self.todo(
          site,
          f"the submodules this makes are named {sorted(names)}: not "
          f"{prefix}0{suffix}, {prefix}1{suffix}, ... made in order",
        )
        return
      self.hoists[id(site.node)] = Hoist(site.setup_attr, site, children, True)
      return
    inline_comp = site.comp is not None and site.setup_attr is None
    if inline_comp:
      why = self._inline_comp_todo(site)
      if why is not None:
        self.todo(site, why)
        return
    if site.setup_attr is not None or site.loop is not None or inline_comp:
      # Built in a compact method, a class's layers are numbered across the whole method:
      # a list may start past 0 (`Conv_1, Conv_2` after a `Conv_0` built before the loop).
      names = names if any(names) else self._alt_names(site)  # a branch only others took
      runs = {_list_run(list(n)) for n in names if n}
      run = runs.pop() if len(runs) == 1 else None
      if not any(names):  # not `named [()]`: nothing was paired at all
        self.todo(site, self._no_match(site))
        return
      if run is None or (site.setup_attr is not None and run[1] != 0):
        self.todo(
          site,
          f"the submodules this makes are named {sorted(names)}: not one list "
          "name_0, name_1, ... made in order",
        )
        return
      prefix, first, last = run
      attr = prefix if first == 0 else f"{prefix}_{first}_to_{last}"
      hoist = Hoist(attr, site, children, True)
      # Nested loops (stages of blocks), or an `if` in the loop: a running count indexes the
      # list at the call.
      hoist.counter = site.setup_attr is None and (site.loop_depth > 1 or site.conditional)
      self.hoists[id(site.node)] = hoist
      return
    made_names = {n for n in names if n} or self._alt_names(site)
    if not made_names:
      self.todo(site, self._no_match(site))
      return
    if (
      site.method == "setup"
      and all(len(n) == 1 and not n[0].isidentifier() for n in made_names)
      and all(self._sole_of_its_class(site, [k]) for kids in children.values() for k in kids)
    ):
      # Setup's one construction of its class, in place in setup's line (HF T5's `+=
      # (FlaxT5LayerFF(..., name=str(index)),)`): its name differs with the branch before it
      # ("1" in the encoder, "2" in the decoder), and the port keeps the line, not the name.
      made_names = {sorted(made_names)[0]}
    if len(made_names) != 1 or len(next(iter(made_names))) != 1:
      self.todo(
        site,
        f"the trace cannot tell which submodule this construction made "
        f"(made {sorted(names)} across instances); name it with name='...'",
      )
      return
    hoist = Hoist(next(iter(made_names))[0], site, children, False)
    if lift in _PLANNED_LIFTS:
      made = [k for kids in children.values() for k in kids]
      plan = _PLANNED_LIFTS[lift](self, site, made)
      if isinstance(plan, str):
        self.todo(site, plan)
        return
      hoist.lifted = plan
      if site.local is not None:
        self.lifted_locals[(site.method, site.local)] = hoist
    self.hoists[id(site.node)] = hoist

  @functools.cached_property
  def setup_locals(self) -> set[str]:
    """The names `setup` binds by plain assignment (its body runs in `__init__` as written)."""
    c = libcst()
    found: set[str] = set()
    classdef: tp.Any = self.module.body[0]
    for fn in classdef.body.body:
      if isinstance(fn, c.FunctionDef) and fn.name.value == "setup":
        for stmt in fn.body.body:
          if isinstance(stmt, c.SimpleStatementLine) and isinstance(stmt.body[0], c.Assign):
            for t in stmt.body[0].targets:
              if isinstance(t.target, c.Name):
                found.add(t.target.value)
    return found

  def dict_locals(self, method: str) -> dict[str, tp.Any]:
    """The locals of `method` assigned once, from a dict written out with string keys
    (`dict(a=1)` or `{"a": 1}`: name -> (key, value) in order), or from one such dict or
    another chosen by a test (name -> the `IfExp`), at any depth of its body
    (`keyword_dicts.py`)."""
    return self._dict_locals.get(method, {})

  @functools.cached_property
  def _dict_locals(self) -> dict[str, dict[str, tp.Any]]:
    """`dict_locals` of every method, found once per class (read at each construction)."""
    c = libcst()
    import libcst.matchers as m  # every `Assign` at any depth (libcst is there: `c` above)

    out: dict[str, dict[str, tp.Any]] = {}
    classdef: tp.Any = self.module.body[0]
    for fn in classdef.body.body:
      if not isinstance(fn, c.FunctionDef):
        continue
      counts = assignment_counts(fn)
      found = out.setdefault(fn.name.value, {})
      for assign in tp.cast(tp.Any, m.findall(fn.body, m.Assign())):
        target = assign.targets[0].target
        if len(assign.targets) != 1 or not isinstance(target, c.Name):
          continue
        if counts.get(target.value) != 1:
          continue
        value = keyword_dicts.items(assign.value)
        value = keyword_dicts.chosen(assign.value) if value is None else value
        if value is not None:
          found[target.value] = value
    return out

  # What a construction made and the other configurations' evidence (`config_evidence.py`).
  _made_elsewhere = config_evidence._made_elsewhere
  alt_made = config_evidence.alt_made
  _alt_names = config_evidence._alt_names
  traced = config_evidence.traced
  setup_local_for = config_evidence.setup_local_for
  passed_widths = config_evidence.passed_widths
  alt_children = config_evidence.alt_children
  alt_lists = config_evidence.alt_lists
  alt_own = config_evidence.alt_own

  def made_by(self, site: Site, inst: Instance, trace: Trace) -> list[Instance]:
    """The submodules of `inst` (in `trace`) that this construction made, in order."""
    kids = [k for k in trace.children(inst.path) if not handed_in(inst, k)]
    explicit = explicit_name(site)
    counted = counted_name(site) if site.setup_list else None
    if explicit is not None:
      return [k for k in kids if k.path[-1] == explicit]
    if site.setup_attr is not None and counted is not None:
      pattern = rf"{re.escape(counted[0])}\d+{re.escape(counted[1])}"
      return [k for k in kids if re.fullmatch(pattern, k.path[-1])]
    if site.setup_attr is not None:
      attr = site.setup_attr
      return [k for k in kids if k.path[-1] == attr or re.fullmatch(rf"{attr}_\d+", k.path[-1])]
    made = [k for k in kids if match_child(site, self.src, k)]
    if not made and site.method == "setup":
      made = self._sole_of_its_class(site, kids)
    return self._one_of_a_line(site, made)

  def _sole_of_its_class(self, site: Site, kids: list[Instance]) -> list[Instance]:
    """Setup's one construction of a class, and the instance's one submodule of that class
    (HF T5's `self.layer += (FlaxT5LayerFF(..., name=str(index)),)`: named by a local that
    runs in a branch, which the trace cannot read); else nothing."""
    if site.loop is not None or site.comp is not None:
      return []
    same = [s for s in self.sites if s.kind == "construct" and s.target is site.target]
    of_class = [k for k in kids if k.cls is site.target]
    return of_class if len(same) == 1 and len(of_class) == 1 else []

  def _classes_in_fields(self) -> dict[str, type]:
    """The fields that hold the same Linen class in every traced instance."""
    found: dict[str, type] = {}
    for name in self.port.field_names():
      values = {
        id(getattr(i.module, name, None)): getattr(i.module, name, None) for i in self.instances
      }
      (value,) = values.values() if len(values) == 1 else (None,)
      if isinstance(value, type) and issubclass(value, nn.Module):
        found[name] = value
    return found

  # Constructions built inside the line that calls them (`inline_constructions.py`).
  _inline_comp_todo = inline_constructions._inline_comp_todo
  _one_of_a_line = inline_constructions._one_of_a_line
  comprehension_targets = inline_constructions.comprehension_targets

  # --- values -----------------------------------------------------------------------------

  def rewrite_expr(self, code: str) -> str:
    """`nn.initializers.zeros_init()` -> `nnx.initializers.zeros_init()` (same objects)."""
    from .linen_api import nnx_equivalent

    def sub(m: re.Match[str]) -> str:
      rest = nnx_equivalent(m.group(2))
      return f"nnx.{rest}" if rest else m.group(0)

    for alias in self.ctx.linen_names:
      # Only the alias itself: `jax.nn.initializers` is jax's, not flax.linen's.
      code = re.sub(rf"(?<![\w.])({re.escape(alias)})\.([A-Za-z_][\w.]*)", sub, code)
    return re.sub(r"(?<![\w.])self\.config\.([A-Za-z_]\w*)\b", self._config_read, code)

  def _config_read(self, m: re.Match[str]) -> str:
    """`self.config.NAME` -> `self.NAME` for a field the model's config mixin mirrors."""
    name = m.group(1)
    if name not in self.config_mirror:
      return m.group(0)
    if name not in self.config_reads:
      self.config_reads.add(name)
      self.port.changes.append(
        Change(self.src.file, self.src.first_line, m.group(0), f"self.{name}", CONFIG_WHY)
      )
    return f"self.{name}"

  def value_access(self, attr: str) -> str:
    return f"self.{attr}[...]" if self.ctx.modern else f"self.{attr}.value"

  def list_of(self, items: str) -> str:
    return f"nnx.List({items})" if self.ctx.modern else items
