"""A user's Linen class that writes its own call over another user class's fields (a variant of
a block: `class BottleneckBlock(Block)` with its own `__call__`, inheriting `filters`, `norm`).

Linen runs the subclass's methods with every field of the base. The draft reads such a class
as one class: the base's fields and the methods it does not override, then the subclass's own
body, under the base's bases (`nn.Module`), so its port is a whole NNX class that needs no
Linen base. The base's statements are put above the subclass's lines (the source's first line
moved up by as many), so the subclass's own lines keep the numbers the trace gave its calls.

Only where the subclass writes every method the base builds layers in (`setup`, `__call__`,
any `@nn.compact` one) and calls none through `super()`: an inherited method that builds layers
would sit at other lines than the trace saw, and pairs with nothing (the subclass stays one
TODO, `user_base_class`).

Hook: `source.read_class`.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
import typing as tp

from flax import linen as nn

from ..plan.class_source import ClassSource, libcst
from .field_only_subclass import docstring_end, field_name, single_user_base


def _method_name(stmt: tp.Any) -> str | None:
  c = libcst()
  return stmt.name.value if isinstance(stmt, c.FunctionDef) else None


def _last_name(node: tp.Any) -> str | None:
  """`compact` of `nn.compact` or `compact` (read here, not through `plan.source`, which reads
  this module)."""
  c = libcst()
  if isinstance(node, c.Attribute):
    return node.attr.value
  return node.value if isinstance(node, c.Name) else None


def _builds(stmt: tp.Any) -> bool:
  """A method Linen builds layers in: `setup`, `__call__`, or one under `@nn.compact`."""
  c = libcst()
  if not isinstance(stmt, c.FunctionDef):
    return False
  compact = any(_last_name(d.decorator) == "compact" for d in stmt.decorators)
  return compact or stmt.name.value in ("setup", "__call__")


def inherited_source(cls: type, read: tp.Callable[[type], ClassSource]) -> ClassSource | None:
  """The source `cls` runs as one class (its base's fields and methods, then its own body),
  or None where `cls` is not such a subclass of one user Linen class."""
  base = single_user_base(cls)
  if base is None:
    return None
  try:
    lines, first = inspect.getsourcelines(cls)
    file = inspect.getsourcefile(cls) or "<unknown>"
  except (OSError, TypeError):
    return None
  c = libcst()
  try:
    own_tree = c.parse_module(textwrap.dedent("".join(lines)))
  except c.ParserSyntaxError:
    return None
  own: tp.Any = own_tree.body[0]
  if not isinstance(own, c.ClassDef) or own.decorators:
    return None
  base_source = read(base)
  base_def: tp.Any = base_source.tree().body[0]
  if not isinstance(base_def, c.ClassDef):
    return None
  if "super(" in own_tree.code:
    return None  # it runs the base's methods too: they would sit at other lines than traced
  mine = list(own.body.body)
  own_fields = {n for s in mine if (n := field_name(s)) is not None}
  own_methods = {n for s in mine if (n := _method_name(s)) is not None}
  if not own_methods:
    return None  # fields only: `field_only_subclass`'s
  theirs = list(base_def.body.body)
  del theirs[: docstring_end(theirs)]
  if own_fields & {n for s in theirs if (n := field_name(s)) is not None}:
    # A field the subclass redefines keeps the base's place in Linen's dataclass (the order
    # of its constructor's arguments), which the subclass's lines cannot give it.
    return None
  kept: list[tp.Any] = []
  for stmt in theirs:
    name = field_name(stmt) or _method_name(stmt)
    if name is None:
      return None  # an assignment or a nested class of the base: not read as fields
    if name in own_methods:
      continue
    if _builds(stmt):
      return None  # an inherited method that builds layers: its lines would not pair
    kept.append(stmt)
  inserted = c.Module(body=kept).code if kept else ""
  height = inserted.count("\n")
  at = docstring_end(mine)
  body = [*mine[:at], *kept, *mine[at:]]
  classdef = own.with_changes(
    bases=base_def.bases,
    body=own.body.with_changes(body=body),
    lpar=base_def.lpar,
    rpar=base_def.rpar,
  )
  text = own_tree.with_changes(body=[classdef, *own_tree.body[1:]]).code
  module = sys.modules.get(cls.__module__)
  namespace = {**base_source.namespace, **(dict(vars(module)) if module is not None else {})}
  # The subclass's lines keep their numbers: the inserted ones sit above its first line.
  return ClassSource(cls, text, file, first - height, namespace, merged=True)


def homes(src: ClassSource) -> list[tuple[str, tp.Mapping[str, object]]]:
  """Where the port's imports of `src`'s names come from: its class's module, then, for a class
  read with its bases, each base's module (a name only the base's module binds is imported from
  there, not from the subclass's)."""
  cls = src.cls
  if not src.merged:
    return [(cls.__module__, src.namespace)]
  out: list[tuple[str, tp.Mapping[str, object]]] = []
  for klass in cls.__mro__:
    module = sys.modules.get(klass.__module__)
    if not issubclass(klass, nn.Module) or klass.__module__.startswith("flax.") or module is None:
      continue
    if all(home != klass.__module__ for home, _ in out):
      out.append((klass.__module__, vars(module)))
  return [*out, (cls.__module__, src.namespace)]
