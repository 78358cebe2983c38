"""`self.name` read by a Linen class: its port keeps a `name` attribute with Linen's name.

Linen gives every module a name (the `name=` its parent passed, or `Dense_0`); code may read it
(`if self.name.startswith("enc")`). An NNX module has none, so the port of such a class takes
a keyword argument `name` and keeps it; each parent passes the name Linen gave that submodule
(an argument the draft adds, whose value per instance the trace gives: `values.Extra`).
"""

from __future__ import annotations

import ast
import typing as tp

from ..port_tree import class_and_init
from ..source import libcst
from ..values import Extra

if tp.TYPE_CHECKING:
  from ..rewrite_class import ClassPort


def _reads_own_name(code: str) -> bool:
  return any(
    isinstance(n, ast.Attribute)
    and n.attr == "name"
    and isinstance(n.ctx, ast.Load)
    and isinstance(n.value, ast.Name)
    and n.value.id == "self"
    for n in ast.walk(ast.parse(code))
  )


def keep_name(port: ClassPort) -> ClassPort:
  """`port` taking and keeping Linen's name when its code reads `self.name`; else unchanged."""
  resolver = port.resolver
  if resolver is None or "name" in resolver.extras or not _reads_own_name(port.code):
    return port
  c = libcst()
  module, classdef, init = class_and_init(port.code)
  if init is None:
    return port
  param = c.Param(
    c.Name("name"),
    annotation=c.Annotation(c.parse_expression("str | None")),
    default=c.Name("None"),
  )
  # Before `rngs`, the last keyword-only argument every port takes.
  kwonly = [*init.params.kwonly_params[:-1], param, *init.params.kwonly_params[-1:]]
  keep = c.parse_statement("self.name = name  # the name Linen gave this module\n")
  init = init.with_changes(
    params=init.params.with_changes(kwonly_params=kwonly),
    body=init.body.with_changes(body=[keep, *init.body.body]),
  )
  body = [init if s is _init_of(classdef) else s for s in classdef.body.body]
  classdef = classdef.with_changes(body=classdef.body.with_changes(body=body))
  port.code = module.with_changes(
    body=[classdef if s is _class_of(module) else s for s in module.body]
  ).code
  # Each instance's Linen name, in the user's trace and in every derived configuration's.
  resolver.extras["name"] = Extra(
    "name",
    {i.path: i.module.name for i in resolver.instances},
    [{p: i.module.name for p, i in alts.items()} for alts in resolver.alts],
  )
  return port


def _class_of(module: tp.Any) -> tp.Any:
  return next(s for s in module.body if isinstance(s, libcst().ClassDef))


def _init_of(classdef: tp.Any) -> tp.Any:
  c = libcst()
  return next(
    s for s in classdef.body.body if isinstance(s, c.FunctionDef) and s.name.value == "__init__"
  )
