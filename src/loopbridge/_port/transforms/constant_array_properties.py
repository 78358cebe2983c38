"""The read-only property that recomputes one constant array setup assigned (`constant_arrays`):
setup's statement with the locals it reads and the `if`s around it, or what a property cannot
read again; and the evidence of which attributes the traced instances held arrays in."""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
import numpy as np
from flax import linen as nn
from flax.core import scope as linen_scope

from ..plan.class_port import ClassPort, Context
from ..plan.names import names_in
from ..plan.source import dotted, libcst

# What a Linen method reads through `self` that no property can read again.
VARIABLE_READS = frozenset(
  {"param", "variable", "variables", "get_variable", "has_variable", "put_variable"}
)
_RNG_READS = frozenset({"make_rng", "has_rng"})


COMMENT = "# flax 0.10's NNX keeps no array attributes: recomputed where read (constant under jit)"


@dataclasses.dataclass
class Level:
  """One block on the way from a function's body to a statement: the block's statements, the
  index of the one holding the statement, and the `if` test that enters the block (negated
  for an `else`), None for the function's body."""

  stmts: tp.Sequence[tp.Any]
  index: int
  test: tp.Any = None
  negated: bool = False


@dataclasses.dataclass
class Evidence:
  """What the traced instances of a class held in each attribute setup assigned."""

  arrays: set[str]  # an array in some instance (never a module)
  plain: set[str]  # no array, module or Linen variable in any instance: a property reads it
  submodules: set[str]

  @classmethod
  def of(cls, port: ClassPort, ctx: Context) -> Evidence:
    fields = {"parent", "name", "scope", *port.field_names()}
    instances = [*ctx.trace.of_class(port.cls)]
    for alt in ctx.alt_traces:
      instances += alt.of_class(port.cls)
    arrays: set[str] = set()
    held: dict[str, list[object]] = {}
    for inst in instances:
      for name, value in vars(inst.module).items():
        if not name.startswith("_") and name not in fields:
          held.setdefault(name, []).append(value)
    submodules = {n for n, vs in held.items() if any(_holds(v, nn.Module) for v in vs)}
    for name, values in held.items():
      if name not in submodules and any(isinstance(v, (jax.Array, np.ndarray)) for v in values):
        arrays.add(name)
    unplain = (jax.Array, np.ndarray, nn.Module, linen_scope.Variable)
    plain = {n for n, vs in held.items() if not any(_holds(v, unplain) for v in vs)}
    return cls(arrays, plain, submodules)


def _holds(value: object, types: type | tuple[type, ...]) -> bool:
  return any(isinstance(leaf, types) for leaf in jax.tree.leaves(value))


def all_statements(fn: tp.Any) -> list[tp.Any]:
  c = libcst()
  found: list[tp.Any] = []

  class V(c.CSTVisitor):
    def visit_SimpleStatementLine(self, node: tp.Any) -> None:
      found.append(node)

  fn.visit(V())
  return found


def self_targets(stmt: tp.Any) -> set[str]:
  """The `self.x` attributes a simple statement binds."""
  c = libcst()
  found: set[str] = set()
  for small in stmt.body:
    targets: list[tp.Any] = []
    if isinstance(small, c.Assign):
      targets = [t.target for t in small.targets]
    elif isinstance(small, (c.AugAssign, c.AnnAssign)):
      targets = [small.target]
    for target in targets:
      elements = (
        [e.value for e in target.elements] if isinstance(target, (c.Tuple, c.List)) else [target]
      )
      for e in elements:
        if isinstance(e, c.Attribute) and isinstance(e.value, c.Name) and e.value.value == "self":
          found.add(e.attr.value)
  return found


def block_levels(fn: tp.Any, stmt: tp.Any) -> list[Level] | str:
  """The blocks from `fn`'s body down to `stmt` (through `if`s only), or why not."""
  c = libcst()

  def search(stmts: tp.Sequence[tp.Any], level: Level) -> list[Level] | str | None:
    for i, s in enumerate(stmts):
      here = dataclasses.replace(level, stmts=stmts, index=i)
      if s is stmt:
        return [here]
      if isinstance(s, c.If):
        found = search_if(s, here)
        if found is not None:
          return found
      elif isinstance(s, c.BaseCompoundStatement) and _contains(s, stmt):
        return "setup assigns it inside a loop, a `with` or a `try`"
    return None

  def search_if(node: tp.Any, here: Level) -> list[Level] | str | None:
    inner = search(node.body.body, Level((), 0, node.test))
    if inner is None and isinstance(node.orelse, c.If):
      inner = search([node.orelse], Level((), 0, node.test, negated=True))
    elif inner is None and node.orelse is not None:
      inner = search(node.orelse.body.body, Level((), 0, node.test, negated=True))
    return inner if inner is None or isinstance(inner, str) else [here, *inner]

  found = search(fn.body.body, Level((), 0))
  return found if found is not None else "setup assigns it where the draft cannot follow"


def rebinding(fn: tp.Any, attr: str) -> list[tp.Any] | None:
  """The statements binding `self.<attr>` when there are several, each `self.<attr> = value`
  alone on its line, the first in `fn`'s own body (so a value exists whatever the settings)
  and the others under `if`s only (GPT-Neo: `self.causal_mask = ...`, then under `if
  self.attention_type == "local":` `self.causal_mask = self.causal_mask ^ ...`); else None."""
  c = libcst()
  stmts = [s for s in all_statements(fn) if attr in self_targets(s)]
  if len(stmts) < 2 or not any(s is stmts[0] for s in fn.body.body):
    return None
  for s in stmts:
    assign = s.body[0]
    if len(s.body) != 1 or not isinstance(assign, c.Assign) or len(assign.targets) != 1:
      return None
    if not isinstance(assign.targets[0].target, c.Attribute) or isinstance(
      block_levels(fn, s), str
    ):
      return None
  return stmts


def chained_property(init: tp.Any, attr: str, chain: list[tp.Any]) -> tp.Any:
  """The read-only property repeating each binding of a `rebinding` chain in `__init__`'s
  order, with the `if`s around them and the locals they read, into a local it returns; or
  why the drafted `__init__` does not let a property repeat them."""
  c = libcst()
  bindings = {id(s) for s in chain}
  keep = set(bindings)
  for stmt in chain:
    levels = block_levels(init, stmt)
    if isinstance(levels, str):
      return levels
    carried = _carried(init, stmt, levels)
    if isinstance(carried, str):
      return carried
    keep.update(id(s) for level in carried[0] for s in level)
  bound = set().union(*(_local_targets(s) for s in init.body.body))
  local = attr if attr not in bound else f"{attr}_value"

  class AsLocal(c.CSTTransformer):
    """`self.<attr>` read in a later binding: the local bound so far."""

    def leave_Attribute(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      if dotted(original) == f"self.{attr}":
        return c.Name(local)
      return updated

  def sliced(stmts: tp.Sequence[tp.Any]) -> list[tp.Any]:
    out: list[tp.Any] = []
    for s in stmts:
      if id(s) in bindings:
        value = s.body[0].value.visit(AsLocal())
        out.append(c.SimpleStatementLine([c.Assign([c.AssignTarget(c.Name(local))], value)]))
      elif id(s) in keep:
        out.append(s.with_changes(leading_lines=[]))
      elif isinstance(s, c.If) and any(_contains(s, b) for b in chain):
        out.append(_sliced_if(s, sliced))
    return out

  return _as_property(
    attr, [*sliced(init.body.body), c.SimpleStatementLine([c.Return(c.Name(local))])]
  )


def _as_property(attr: str, body: list[tp.Any]) -> tp.Any:
  """`@property def <attr>(self):` over `body`, the first line under the comment saying why."""
  c = libcst()
  comment = c.EmptyLine(comment=c.Comment(COMMENT))
  body = [body[0].with_changes(leading_lines=[comment]), *body[1:]]
  skeleton = c.parse_statement(f"@property\ndef {attr}(self):\n  pass\n")
  return skeleton.with_changes(
    body=c.IndentedBlock(body=body), leading_lines=[c.EmptyLine(indent=False)]
  )


def _sliced_if(node: tp.Any, sliced: tp.Callable[[tp.Sequence[tp.Any]], list[tp.Any]]) -> tp.Any:
  """An `if` (and its `elif`s and `else`) keeping only what `sliced` keeps of each block
  (`pass` where that is nothing)."""
  c = libcst()

  def block(b: tp.Any) -> tp.Any:
    return b.with_changes(body=sliced(b.body) or [c.SimpleStatementLine([c.Pass()])])

  orelse = node.orelse
  if isinstance(orelse, c.If):
    orelse = _sliced_if(orelse, sliced)
  elif orelse is not None:
    orelse = orelse.with_changes(body=block(orelse.body))
  return node.with_changes(body=block(node.body), orelse=orelse, leading_lines=[])


def _contains(node: tp.Any, target: tp.Any) -> bool:
  c = libcst()
  seen = False

  class V(c.CSTVisitor):
    def on_visit(self, n: tp.Any) -> bool:
      nonlocal seen
      seen = seen or n is target
      return not seen

  node.visit(V())
  return seen


def _carried(
  fn: tp.Any, stmt: tp.Any, levels: list[Level]
) -> tuple[list[list[tp.Any]], set[str]] | str:
  """Per level, the statements before `stmt` that bind the locals it reads (in order), and
  every name those and it read; or why a property cannot repeat them (a local bound in a
  branch, a loop, or an argument of the function)."""
  c = libcst()
  tests = [lv.test for lv in levels if lv.test is not None]
  needed = set().union(*(names_in(n) for n in [stmt.body[0].value, *tests]))
  params = {p.name.value for p in [*fn.params.params, *fn.params.kwonly_params]} - {"self"}
  while True:
    carried: list[list[tp.Any]] = []
    for level in levels:
      mine = []
      for s in level.stmts[: level.index]:
        bound = _local_targets(s)
        if not (bound & needed):
          continue
        if not isinstance(s, c.SimpleStatementLine):
          local = sorted(bound & needed)[0]
          return f"it reads the local `{local}`, which setup binds in a branch, a loop or a `with`"
        mine.append(s)
      carried.append(mine)
    reads = set().union(set(), *(_reads_of(s) for level in carried for s in level))
    if reads <= needed:
      break
    needed |= reads
  # The arguments read before a carried line binds the name (`config = self.config` binds
  # the `config` that the field `config` is too).
  free: set[str] = set()
  bound: set[str] = set()
  for level, stmts in zip(levels, carried):
    free |= names_in(level.test) - bound if level.test is not None else set()
    for s in stmts:
      free |= _reads_of(s) - bound
      bound |= _local_targets(s)
  free |= names_in(stmt.body[0].value) - bound
  if free & params:
    return f"it reads `{sorted(free & params)[0]}`, an argument of the port's __init__"
  return carried, needed


def _local_targets(stmt: tp.Any) -> set[str]:
  """Every plain name a statement (simple or compound) binds."""
  c = libcst()
  found: set[str] = set()

  class V(c.CSTVisitor):
    def visit_AssignTarget(self, node: tp.Any) -> None:
      found.update(_plain_names(node.target))

    def visit_AnnAssign(self, node: tp.Any) -> None:
      found.update(_plain_names(node.target))

    def visit_AugAssign(self, node: tp.Any) -> None:
      found.update(_plain_names(node.target))

    def visit_For(self, node: tp.Any) -> None:
      found.update(_plain_names(node.target))

    def visit_AsName(self, node: tp.Any) -> None:
      found.update(_plain_names(node.name))

    def visit_NamedExpr(self, node: tp.Any) -> None:
      found.update(_plain_names(node.target))

    def visit_FunctionDef(self, node: tp.Any) -> bool:
      found.add(node.name.value)
      return False

    def visit_Lambda(self, node: tp.Any) -> bool:
      return False

  stmt.visit(V())
  return found


def _plain_names(target: tp.Any) -> set[str]:
  c = libcst()
  if isinstance(target, c.Name):
    return {target.value}
  if isinstance(target, (c.Tuple, c.List)):
    return set().union(set(), *(_plain_names(e.value) for e in target.elements))
  if isinstance(target, c.StarredElement):
    return _plain_names(target.value)
  return set()


def _reads_of(stmt: tp.Any) -> set[str]:
  """The names a carried simple statement reads (its values; an `x += ...` reads `x`)."""
  c = libcst()
  found: set[str] = set()
  for small in stmt.body:
    if isinstance(small, c.Assign):
      found |= names_in(small.value)
      for t in small.targets:  # `a[i] = ...`, `a.b = ...` read `a`
        if not isinstance(t.target, (c.Name, c.Tuple, c.List)):
          found |= names_in(t.target)
    elif isinstance(small, (c.AugAssign, c.AnnAssign)) and small.value is not None:
      found |= names_in(small.value) | names_in(small.target)
    else:
      found |= names_in(small)
  return found


def self_reads(nodes: tp.Iterable[tp.Any]) -> set[str]:
  c = libcst()
  found: set[str] = set()

  class V(c.CSTVisitor):
    def visit_Attribute(self, node: tp.Any) -> None:
      if isinstance(node.value, c.Name) and node.value.value == "self":
        found.add(node.attr.value)

  for n in nodes:
    n.visit(V())
  return found


def unreadable(
  setup: tp.Any, stmt: tp.Any, levels: list[Level], readable: set[str], evidence: Evidence
) -> str | None:
  """What setup's statement (with the locals it reads and the `if`s around it) reads that a
  property cannot read again, or None."""
  carried = _carried(setup, stmt, levels)
  if isinstance(carried, str):
    return carried
  by_level, _ = carried
  for s in (s for level in by_level for s in level):
    if self_targets(s):
      return "a line it reads also assigns an attribute"
  tests = [lv.test for lv in levels if lv.test is not None]
  reads = self_reads([stmt.body[0].value, *tests, *(s for level in by_level for s in level)])
  for name in sorted(reads - readable):
    if name in VARIABLE_READS:
      return f"it reads a param or variable (self.{name})"
    if name in _RNG_READS:
      return f"it reads an rng draw (self.{name})"
    if name in evidence.submodules:
      return f"it reads the submodule self.{name}"
    return f"it reads self.{name}, neither a field nor a plain value setup assigns once"
  return None


def constant_property(module: tp.Any, init: tp.Any, stmt: tp.Any, levels: list[Level]) -> tp.Any:
  """The read-only property returning what `stmt` assigns, with the locals it reads and the
  `if`s around it (nodes of the drafted `__init__`, so that libcst indents every line of
  them); or why the drafted `__init__` does not let a property repeat them."""
  c = libcst()
  carried = _carried(init, stmt, levels)
  if isinstance(carried, str):
    return carried
  by_level, _ = carried
  attr = stmt.body[0].targets[0].target.attr.value
  body: list[tp.Any] = [c.SimpleStatementLine([c.Return(stmt.body[0].value)])]
  for i in reversed(range(len(levels))):
    body = [s.with_changes(leading_lines=[]) for s in by_level[i]] + body
    test = levels[i].test
    if test is not None:
      if levels[i].negated:
        test = c.parse_expression(f"not ({module.code_for_node(test)})")
      body = [c.If(test=test, body=c.IndentedBlock(body=body))]
  if len(levels) > 1:
    body.append(
      c.parse_statement(
        f"raise AttributeError({attr!r})  # setup assigns it only under these `if`s\n"
      )
    )
  return _as_property(attr, body)
