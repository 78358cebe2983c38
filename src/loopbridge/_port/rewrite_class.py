"""Rewrite one Linen class into its NNX port: plan the attributes, then rewrite the methods.

The plan pairs each construction site with the submodules the trace saw it make (by the line
that called them, or the attribute `setup` assigned), names each attribute as Linen named the
submodule (so the converter pairs them by path), and writes their NNX constructions into
`__init__`. `rewrite_methods` then replaces the sites inside the methods.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing as tp

from flax import linen as nn

from . import keyword_dicts, passed_values, setup_local_values, standard_layers
from .call_shapes import in_init
from .cell_carry import is_detached, plan_detached
from .chosen_class import Choice, plan_chosen_class
from .find_sites import Site, counted_name, explicit_name, find_sites
from .hoist import Hoist, handed_in, match_child
from .mixin_config import WHY as CONFIG_WHY
from .mixin_config import mirrored_fields
from .names import assignment_counts, available, bound_in_methods, names_in
from .previous_layer import list_width
from .records import Change, Todo
from .scan_lift import plan_scan
from .setup_list_plan import plan_setup_list
from .source import ClassSource, dotted, libcst, resolve
from .trace import Instance, Trace
from .tracing.widths import SymbolicWidths
from .transforms.call_filled_locals import filled_during_call
from .values import Resolver
from .vmap_lift import plan_vmap

if tp.TYPE_CHECKING:
  import libcst as cst


@dataclasses.dataclass
class Context:
  """What every class of one draft shares."""

  trace: Trace
  modern: bool  # flax 0.12 idioms: nnx.List, `variable[...]`, nnx.scan splitting rng streams
  ported: dict[type, ClassPort]
  linen_names: set[str]  # names the user's modules bind to flax.linen
  # Module path -> {cache variable: shape} of the user's Linen variables (a decode cache sized
  # by an init on the full length, not by the sample call).
  cache_shapes: dict[tuple[str, ...], dict[str, tuple[int, ...]]] = dataclasses.field(
    default_factory=dict
  )
  helpers: set[str] = dataclasses.field(default_factory=set)  # `helpers.py` classes used
  # The traces of the derived configurations (`configs.py`): evidence for width expressions.
  alt_traces: list[Trace] = dataclasses.field(default_factory=list)
  # Class -> (attribute, "attention" | "module" | "list") whose decode caches its
  # `init_cache` method sizes (`cache_idiom.py`).
  caches: dict[type, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
  # The symbolic trace (`tracing/`), the last of `alt_traces` when it ran.
  symbolic: SymbolicWidths | None = None


@dataclasses.dataclass
class ClassPort:
  cls: type
  source: ClassSource
  code: str = ""
  resolver: Resolver | None = None
  todos: list[Todo] = dataclasses.field(default_factory=list)
  changes: list[Change] = dataclasses.field(default_factory=list)
  uses_rngs_attr: bool = False
  attributes: dict[str, int] = dataclasses.field(default_factory=dict)  # attr -> class line

  dropped: set[str] = dataclasses.field(default_factory=set)  # module-factory fields
  # method -> {call argument added: the factory field whose partial bound it in Linen}
  threaded: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
  # A method scanned by a Linen decorator (`scanned_method.py`): Linen records one call of the
  # module per step, the port one call for the whole scan.
  scans_a_method: bool = False
  # Setup attributes computed from a param (`self.A = c * self.param("p", ...)`): A -> p,
  # made properties by `computed_params.py`.
  computed: dict[str, str] = dataclasses.field(default_factory=dict)

  def field_names(self) -> list[str]:
    return [f.name for f in dataclasses.fields(self.cls) if f.name not in ("parent", "name")]


def factory_class(value: object) -> type | None:
  """The Linen class a field value builds: `partial(nn.Conv, ...)` or `nn.Conv` itself."""
  import functools

  from flax import linen as nn

  func = value.func if isinstance(value, functools.partial) else value
  return func if isinstance(func, type) and issubclass(func, nn.Module) else None


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
    # (method, local) -> the hoist of the nn.scan / nn.vmap module the local holds
    self.lifted_locals: dict[tuple[str, str], Hoist] = {}
    # Layers made in nested loops (`rewrite_methods._plan_counter`), by id of their site:
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
      self.port.dropped.add(site.factory_field)
    cls = tp.cast(type, site.target)
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
      runs = {_list_run(list(n)) for n in names if n}
      run = runs.pop() if len(runs) == 1 else None
      if not any(names):  # not `named [()]`: nothing was paired at all
        self.todo(site, NO_MATCH)
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
      self.todo(site, NO_MATCH)
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

  def _made_elsewhere(self, site: Site) -> list[list[Instance]]:
    """Per instance of the class in the other configurations, what this construction made
    there (none of the user's instances made it: a branch only those take)."""
    return [
      self.made_by(site, inst, t)
      for t, parents in zip(self.ctx.alt_traces, self.resolver.alts)
      for inst in parents.values()
    ]

  def alt_made(self, hoist: Hoist) -> list[Instance]:
    """What this construction made in the other configurations, in trace order."""
    return [k for made in self._made_elsewhere(hoist.site) for k in made]

  def _alt_names(self, site: Site) -> set[tuple[str, ...]]:
    """The names of what this construction made in the other configurations."""
    return {tuple(k.path[-1] for k in made) for made in self._made_elsewhere(site) if made}

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

  def _inline_comp_todo(self, site: Site) -> str | None:
    """Why a list comprehension that builds and calls a layer (`[nn.Dense(w)(x) for w in
    self.widths]`) is not drafted, or None: `__init__` builds the same list."""
    c = libcst()
    comp: tp.Any = site.comp
    for_in = comp.for_in
    if site.loop is not None or site.conditional:
      return "a list comprehension of layers inside a loop or under an `if`"
    if for_in.inner_for_in is not None or for_in.ifs or for_in.asynchronous:
      return "a list comprehension of layers with several `for`s or an `if`"
    if any(
      s is not site and s.kind == "construct" and s.target is site.target and s.lines == site.lines
      for s in self.sites
    ):
      return "a list comprehension of layers with another layer of its class on its lines"
    aliases = self.aliases.get(site.method, {})
    if not available(for_in.iter, self.init_namespace, set(aliases)):
      return "a list comprehension of layers over something the call gives"
    if not isinstance(for_in.target, (c.Name, c.Tuple)):
      return "a list comprehension of layers with an unusual target"
    self.used_aliases.update(n for n in names_in(for_in.iter) if n in aliases)
    return None

  def _one_of_a_line(self, site: Site, made: list[Instance]) -> list[Instance]:
    """`nn.Dense(4)(nn.silu(nn.Dense(4)(x)))`: both constructions match the submodules the
    line called; each is the one called at its place in the order the calls finish (the
    inner first, then left to right), which is the trace's order."""
    peers = [
      s
      for s in self.sites
      if s.kind == "construct"
      and s.lines == site.lines
      and s.target is site.target
      and s.loop is None
      and s.outer_call is not None
      and s.local is None
      and s.lift is None
    ]
    if len(peers) < 2 or site not in peers or len(made) != len(peers):
      return made
    peers.sort(
      key=lambda s: (self.positions[s.outer_call].end.line, self.positions[s.outer_call].end.column)
    )
    return [made[peers.index(site)]]

  # --- values -----------------------------------------------------------------------------

  def traced(
    self,
    hoist: Hoist,
    get: tp.Callable[[Instance], object],
    hint: str,
    index: str | None,
    fallback: tp.Callable[[], str | None] | None = None,
  ) -> str:
    """The expression of a traced per-submodule value (per element of a list); `fallback`
    as `Resolver.expr` takes it (one value for the whole construction, not per element)."""
    name = f"{hoist.attr}_{hint}"
    if hoist.is_list:
      per = {p: tuple(get(k) for k in kids) for p, kids in hoist.children.items()}
      firsts = {p: t[0] for p, t in per.items() if t}
      alt_per = self.alt_lists(hoist, get)
      if all(all(v == t[0] for v in t) for d in (per, *alt_per) for t in d.values()):
        alt_firsts = [{p: t[0] for p, t in d.items() if t} for d in alt_per]
        return self.resolver.expr(firsts, name, alt_firsts)
      return list_width(self, hoist, get, name, index, per, alt_per)
    values = {p: get(k[0]) for p, k in hoist.children.items() if k}
    return self.resolver.expr(values, name, self.alt_children(hoist, get), fallback=fallback)

  def setup_local_for(self, hoist: Hoist, get: tp.Callable[[Instance], object]) -> str | None:
    """The one setup local bound before this setup construction that equals `get` of what it
    made in every traced instance of every configuration (`setup_local_values`), else None."""
    if hoist.site.method != "setup" or hoist.is_list:
      return None
    statements = setup_local_values.setup_statements(self.src.text, hoist.site.lines[0])
    samples: list[tuple[object, object]] = []
    try:
      for p, kids in hoist.children.items():
        if kids:
          samples.append((self.trace.instances[p].module, get(kids[0])))
      for found, parents in zip(self.alt_children(hoist, get), self.resolver.alts):
        samples += [(parents[p].module, v) for p, v in found.items() if p in parents]
    except Exception:  # a width this layer's trace does not give: no evidence
      return None
    return setup_local_values.matching_local(statements, self.src.namespace, samples)

  def passed_widths(
    self, hoist: Hoist, widths: tp.Callable[[Instance], dict[str, object]]
  ) -> dict[str, str]:
    """The input widths of a setup layer no traced call reached, as expressions, from a value
    a trace saw that the source proves it would be given (`passed_values`); {} unproven."""
    attr = hoist.site.setup_attr
    found = None if attr is None or hoist.is_list else passed_values.origin(self.src.text, attr)
    if attr is None or found is None:
      return {}

    def at(parent: Instance, trace: Trace) -> dict[str, object]:
      value = passed_values.value_given(found, parent, trace)
      # Setup built it there (not called: no trace), or the branch that builds it did not run
      # at this configuration: the value is still what it would be given, and a width that
      # reads the layer's own settings then has none to read.
      child = parent.module.__dict__.get(attr)
      if value is None:
        return {}
      if not isinstance(child, nn.Module):
        child = passed_values.NO_SETTINGS
      stand_in = dataclasses.replace(
        parent,
        path=(*parent.path, attr),
        cls=hoist.site.target,
        module=child,
        variables={},
        inputs={"__call__": ((value,), {})},
        called_at=None,
        lifts=(),
      )
      try:
        return {k: v for k, v in widths(stand_in).items() if v is not None}
      except Exception:  # a shape the layer's widths cannot read: no evidence
        return {}

    here = {p: at(self.trace.instances[p], self.trace) for p in hoist.children}
    there = [
      {p: at(i, t) for p, i in parents.items()}
      for t, parents in zip(self.ctx.alt_traces, self.resolver.alts)
    ]
    names = {n for d in (here, *there) for w in d.values() for n in w}
    out: dict[str, str] = {}
    for name in sorted(names):
      values = {p: w[name] for p, w in here.items() if name in w}
      alt_values = [{p: w[name] for p, w in d.items() if name in w} for d in there]
      out[name] = self.resolver.expr(values, f"{attr}_{name}", alt_values)
    return out

  def alt_children(
    self, hoist: Hoist, get: tp.Callable[[Instance], object]
  ) -> list[dict[tuple[str, ...], object]]:
    """`get` of the (first) submodule at the same path in each derived configuration."""
    out: list[dict[tuple[str, ...], object]] = []
    # Every instance of the class there (a derived configuration may have more of them),
    # with the submodule of the same name.
    # (Its path under the parent: a layer of an nn.Sequential sits one level further down.)
    rel = next((kids[0].path[len(p) :] for p, kids in hoist.children.items() if kids), None)
    for t, parents in zip(self.ctx.alt_traces, self.resolver.alts):
      found: dict[tuple[str, ...], object] = {}
      for p in parents:
        if rel is not None:
          kid = t.instances.get((*p, *rel))
        else:  # no instance of the user's made it (a branch): paired there as here
          made = self.made_by(hoist.site, parents[p], t)
          kid = made[0] if made else None
        if kid is None:
          continue
        try:
          found[p] = get(kid)
        except Exception:  # a derived configuration is evidence, not a must
          continue
      out.append(found)
    return out

  def alt_lists(
    self, hoist: Hoist, get: tp.Callable[[Instance], object]
  ) -> list[dict[tuple[str, ...], tuple[object, ...]]]:
    """`get` of each layer of the list in each derived configuration (`Dense_0, Dense_1, ...`
    under the same parent; a derived configuration may make more of them)."""
    out: list[dict[tuple[str, ...], tuple[object, ...]]] = []
    first = next((kids[0].path[-1] for kids in hoist.children.values() if kids), "")
    # `Dense_0, Dense_1, ...` as Linen numbers them, or `0, 1, ...` (HF's `name=str(i)`).
    m = re.fullmatch(r"(?:(.+)_)?(\d+)", first)

    def named(n: int) -> str:
      assert m is not None
      return str(n) if m.group(1) is None else f"{m.group(1)}_{n}"

    # Another construction numbered on after this one (a second loop of ResBlocks): the run
    # keeps the user's length, which then no field decides.
    cap = None
    for p, kids in hoist.children.items():
      last = re.fullmatch(r"(?:.+_)?(\d+)", kids[-1].path[-1]) if kids else None
      after = None if m is None or last is None else named(int(last.group(1)) + 1)
      if after is not None and (*p, after) in self.trace.instances:
        cap = len(kids)
    for t, parents in zip(self.ctx.alt_traces, self.resolver.alts):
      found: dict[tuple[str, ...], tuple[object, ...]] = {}
      for p in parents if m is not None else ():
        assert m is not None
        n = int(m.group(2))
        layers = []
        while (*p, named(n)) in t.instances and (cap is None or len(layers) < cap):
          layers.append(t.instances[(*p, named(n))])
          n += 1
        try:
          found[p] = tuple(get(k) for k in layers)
        except Exception:  # a derived configuration is evidence, not a must
          continue
      out.append(found)
    return out

  def alt_own(self, get: tp.Callable[[Instance], object]) -> list[dict[tuple[str, ...], object]]:
    """`get` of the class's own instances in each derived configuration, by path."""
    out: list[dict[tuple[str, ...], object]] = []
    for alts in self.resolver.alts:
      found: dict[tuple[str, ...], object] = {}
      for p, inst in alts.items():
        try:
          found[p] = get(inst)
        except Exception:  # a derived configuration is evidence, not a must
          continue
      out.append(found)
    return out

  def comprehension_targets(self, site: Site) -> set[str]:
    node = site.comp
    return set() if node is None else names_in(node.for_in.target)

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
