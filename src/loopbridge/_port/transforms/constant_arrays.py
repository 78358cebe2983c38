"""Setup's constant arrays where NNX keeps no array attribute (flax 0.10): read-only properties.

HF's Flax models keep arrays made in `setup` as attributes: `self.causal_mask =
make_causal_mask(...)`, a sinusoidal `embed_positions`, CLIP's `position_ids`. flax 0.11 and
later keep such an attribute on an NNX module, and the draft keeps the assignment; flax 0.10's
graph refuses it when the module is split ("Arrays leaves are not supported"). There, an
attribute the trace saw holding an array, assigned once in setup from what a property can read
again (fields, setup's plain values, globals, setup's locals before it), becomes a read-only
property of the port recomputing the same expression (under jit, a constant); reads of it stay
as they are. What a property cannot recompute (a param, an rng draw, a submodule, a local
bound in a branch or a loop) is a TODO naming the attribute and the fix. This module plans and
edits the class; `constant_array_properties` reads setup and writes each property.
"""

from __future__ import annotations

import typing as tp

from ... import _compat
from ..emit.todo_blocks import todo_block
from ..plan.class_port import ClassPort, Context
from ..plan.source import dotted, libcst, resolve
from ..records import Change, Todo
from .axes_params import is_param_with_axes
from .constant_array_properties import (
  VARIABLE_READS,
  Evidence,
  Level,
  all_statements,
  block_levels,
  chained_property,
  constant_property,
  rebinding,
  self_reads,
  self_targets,
  unreadable,
)

WHY = "flax 0.10's NNX keeps no array attributes: recomputed where read, a constant under jit"


def as_properties(port: ClassPort, ctx: Context) -> ClassPort:
  """`port` with each constant array setup keeps made a property (or a TODO), where the
  installed flax refuses array attributes; unchanged elsewhere."""
  if _compat.nnx_keeps_array_attributes():
    return port
  evidence = Evidence.of(port, ctx)
  if not evidence.arrays:
    return port
  c = libcst()
  wrapper = c.MetadataWrapper(port.source.tree())
  setup = _method(wrapper.module, "setup")
  if setup is None:
    return port
  positions = wrapper.resolve(c.metadata.PositionProvider)
  plans = _plans(setup, evidence, port)
  if not plans:
    return port
  module = c.parse_module(port.code)
  classdef = next(s for s in module.body if isinstance(s, c.ClassDef))
  init = _method(module, "__init__")
  if init is None:
    return port
  properties: list[tp.Any] = []
  remove: set[int] = set()
  todos: dict[int, tp.Any] = {}  # id(statement) -> its TODO block
  for attr, (original, reason) in plans.items():
    chain = rebinding(init, attr) if reason is None else None
    if chain is not None:
      prop = chained_property(init, attr, chain)
      if not isinstance(prop, str):
        properties.append(prop)
        remove.update(id(s) for s in chain)
        line = port.source.line(positions[original].start.line)
        code = " ".join(wrapper.module.code_for_node(original).split())
        port.changes.append(Change(port.source.file, line, code[:90], f"@property {attr}", WHY))
        continue
      reason = prop
    drafted = _single_assignment(init, attr)
    # Bound several times: one TODO block in place of the first line, holding them all.
    others = [s for s in all_statements(init) if attr in self_targets(s)]
    if drafted is None and reason is not None and others:
      drafted = others[0]
      remove.update(id(s) for s in others[1:])
    if drafted is None:
      continue  # already a TODO block, or not drafted from setup's line
    line = port.source.line(positions[original].start.line)
    if any(t.line == line for t in port.todos):
      continue  # the line is a TODO already (a param inside an expression): one says it
    where = block_levels(init, drafted)
    if reason is None and isinstance(where, str):
      reason = where
    if reason is None and not isinstance(where, str):
      prop = constant_property(module, init, drafted, tp.cast(list[Level], where))
      if isinstance(prop, str):
        reason = prop
      else:
        properties.append(prop)
        remove.add(id(drafted))
        code = " ".join(wrapper.module.code_for_node(original).split())
        port.changes.append(Change(port.source.file, line, code[:90], f"@property {attr}", WHY))
        continue
    text = _reason(attr, tp.cast(str, reason))
    lines = [s for s in all_statements(setup) if attr in self_targets(s)] or [original]
    code = "".join(wrapper.module.code_for_node(s) for s in lines).strip("\n")
    port.todos.append(Todo(port.source.file, line, text, code))
    todos[id(drafted)] = todo_block(text, code, port.source.file, line)
  new_init = init.visit(_editor(remove, todos))
  body = list(classdef.body.body)
  at = next(i for i, s in enumerate(body) if s is init)
  body[at : at + 1] = [new_init, *properties]
  classdef_new = classdef.with_changes(body=classdef.body.with_changes(body=body))
  port.code = tp.cast(tp.Any, module.deep_replace(classdef, classdef_new)).code
  return port


def _param_or_none(stmt: tp.Any, namespace: tp.Mapping[str, object]) -> bool:
  """`self.x = self.param(...)` (or `self.variable(...)`) or `self.x = None`."""
  c = libcst()
  if not (isinstance(stmt, c.SimpleStatementLine) and isinstance(stmt.body[0], c.Assign)):
    return False
  value = stmt.body[0].value
  return (isinstance(value, c.Name) and value.value == "None") or _is_variable_call(
    value, namespace
  )


def _method(module: tp.Any, name: str) -> tp.Any:
  c = libcst()
  classdef = next((s for s in module.body if isinstance(s, c.ClassDef)), None)
  if classdef is None:
    return None
  return next(
    (s for s in classdef.body.body if isinstance(s, c.FunctionDef) and s.name.value == name),
    None,
  )


def _plans(
  setup: tp.Any, evidence: Evidence, port: ClassPort
) -> dict[str, tuple[tp.Any, str | None]]:
  """Attribute -> (setup's statement assigning it, why no property can recompute it or None),
  for each attribute the trace saw holding an array, in setup's order; a direct `self.param`
  or `self.variable` (drafted as an NNX Variable) is left out."""
  counts = _self_bindings(setup)
  namespace = port.source.namespace
  fields = set(port.field_names()) - port.dropped
  found: dict[str, tuple[tp.Any, str | None]] = {}
  chains: dict[str, list[tp.Any]] = {}  # attribute -> its bindings (`rebinding`)
  for attr in sorted(evidence.arrays, key=lambda a: _first_line(setup, a)):
    if attr in port.computed:
      continue  # a property over a kept Param (`computed_params.py`), or its TODO
    stmt = _single_assignment(setup, attr)
    if stmt is None:
      bindings = [s for s in all_statements(setup) if attr in self_targets(s)]
      if bindings and all(_param_or_none(s, namespace) for s in bindings):
        continue  # BEiT's `self.lambda_1 = self.param(...)` or `= None`: a Param, or nothing
      chain = rebinding(setup, attr)
      if chain is not None and not any(_param_or_none(s, namespace) for s in bindings):
        found[attr] = (bindings[0], None)  # GPT-Neo's windowed mask: bound again from itself
        chains[attr] = chain
        continue
      if bindings:
        reads = sorted(self_reads(bindings) & VARIABLE_READS)
        why = "setup binds it more than once or with other targets"
        if reads:
          why = f"it reads a param or variable (self.{reads[0]}) and {why}"
        found[attr] = (bindings[0], why)
      continue
    if _is_variable_call(stmt.body[0].value, namespace):
      continue
    found[attr] = (stmt, None)
  # An array attribute reading another one reads a property, unless that one is a TODO.
  while True:
    properties = {a for a, (_, why) in found.items() if why is None}
    plain = {a for a in evidence.plain if counts.get(a) == 1}
    readable = fields | plain | properties
    changed = False
    for attr, (stmt, why) in found.items():
      if why is not None:
        continue
      for binding in chains.get(attr, [stmt]):
        where = block_levels(setup, binding)
        # A later binding reads the attribute itself: the property's local by then.
        why = (
          where
          if isinstance(where, str)
          else unreadable(setup, binding, where, readable | {attr}, evidence)
        )
        if why is not None:
          found[attr] = (stmt, why)
          changed = True
          break
    if not changed:
      return found


def _first_line(fn: tp.Any, attr: str) -> int:
  stmts = all_statements(fn)
  return next((i for i, s in enumerate(stmts) if attr in self_targets(s)), len(stmts))


def _self_bindings(fn: tp.Any) -> dict[str, int]:
  counts: dict[str, int] = {}
  for stmt in all_statements(fn):
    for attr in self_targets(stmt):
      counts[attr] = counts.get(attr, 0) + 1
  return counts


def _single_assignment(fn: tp.Any, attr: str) -> tp.Any:
  """The one statement `self.<attr> = value` of `fn`, or None (none, several, or bound with
  other targets or by `+=`)."""
  c = libcst()
  stmts = [s for s in all_statements(fn) if attr in self_targets(s)]
  if len(stmts) != 1 or len(stmts[0].body) != 1:
    return None
  assign = stmts[0].body[0]
  if not isinstance(assign, c.Assign) or len(assign.targets) != 1:
    return None
  target = assign.targets[0].target
  return stmts[0] if isinstance(target, c.Attribute) else None


def _is_variable_call(value: tp.Any, namespace: tp.Mapping[str, object]) -> bool:
  """`self.param(...)` / `self.variable(...)` / `param_with_axes(...)`: the draft makes it an
  NNX Variable."""
  called = dotted(value.func) if isinstance(value, libcst().Call) else None
  if called is not None and is_param_with_axes(resolve(called, namespace)):
    return True
  return called is not None and called.startswith("self.") and called[5:] in VARIABLE_READS


def _reason(attr: str, why: str) -> str:
  if "a param or variable" in why:
    fix = "keep the param as an nnx.Param attribute and apply the arithmetic where it is read"
  else:
    fix = (
      "keep it in an nnx.Variable subclass (`class Constant(nnx.Variable): pass`, "
      f"`self.{attr} = Constant(...)`, read as `self.{attr}.value`), or upgrade to flax 0.11 "
      "or later, which keeps array attributes"
    )
  return (
    f"self.{attr} holds an array setup makes, which flax 0.10's NNX does not keep as an "
    f"attribute (`Arrays leaves are not supported`), and a read-only property cannot recompute "
    f"it: {why}. Fix: {fix}"
  )


def _edit_class() -> type:
  c = libcst()

  class Edit(c.CSTTransformer):
    """Drops the assignments that became properties (and an `if` left empty by it) and puts
    the TODO blocks in place."""

    def __init__(self, remove: set[int], todos: dict[int, tp.Any]):
      super().__init__()
      self.remove = remove
      self.todos = todos
      self.emptied: set[int] = set()

    def leave_SimpleStatementLine(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      if id(original) in self.remove:
        return c.RemoveFromParent()
      return self.todos.get(id(original), updated)

    def leave_IndentedBlock(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      if original.body and not updated.body:
        block = updated.with_changes(body=[c.SimpleStatementLine([c.Pass()])])
        self.emptied.add(id(block))
        return block
      return updated

    def leave_Else(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      if id(updated.body) in self.emptied:
        return c.RemoveFromParent()
      return updated

    def leave_If(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      if id(updated.body) in self.emptied and updated.orelse is None:
        return c.RemoveFromParent()
      return updated

  return Edit


def _editor(remove: set[int], todos: dict[int, tp.Any]) -> tp.Any:
  return _edit_class()(remove, todos)
