"""The package's modules import each other in one direction only (no import cycles).

Every `from . import x` / `from ._x import y` inside src/loopbridge, at module level or inside a
function, is an edge; the graph must have a topological order. The order is the data path
described in src/loopbridge/README.md (discover -> declare -> append -> read).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "loopbridge"


def _imports(path: pathlib.Path) -> set[str]:
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.level == 1:
      if node.module:
        found.add(node.module.split(".")[0])
      else:
        found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("loopbridge."):
      found.add(node.module.split(".")[1])
  return found


def _graph() -> dict[str, set[str]]:
  modules = {p.stem: p for p in PACKAGE.glob("*.py")}
  return {
    name: {m for m in _imports(path) if m in modules and m != name}
    for name, path in modules.items()
  }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        return [*stack[stack.index(nxt) :], nxt]
      if nxt not in state and (found := visit(nxt)):
        return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (found := visit(node)):
      return found
  return None


def test_no_import_cycles():
  cycle = _cycle(_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_check_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize(
  "low,high",
  [
    ("_site", "_observe_linen"),
    ("_observe_linen", "_declare"),
    ("_declare", "_pipeline"),
    ("_pipeline", "_to_nnx"),
    ("_buffers", "_records"),
    ("_recorder", "_records"),
  ],
)
def test_stages_point_downward(low, high):
  graph = _graph()
  assert high not in _reachable(graph, low), f"{low} (a lower stage) reaches {high}"


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
  seen: set[str] = set()
  todo = list(graph[start])
  while todo:
    node = todo.pop()
    if node not in seen:
      seen.add(node)
      todo.extend(graph[node])
  return seen


# Imports every public namespace, then checks that no backend was started: flax's docs and
# tests set `jax_num_cpu_devices` after their imports, which jax refuses once a backend exists.
_IMPORT_STARTS_NO_BACKEND = """
import jax
from jax._src import xla_bridge
import loopbridge, loopbridge.layers, loopbridge.checkpoint, loopbridge.sharding
import loopbridge._cli
assert not xla_bridge._backends, sorted(xla_bridge._backends)
jax.config.update("jax_num_cpu_devices", 2)
assert len(jax.devices()) == 2, jax.devices()
"""


@pytest.mark.slow
def test_import_starts_no_backend():
  import os
  import subprocess
  import sys

  # A fresh interpreter (this one has a backend already); no forced device count from outside.
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), env.get("PYTHONPATH", "")])
  done = subprocess.run(
    [sys.executable, "-c", _IMPORT_STARTS_NO_BACKEND], env=env, capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr[-2000:]
