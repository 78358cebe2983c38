"""A user's Linen class that only changes fields of another user class (a variant of a block:
`class WideBlock(Block): features: int = 8`).

Linen runs the base's methods with the subclass's field values. The draft reads such a class as
the base's source with the subclass's name and field statements, so its
port is a whole NNX class whose constructions take their widths from the subclass's own
instances, never the base's, and whose port needs no Linen base class.

Hook: `source.read_class`.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import textwrap
import typing as tp

from flax import linen as nn

from ..plan.class_source import ClassSource, libcst


def single_user_base(cls: type) -> type | None:
  """The one base of `cls`, where it is a user-written Linen class (not flax's), else None."""
  bases = [b for b in cls.__bases__ if b is not object]
  if len(bases) != 1 or not issubclass(cls, nn.Module):
    return None
  base = bases[0]
  if base is nn.Module or not issubclass(base, nn.Module) or base.__module__.startswith("flax."):
    return None
  return base


def merged_source(cls: type, read: tp.Callable[[type], ClassSource]) -> ClassSource | None:
  """The source `cls` runs (its base's, with its own fields), or None where `cls` is not a
  field-only subclass of one user Linen class."""
  base = single_user_base(cls)
  if base is None:
    return None
  try:
    lines, _ = inspect.getsourcelines(cls)
  except (OSError, TypeError):
    return None
  c = libcst()
  try:
    own = c.parse_module(textwrap.dedent("".join(lines))).body[0]
  except c.ParserSyntaxError:
    return None
  if not isinstance(own, c.ClassDef) or own.decorators:
    return None
  fields = _fields(own)
  if fields is None:
    return None
  base_source = read(base)
  tree = base_source.tree()
  classdef: tp.Any = tree.body[0]
  if not isinstance(classdef, c.ClassDef):
    return None
  body: list[tp.Any] = list(classdef.body.body)
  by_name = {field_name(s): k for k, s in enumerate(body) if field_name(s) is not None}
  for name, stmt in fields.items():
    at = by_name.get(name)
    # The base's lines keep their numbers (the trace names the lines that built submodules):
    # a field the base lacks, or a statement of another height, is not merged.
    if at is None or _height(stmt) != _height(body[at]):
      return None
    body[at] = stmt.with_changes(leading_lines=body[at].leading_lines)
  body = _own_docstring(own, body)
  classdef = classdef.with_changes(
    name=c.Name(cls.__name__), body=classdef.body.with_changes(body=body)
  )
  text = tree.with_changes(body=[classdef, *tree.body[1:]]).code
  module = sys.modules.get(cls.__module__)
  namespace = {**(dict(vars(module)) if module is not None else {}), **base_source.namespace}
  return dataclasses.replace(base_source, cls=cls, text=text, namespace=namespace, merged=True)


def field_name(stmt: tp.Any) -> str | None:
  c = libcst()
  if isinstance(stmt, c.SimpleStatementLine) and len(stmt.body) == 1:
    small = stmt.body[0]
    if isinstance(small, c.AnnAssign) and isinstance(small.target, c.Name):
      return small.target.value
  return None


def docstring_end(body: list[tp.Any]) -> int:
  """1 where the body opens with a docstring, else 0."""
  c = libcst()
  first: tp.Any = body[0] if body else None
  if isinstance(first, c.SimpleStatementLine) and isinstance(first.body[0], c.Expr):
    return int(isinstance(first.body[0].value, (c.SimpleString, c.ConcatenatedString)))
  return 0


def _height(stmt: tp.Any) -> int:
  return libcst().Module(body=[stmt.with_changes(leading_lines=[])]).code.count("\n")


def _fields(classdef: tp.Any) -> dict[str, tp.Any] | None:
  """The class's field statements by name; None where the body holds anything else than a
  docstring and fields (a method, an assignment, a nested class)."""
  c = libcst()
  body = list(classdef.body.body)
  del body[: docstring_end(body)]
  fields: dict[str, tp.Any] = {}
  for stmt in body:
    name = field_name(stmt)
    if name is not None:
      fields[name] = stmt
    elif not (
      isinstance(stmt, c.SimpleStatementLine) and all(isinstance(s, c.Pass) for s in stmt.body)
    ):
      return None
  return fields


def _own_docstring(own: tp.Any, body: list[tp.Any]) -> list[tp.Any]:
  """The base's body with the subclass's docstring where it fits in the base's lines (blank
  lines fill the rest), else with the base's."""
  c = libcst()
  mine = list(own.body.body)
  if not docstring_end(mine) or not docstring_end(body) or len(body) < 2:
    return body
  spare = _height(body[0]) - _height(mine[0])
  if spare < 0:
    return body
  after = body[1].with_changes(
    leading_lines=[*(c.EmptyLine() for _ in range(spare)), *body[1].leading_lines]
  )
  return [mine[0].with_changes(leading_lines=body[0].leading_lines), after, *body[2:]]
