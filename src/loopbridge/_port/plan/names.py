"""Which names an expression reads, and whether `__init__` can evaluate it."""

from __future__ import annotations

import builtins
import typing as tp

from .source import libcst

if tp.TYPE_CHECKING:
  import libcst as cst


def names_in(node: cst.CSTNode) -> set[str]:
  """The free names an expression reads (attribute names after a dot excluded)."""
  c = libcst()
  found: set[str] = set()

  class V(c.CSTVisitor):
    def visit_Attribute(self, node: cst.Attribute) -> bool:
      node.value.visit(self)
      return False

    def visit_Name(self, node: cst.Name) -> None:
      found.add(node.value)

    def visit_Arg(self, node: cst.Arg) -> bool:
      node.value.visit(self)
      return False

  node.visit(V())
  return found


def available(node: cst.CSTNode, namespace: tp.Mapping[str, object], extra: set[str]) -> bool:
  """Whether an expression can be evaluated in `__init__` (fields, globals, loop targets)."""
  return all(
    n == "self" or n in namespace or hasattr(builtins, n) or n in extra for n in names_in(node)
  )


def loop_targets(loop: cst.For | None) -> set[str]:
  return names_in(loop.target) if loop is not None else set()


def bound_in_methods(classdef: cst.ClassDef) -> set[str]:
  """Every name a method of the class binds (parameters, assignment, loop and `with` targets).

  Such a name read in a construction is the method's own (`nn.Dense(x.shape[-1])` reads the
  call's `x`), even when the module has a global of that name: `__init__` cannot read it.
  """
  c = libcst()
  found: set[str] = set()

  class V(c.CSTVisitor):
    def visit_Param(self, node: cst.Param) -> None:
      found.add(node.name.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
      found.update(names_in(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
      found.update(names_in(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
      found.update(names_in(node.target))

    def visit_For(self, node: cst.For) -> None:
      found.update(names_in(node.target))

    def visit_CompFor(self, node: cst.CompFor) -> None:
      found.update(names_in(node.target))

    def visit_AsName(self, node: cst.AsName) -> None:
      found.update(names_in(node.name))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
      found.update(names_in(node.target))

  for stmt in classdef.body.body:
    if isinstance(stmt, c.FunctionDef):
      stmt.visit(V())
  found.discard("self")
  return found


def assignment_counts(fn: tp.Any) -> dict[str, int]:
  """How often each local of a function is bound (a loop target or `+=` counts as many)."""
  c = libcst()
  counts: dict[str, int] = {}

  def bump(target: tp.Any, by: int) -> None:
    for n in names_in(target):
      counts[n] = counts.get(n, 0) + by

  class Targets(c.CSTVisitor):
    def visit_AssignTarget(self, node: tp.Any) -> None:
      bump(node.target, 1)

    def visit_AugAssign(self, node: tp.Any) -> None:
      bump(node.target, 2)

    def visit_For(self, node: tp.Any) -> None:
      bump(node.target, 2)

  fn.visit(Targets())
  return counts


def inline_aliases(node: cst.BaseExpression, aliases: tp.Mapping[str, str]) -> cst.BaseExpression:
  """`node` with each alias name (a method's local `__init__` can compute) replaced by its
  code, parenthesized, until none is left: the expression stands alone in `__init__`, before
  or without the alias lines."""
  c = libcst()

  class Inline(c.CSTTransformer):
    def __init__(self) -> None:
      super().__init__()
      self.not_reads: set[int] = set()  # `a.b`'s `b` and `f(b=...)`'s `b` are no reads

    def visit_Attribute(self, node: cst.Attribute) -> None:
      self.not_reads.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
      if node.keyword is not None:
        self.not_reads.add(id(node.keyword))

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
      code = aliases.get(original.value)
      if code is None or id(original) in self.not_reads:
        return updated
      return c.parse_expression(f"({code})")

  for _ in range(len(aliases) + 1):  # an alias may read an earlier one
    whole: str = tp.cast(tp.Any, node).value if isinstance(node, c.Name) else ""
    if whole in aliases:  # the whole expression is one alias: no parentheses
      node = c.parse_expression(aliases[whole])
      continue
    if not (names_in(node) & set(aliases)):
      return node
    node = tp.cast("cst.BaseExpression", node.visit(Inline()))
  return node
