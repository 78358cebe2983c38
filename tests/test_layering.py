"""The package's layering: a recording core and wings around it, with no import cycle.

Every relative import inside src/loopbridge (at module level or inside a function) is an edge
between modules named by their dotted path below the package (`_core.recorder`,
`_loops.compile_step`, `_compat`). The graph must have a topological order, the recording core
(`_core`) must import no wing, and within the core the stages point downward, in the order of
the data path described in src/loopbridge/README.md (discover -> declare -> append -> read).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from conftest import child_env

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "loopbridge"
WINGS = ("_loops", "_layers", "_diagnostics", "_checkpoint", "_sharding", "_cli", "_port")


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: pathlib.Path) -> list[str]:
  parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
  return parts[:-1]


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
  """Modules of the package that `path` imports (a package import counts as its `__init__`)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if not isinstance(node, ast.ImportFrom):
      continue
    if node.level:
      base = _package_of(path)[: len(_package_of(path)) - (node.level - 1)]
    elif node.module and node.module.startswith("loopbridge."):
      base = []
    else:
      continue
    module = (
      node.module.removeprefix("loopbridge.") if not node.level and node.module else node.module
    )
    target = base + (module.split(".") if module else [])
    for alias in node.names:
      as_module = ".".join([*target, alias.name])
      found.add(as_module if as_module in modules else ".".join(target))
  return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
  paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
  names = set(paths)
  return {name: {m for m in _imports(path, names) if m != name} for name, path in paths.items()}


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


def test_the_graph_sees_every_kind_of_import():
  graph = _graph()
  assert "_core.recorder" in graph["_core.declare"]  # from . import recorder
  assert "_core.errors" in graph["_core.buffers"]  # from .errors import ...
  assert "_core.to_nnx" in graph[""]  # from ._core.to_nnx import ToNNX
  assert "_compat" in graph["_core.buffers"]  # from .. import _compat


def test_the_core_imports_no_wing():
  graph = _graph()
  for name, imported in graph.items():
    if name.startswith("_core"):
      wings = sorted(m for m in imported if m.split(".")[0] in WINGS)
      assert not wings, f"the recording core module {name} imports wing modules {wings}"


def test_every_module_is_in_the_core_a_wing_or_the_public_front():
  front = {"", "__main__", "_compat", "checkpoint", "layers", "port", "sharding"}
  for name in _graph():
    assert name in front or name.split(".")[0] in ("_core", "_compat", *WINGS), name


def _version_reads(source: str) -> list[str]:
  """What in `source` depends on a flax/jax version: a jax internal imported, a `__version__`."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jax._src"):
      found.append(f"line {node.lineno}: from {node.module} import ...")
    elif isinstance(node, ast.Import):
      found += [
        f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith("jax._src")
      ]
    elif isinstance(node, ast.Attribute) and node.attr == "__version__":
      found.append(f"line {node.lineno}: reads .__version__")
  return found


def test_every_version_difference_is_in_compat():
  # _compat says it holds every difference between the supported versions; a jax internal
  # or a version number read anywhere else is a difference it does not know of.
  for path in sorted(PACKAGE.rglob("*.py")):
    if path.relative_to(PACKAGE).parts[0] != "_compat":
      found = _version_reads(path.read_text())
      assert not found, f"{path.relative_to(PACKAGE)}: {found}; move it into _compat"


def test_the_version_check_finds_internals_and_version_numbers():
  assert _version_reads("from jax._src.interpreters import batching") != []
  assert _version_reads("import jax._src.core") != []
  assert _version_reads("import flax\nif flax.__version__ < '0.11': pass") != []
  assert _version_reads("__version__ = '1.0'\nimport jax.numpy") == []


def test_explain_recognises_lb_to_nnx_without_importing_it():
  # One predicate recognises an lb.ToNNX (_core.bridge_settings); diagnostics need no class.
  assert "_core.to_nnx" not in _reachable(_graph(), "_diagnostics.explain")
  assert "_core.to_nnx" not in _reachable(_graph(), "_core.bridge_settings")


@pytest.mark.parametrize(
  "low,high",
  [
    ("_core.capacity", "_core.site"),
    ("_core.site", "_core.observe_linen"),
    ("_core.bridge_settings", "_core.pipeline"),
    ("_core.call_target", "_core.pipeline"),
    ("_core.observe_linen", "_core.declare"),
    ("_core.declare", "_core.pipeline"),
    ("_core.pipeline", "_core.to_nnx"),
    ("_core.declare", "_core.discovered_parts"),
    ("_core.discovered_parts", "_core.entry_common"),
    ("_core.entry_common", "_core.entry_preallocate"),
    ("_core.entry_common", "_core.pipeline"),
    ("_core.entry_preallocate", "_core.to_nnx"),
    ("_core.entry_linen_variables", "_core.to_nnx"),
    ("_core.pipeline", "_core.to_nnx_records"),
    ("_core.pipeline", "_core.to_nnx_discovery"),
    ("_core.pipeline", "_core.to_nnx_arguments"),
    ("_core.buffers", "_core.readback"),
    ("_core.recorder", "_core.readback"),
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
# The CPU devices are counted (on a GPU machine `jax.devices()` lists the GPUs); jax's private
# backend table only names what started, where this jax still has it.
_IMPORT_STARTS_NO_BACKEND = """
import jax
import loopbridge, loopbridge.layers, loopbridge.checkpoint, loopbridge.sharding
import loopbridge._cli.main
try:
  from jax._src import xla_bridge
except ImportError:
  xla_bridge = None
started = getattr(xla_bridge, "_backends", None)
assert not started, sorted(started)
jax.config.update("jax_num_cpu_devices", 2)
assert len(jax.devices("cpu")) == 2, jax.devices("cpu")
"""


@pytest.mark.slow
def test_import_starts_no_backend():
  import subprocess
  import sys

  # A fresh interpreter (this one has a backend already); no forced device count from outside.
  env = child_env(str(PACKAGE.parent), drop=("XLA_FLAGS",))
  done = subprocess.run(
    [sys.executable, "-c", _IMPORT_STARTS_NO_BACKEND], env=env, capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr[-2000:]
