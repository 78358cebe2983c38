"""A drafted class's source parsed back: its module, its class and its `__init__`.

Steps that rework a drafted class after the rewrite (`computed_params`, `transforms/module_name`)
start from the same three nodes.
"""

from __future__ import annotations

import typing as tp

from .class_source import libcst


def class_and_init(code: str) -> tuple[tp.Any, tp.Any, tp.Any]:
  """(module, its first class, that class's `__init__` or None) of the drafted `code`."""
  c = libcst()
  module = c.parse_module(code)
  classdef = next(s for s in module.body if isinstance(s, c.ClassDef))
  init = next(
    (s for s in classdef.body.body if isinstance(s, c.FunctionDef) and s.name.value == "__init__"),
    None,
  )
  return module, classdef, init
