"""A setup attribute computed from a param: the Param kept, the arithmetic a property.

HF's Dinov2 layer scale is written

    self.lambda1 = self.config.layerscale_value * self.param("lambda1", ones, (hidden,))
    self.lambda1 = self.lambda1 * self.config.layerscale_value

Linen stores the param `lambda1` and runs setup on every apply, so `self.lambda1` is the
product, recomputed from the current param. An NNX module runs `__init__` once: the port keeps
`self.lambda1 = nnx.Param(...)` (the checkpoint's leaf, under its Linen name) and the product
becomes a read-only property computing the same lines from the Param on every read. When the
attribute and the param share a name, the property is `lambda1_value` and the class's reads of
`self.lambda1` read it.

Only lines of setup's own body (not under an `if` or a loop) that read `self`, globals and
builtins are moved; a setup local, a constructor argument or a binding elsewhere keeps the
line a TODO naming what to write.
"""

from __future__ import annotations

import ast
import builtins
import typing as tp

from .port_tree import class_and_init
from .records import Todo
from .rewrite_class import ClassPort, Context
from .rewrite_methods import todo_block
from .source import dotted, libcst, self_target

COMMENT = "# setup computed it from the Param on every apply: recomputed where read"


def keep_params(port: ClassPort, ctx: Context) -> ClassPort:
  """`port` with each attribute setup computed from a param made a property (or a TODO)."""
  if not port.computed:
    return port
  c = libcst()
  module, classdef, init = class_and_init(port.code)
  if init is None:
    return port
  taken = {s.name.value for s in classdef.body.body if isinstance(s, c.FunctionDef)}
  taken |= set(port.attributes)
  replace: dict[int, tp.Any] = {}  # id(statement) -> its replacement (None: removed)
  renames: dict[str, str] = {}
  properties: list[tp.Any] = []
  for attr, name in port.computed.items():
    plan = _plan(init, attr, name, port, taken, ctx.modern)
    if isinstance(plan, str):
      first, why = _first_binding(init, attr), plan
      if first is None:
        continue
      reason = (
        f"self.param({name!r}, ...) inside an expression in setup: {why}. Keep the Param as "
        f"self.{name} = nnx.Param(...) and compute the expression where it is read"
      )
      line = port.attributes.get(name, 0)
      code = _original_line(port, line) or module.code_for_node(first).strip("\n")
      port.todos.append(Todo(port.source.file, line, reason, code))
      port.changes = [ch for ch in port.changes if ch.line != line]
      replace[id(first)] = todo_block(reason, code, port.source.file, line)
      continue
    stmts, kept, prop, prop_name = plan
    replace[id(stmts[0])] = kept
    replace.update({id(s): None for s in stmts[1:]})
    properties.append(prop)
    taken.add(prop_name)
    if prop_name != attr:
      renames[attr] = prop_name
  new_classdef = classdef.visit(_editor(replace, renames))
  body = list(new_classdef.body.body)
  at = next(
    i for i, s in enumerate(body) if isinstance(s, c.FunctionDef) and s.name.value == "__init__"
  )
  body[at + 1 : at + 1] = properties
  new_classdef = new_classdef.with_changes(body=new_classdef.body.with_changes(body=body))
  port.code = tp.cast(tp.Any, module.deep_replace(classdef, new_classdef)).code
  return port


def _original_line(port: ClassPort, line: int) -> str | None:
  """The Linen statement starting at file line `line`, as the user wrote it."""
  relative = line - port.source.first_line + 1
  for node in ast.walk(ast.parse(port.source.text)):
    if isinstance(node, ast.stmt) and not hasattr(node, "body") and node.lineno == relative:
      return ast.get_source_segment(port.source.text, node)
  return None


def _binds(node: tp.Any, attr: str) -> bool:
  """Whether `node` assigns `self.attr` anywhere (any target form)."""
  c = libcst()
  found = False

  class Visit(c.CSTVisitor):
    def visit_AssignTarget(self, n: tp.Any) -> None:
      nonlocal found
      found |= any(
        isinstance(t, c.Attribute) and dotted(t.value) == "self" and t.attr.value == attr
        for t in _target_leaves(n.target)
      )

    def visit_AugAssign(self, n: tp.Any) -> None:
      self.visit_AssignTarget(n)

    def visit_AnnAssign(self, n: tp.Any) -> None:
      self.visit_AssignTarget(n)

  node.visit(Visit())
  return found


def _target_leaves(target: tp.Any) -> list[tp.Any]:
  c = libcst()
  if isinstance(target, (c.Tuple, c.List)):
    return [leaf for e in target.elements for leaf in _target_leaves(e.value)]
  return [target]


def _first_binding(init: tp.Any, attr: str) -> tp.Any:
  return next((s for s in init.body.body if _binds(s, attr)), None)


def _param_call(value: tp.Any) -> tp.Any:
  """The one `nnx.Param(...)` call inside `value`, else None."""
  c = libcst()
  calls = [n for n in _walk(value) if isinstance(n, c.Call) and dotted(n.func) == "nnx.Param"]
  return calls[0] if len(calls) == 1 else None


def _walk(node: tp.Any) -> list[tp.Any]:
  out = [node]
  for child in node.children:
    out.extend(_walk(child))
  return out


def _free_names(expr: tp.Any) -> set[str] | None:
  """The plain names `expr` reads (an attribute's name is not one); None where it binds
  names of its own (a lambda, a comprehension), which this does not follow."""
  c = libcst()
  names: set[str] = set()

  def visit(node: tp.Any) -> bool:
    if isinstance(node, (c.Lambda, c.ListComp, c.SetComp, c.DictComp, c.GeneratorExp)):
      return False
    if isinstance(node, c.Name):
      names.add(node.value)
      return True
    if isinstance(node, c.Attribute):
      return visit(node.value)
    return all(visit(child) for child in node.children)

  return names if visit(expr) else None


def _plan(
  init: tp.Any, attr: str, name: str, port: ClassPort, taken: set[str], modern: bool
) -> tuple[list[tp.Any], tp.Any, tp.Any, str] | str:
  """(the lines binding `self.attr`, the Param line kept, the property, its name), or why
  not."""
  c = libcst()
  body = list(init.body.body)
  stmts = [s for s in body if _binds(s, attr)]
  if not stmts or any(self_target(s) != attr for s in stmts):
    return f"setup binds self.{attr} under an `if`, a loop or with other targets"
  nested = [s for s in body if s not in stmts and _binds(s, attr)]
  if nested:
    return f"setup binds self.{attr} under an `if` or a loop too"
  first = stmts[0].body[0].value
  call = _param_call(first)
  if call is None:
    return "the Param is not the first line's"
  readable = set(port.source.namespace) | set(dir(builtins)) | {"self"}
  lines: list[tp.Any] = []
  for i, stmt in enumerate(stmts):
    value = stmt.body[0].value
    if i == 0:
      read = _free_names(value.deep_replace(call, c.Name("self")))
    else:
      read = _free_names(value)
    if read is None or not read <= readable:
      unreadable = sorted(read - readable) if read is not None else ["a lambda or comprehension"]
      return f"its arithmetic reads {', '.join(unreadable)}, which a property cannot read again"
    lines.append(value)
  local = attr
  if any(local in (_free_names(v) or set()) for v in lines):
    return f"its arithmetic reads a global named {local}"
  prop_name = attr if attr != name else f"{attr}_value"
  if prop_name in taken and prop_name != attr:
    return f"the property's name {prop_name} is taken"
  access = f"self.{name}[...]" if modern else f"self.{name}.value"
  computed = [tp.cast(tp.Any, lines[0]).deep_replace(call, c.parse_expression(access))]
  own = c.Attribute(value=c.Name("self"), attr=c.Name(attr))
  for value in lines[1:]:
    computed.append(value.visit(_replacer(own, c.Name(local))))
  property_body: list[tp.Any] = [
    c.SimpleStatementLine(
      [c.Assign(targets=[c.AssignTarget(c.Name(local))], value=v)],
      leading_lines=[c.EmptyLine(comment=c.Comment(COMMENT))] if i == 0 else [],
    )
    for i, v in enumerate(computed)
  ]
  property_body.append(c.SimpleStatementLine([c.Return(c.Name(local))]))
  skeleton = c.parse_statement(f"@property\ndef {prop_name}(self):\n  pass\n")
  prop = skeleton.with_changes(
    body=c.IndentedBlock(body=property_body), leading_lines=[c.EmptyLine(indent=False)]
  )
  kept = c.SimpleStatementLine(
    [c.Assign(targets=[c.AssignTarget(c.parse_expression(f"self.{name}"))], value=call)],
    leading_lines=stmts[0].leading_lines,
  )
  return stmts, kept, prop, prop_name


def _replace_class() -> type:
  c = libcst()

  class Replace(c.CSTTransformer):
    """Every `self.attr` read becomes the local `attr`."""

    def __init__(self, old: tp.Any, new: tp.Any):
      super().__init__()
      self.old, self.new = old, new

    def leave_Attribute(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      if original.deep_equals(self.old):
        return self.new
      return updated

  return Replace


def _replacer(old: tp.Any, new: tp.Any) -> tp.Any:
  return _replace_class()(old, new)


def _edit_class() -> type:
  c = libcst()

  class Edit(c.CSTTransformer):
    """The Param line in place of the first binding, the others dropped, and each read of an
    attribute whose property has another name renamed."""

    def __init__(self, replace: dict[int, tp.Any], renames: dict[str, str]):
      super().__init__()
      self.replace = replace
      self.renames = renames

    def leave_SimpleStatementLine(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      if id(original) in self.replace:
        new = self.replace[id(original)]
        return c.RemoveFromParent() if new is None else new
      return updated

    def leave_Attribute(self, original: tp.Any, updated: tp.Any) -> tp.Any:
      new = self.renames.get(original.attr.value)
      if new is not None and dotted(original.value) == "self":
        return updated.with_changes(attr=c.Name(new))
      return updated

  return Edit


def _editor(replace: dict[int, tp.Any], renames: dict[str, str]) -> tp.Any:
  return _edit_class()(replace, renames)
