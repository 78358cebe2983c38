"""Linen's module API reached through `self` (`self.is_initializing()`, `self.make_rng`,
`self.sow`, ...) as NNX's, and the `not False` / `... and True` those rewrites leave, folded
(each function a `Rewriter` method, bound in its class body)."""

from __future__ import annotations

import typing as tp

from ..plan.source import libcst
from ..transforms import lazy_variables
from .literals import string_literal

# `rewrite_methods.Rewriter`, whose methods these are; typed loosely so this module stays below it.
Rewriter = tp.Any


def bare_make_rng(self: Rewriter, original, updated):
  """`self.make_rng` handed on uncalled (big_vision's `_stoch_depth_mask(x, p, det,
  self.make_rng)`): a function of the stream's name drawing from the module's nnx.Rngs.
  A call `self.make_rng('dropout')` is its site's (`_self_api`)."""
  parent = self.p.parents.get(original)
  if isinstance(parent, libcst().Call) and parent.func is original:
    return updated
  self.p.port.uses_rngs_attr = True
  new = "(lambda name: self.rngs[name]())"
  self.p.change(
    self.p.positions[original].start.line,
    "self.make_rng",
    new,
    "Linen rng streams become the module's nnx.Rngs streams, drawn by name",
  )
  return libcst().parse_expression(new)


def _self_api(self: Rewriter, site, original, updated):
  c = libcst()
  api = site.target
  if api == "is_initializing":
    self.p.change(
      site.lines,
      "self.is_initializing()",
      "False",
      "an NNX module is built in __init__: its calls never initialize",
    )
    return c.parse_expression("False")
  if api == "make_rng":
    stream = string_literal(original.args[0].value) if original.args else "params"
    if stream is None or not stream.isidentifier():
      self._mark("self.make_rng with a stream name that is not a literal identifier")
      return updated
    self.p.port.uses_rngs_attr = True
    self.p.change(
      site.lines,
      self.p.code(original),
      f"self.rngs.{stream}()",
      "Linen rng streams become the module's nnx.Rngs stream",
    )
    return c.parse_expression(f"self.rngs.{stream}()")
  if api == "sow":
    col = string_literal(original.args[0].value) if original.args else None
    if col != "intermediates":
      self._mark(f"self.sow into the collection {col!r} (NNX sows nnx.Intermediate here)")
      return updated
    new = updated.with_changes(
      args=[
        updated.args[0].with_changes(value=c.parse_expression("nnx.Intermediate")),
        *updated.args[1:],
      ]
    )
    self.p.change(
      site.lines,
      self.p.code(original),
      "self.sow(nnx.Intermediate, ...)",
      "Linen's 'intermediates' collection is nnx.Intermediate",
    )
    return new
  if api == "has_variable":
    args = original.args
    pair = (
      (string_literal(args[0].value), string_literal(args[1].value))
      if len(args) == 2 and not any(a.keyword or a.star for a in args)
      else (None, None)
    )
    if pair[1] in self.late and pair in self.declared:
      name = tp.cast(str, pair[1])
      self.p.change(
        site.lines,
        self.p.code(original),
        lazy_variables.presence(name),
        "the variable is an attribute made on first use: present once made",
      )
      return c.parse_expression(lazy_variables.presence(name))
    if pair not in self.declared:
      self._mark(
        "self.has_variable of a variable this class does not declare with a literal "
        "collection and name"
      )
      return updated
    self.p.change(
      site.lines,
      self.p.code(original),
      "True",
      "an NNX module's variables exist once __init__ ran (Linen: not during init)",
    )
    return c.parse_expression("True")
  self._mark(f"self.{api} (Linen module machinery with no drafted NNX idiom)")
  return updated


def leave_UnaryOperation(self: Rewriter, original, updated):
  c = libcst()
  expr = updated.expression
  if isinstance(updated.operator, c.Not) and isinstance(expr, c.Name):  # noqa: SIM102
    # Only `not False` left by the is_initializing rewrite is folded (`not True` too).
    if expr.value in ("False", "True"):
      return c.Name("True" if updated.expression.value == "False" else "False")
  return updated


def leave_BooleanOperation(self: Rewriter, original, updated):
  c = libcst()
  if isinstance(updated.operator, c.And):
    for keep, other in ((updated.left, updated.right), (updated.right, updated.left)):
      if isinstance(other, c.Name) and other.value == "True":
        return keep
  return updated
