"""One importable file from the ported classes: imports of what they read, then the classes.

Formatting uses ruff when it is installed (optional): `ruff check --fix` for the import block
and `ruff format`, with the configuration ruff finds for the file's location, so the draft
matches the house style of the project it is written into.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import pathlib
import shutil
import subprocess
import sys
import types
import typing as tp


def _bound_names(tree: ast.AST) -> set[str]:
  bound: set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
      bound.add(node.id)
    elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
      bound.add(node.name)
    elif isinstance(node, ast.arg):
      bound.add(node.arg)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      bound.update((a.asname or a.name).split(".")[0] for a in node.names)
  return bound


def _import_line(name: str, value: object, home: str) -> str:
  if isinstance(value, types.ModuleType):
    full = value.__name__
    if full == name:
      return f"import {name}"
    parent, _, last = full.rpartition(".")
    if parent and last == name:
      return f"from {parent} import {name}"
    return f"import {full} as {name}"
  origin = getattr(value, "__module__", None)
  if isinstance(origin, str) and origin != "__main__":
    try:
      if getattr(importlib.import_module(origin), name, None) is value:
        return f"from {origin} import {name}"
    except ImportError:
      pass
  return f"from {home} import {name}"


def imports(code: str, namespaces: tp.Sequence[tuple[str, tp.Mapping[str, object]]]) -> list[str]:
  """The import lines for every free name `code` reads (from the user's modules' globals)."""
  tree = ast.parse(code)
  bound = _bound_names(tree)
  free = sorted(
    {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    - bound
  )
  lines = ["from flax import nnx"]
  for name in free:
    if name == "nnx" or hasattr(builtins, name):
      continue
    for home, ns in namespaces:
      if name in ns:
        lines.append(_import_line(name, ns[name], home))
        break
  return sorted(set(lines))


def _ruff() -> list[str] | None:
  found = shutil.which("ruff")
  if found:
    return [found]
  beside = pathlib.Path(sys.executable).parent / "ruff"
  return [str(beside)] if beside.exists() else None


def format_source(code: str, as_path: str) -> str:
  """`code` sorted and formatted by ruff as the file `as_path` would be (as is without ruff)."""
  ruff = _ruff()
  if ruff is None:
    return code
  for args in (
    ["check", "--fix-only", "--select", "I,F401", "--quiet"],
    ["format", "--quiet"],
  ):
    done = subprocess.run(
      [*ruff, *args, "--stdin-filename", as_path, "-"],
      input=code,
      capture_output=True,
      text=True,
      check=False,
    )
    if done.returncode == 0 and done.stdout:
      code = done.stdout
  return code
