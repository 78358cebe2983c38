"""Layers `setup` builds in a list comprehension over anything but `range` (`self.layers =
[nn.Dense(size) for size in self.hidden_dims]`, an RL codebase's MLP) are read as the loop that
builds the same list:

    layers = []
    for size in self.hidden_dims:
      layers.append(nn.Dense(size))
    self.layers = layers

A comprehension cannot name the layer before the one it builds, and each layer's input width is
that layer's output: the loop can (`layers[-1].out_features`, `setup_lists.py`), and Linen
names and builds the layers alike. Only a comprehension whose element is a call with no
`name=`, with one `for` and no `if`, assigned alone in `setup`'s own body; one over
`range(...)` is left as written (`setup_lists.py` reads it by its index).

Hook: `source.read_class`. The text gains lines; `ClassSource.line` maps each back to the
comprehension's (the report names the lines of the file).
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

from ..plan.class_source import ClassSource, dotted, libcst


def _rewritable(statement: tp.Any) -> tuple[tp.Any, tp.Any] | None:
  """(target, comprehension) of `target = [call for x in iterable]`, else None."""
  c = libcst()
  if not isinstance(statement, c.SimpleStatementLine) or len(statement.body) != 1:
    return None
  assign = statement.body[0]
  if not isinstance(assign, c.Assign) or len(assign.targets) != 1:
    return None
  comp = assign.value
  target = assign.targets[0].target
  if not isinstance(comp, c.ListComp) or not isinstance(comp.elt, c.Call):
    return None
  if any(a.keyword is not None and a.keyword.value == "name" for a in comp.elt.args):
    return None  # layers named by the loop: `setup_lists.py` pairs them by name, or says why not
  loop = comp.for_in
  if loop.inner_for_in is not None or loop.ifs or loop.asynchronous is not None:
    return None
  over = loop.iter.func if isinstance(loop.iter, c.Call) else loop.iter
  if dotted(over) == "range":
    return None
  named = isinstance(target, c.Name) or (
    isinstance(target, c.Attribute) and dotted(target.value) == "self"
  )
  return (target, comp) if named else None


def _local(target: tp.Any, text: str) -> str:
  """The local list's name: the target's own, or the attribute's where no name of the class
  has it, else that with a trailing underscore until none has it."""
  c = libcst()
  if isinstance(target, c.Name):
    return target.value
  name = target.attr.value
  while re.search(rf"\b{re.escape(name)}\b", text.replace(f"self.{target.attr.value}", "")):
    name += "_"
  return name


def comprehension_loops(src: ClassSource) -> ClassSource:
  """`src` with each such comprehension in `setup` written as its loop (itself where none)."""
  if "def setup" not in src.text or " for " not in src.text:
    return src
  c = libcst()
  wrapper = c.MetadataWrapper(src.tree())
  positions = wrapper.resolve(c.metadata.PositionProvider)
  module = wrapper.module
  code = module.code_for_node
  # (first line, last line, replacement lines) of each comprehension, top to bottom.
  found: list[tuple[int, int, list[str]]] = []
  for cls in (s for s in module.body if isinstance(s, c.ClassDef)):
    for fn in (s for s in cls.body.body if isinstance(s, c.FunctionDef)):
      if fn.name.value != "setup" or not isinstance(fn.body, c.IndentedBlock):
        continue
      for statement in fn.body.body:
        got = _rewritable(statement)
        if got is None:
          continue
        target, comp = got
        where = positions[statement]
        indent = " " * where.start.column
        step = " " * max(2, len(module.default_indent))
        local = _local(target, src.text)
        loop = comp.for_in
        lines = [
          f"{indent}{local} = []",
          f"{indent}for {code(loop.target)} in {code(loop.iter)}:",
          f"{indent}{step}{local}.append({code(comp.elt)})",
        ]
        if not isinstance(target, c.Name):
          lines.append(f"{indent}{code(target)} = {local}")
        found.append((where.start.line, where.end.line, lines))
  if not found:
    return src
  old = src.text.splitlines(keepends=True)
  new: list[str] = []
  origin: list[int] = []  # the old relative line of each new one
  at = 1
  for first, last, lines in found:
    new += old[at - 1 : first - 1]
    origin += list(range(at, first))
    new += [f"{line}\n" for line in lines]
    origin += [first] * len(lines)
    at = last + 1
  new += old[at - 1 :]
  origin += list(range(at, len(old) + 1))
  before = src.line_origin
  if before is not None:  # already rewritten: map through the earlier rewrite too
    origin = [before[o - 1] for o in origin]
  return dataclasses.replace(src, text="".join(new), line_origin=tuple(origin))
