"""A module-level setting the Linen code reads is read through its module in the port.

`from mymodels import SCALE` copies the value once, when the port is imported; Linen's method
reads `SCALE` from its module's globals at every call, so a setting rebound after import (a
config applied at startup, `mymodels.SCALE = 5.0`) changes Linen and not such a port. The
port imports the module and reads `mymodels.SCALE` instead. Classes, functions and modules
stay imported by name (rebinding those is not a setting).
"""

from __future__ import annotations

import ast
import sys
import types
import typing as tp


def _is_setting(value: object) -> bool:
  """Plain data a module binds (a number, string, tuple, dict, config object): not a class,
  function or module, which are imported by name."""
  return not isinstance(value, (type, types.ModuleType)) and not callable(value)


def _home_of(name: str, namespaces: tp.Sequence[tuple[str, tp.Mapping[str, object]]]):
  for home, ns in namespaces:
    if name in ns:
      return home, ns[name]
  return None


def read_through_modules(
  code: str, namespaces: tp.Sequence[tuple[str, tp.Mapping[str, object]]]
) -> tuple[str, list[str]]:
  """`code` with each free read of a module's setting spelled `module.NAME`, and the
  `import module` lines that adds. A setting of `__main__`, or of a module whose top-level
  name the code binds itself, stays as it is (imported by value)."""
  tree = ast.parse(code)
  bound: set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
      bound.add(node.id)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      bound.add(node.name)
    elif isinstance(node, ast.arg):
      bound.add(node.arg)
  reads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
  free = {n.id for n in reads} - bound
  spelled: dict[str, str] = {}
  for name in free:
    found = _home_of(name, namespaces)
    if found is None or not _is_setting(found[1]):
      continue
    home = found[0]
    module = sys.modules.get(home)
    top = home.split(".")[0]
    if home == "__main__" or module is None or top in bound or top in free:
      continue
    if getattr(module, name, None) is not found[1]:
      continue  # the class's globals are not this module's attributes
    spelled[name] = home
  if not spelled:
    return code, []
  lines = code.splitlines(keepends=True)
  encoded = [ln.encode() for ln in lines]
  # From the end, so earlier offsets stay valid (ast columns are UTF-8 byte offsets).
  for node in sorted(
    (n for n in reads if n.id in spelled), key=lambda n: (n.lineno, n.col_offset), reverse=True
  ):
    row = encoded[node.lineno - 1]
    end = node.col_offset + len(node.id.encode())
    encoded[node.lineno - 1] = (
      row[: node.col_offset] + f"{spelled[node.id]}.{node.id}".encode() + row[end:]
    )
  rewritten = "".join(b.decode() for b in encoded)
  return rewritten, sorted({f"import {home}" for home in spelled.values()})
