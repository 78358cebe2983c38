"""What a fresh install with no extras needs: the runtime dependencies only.

`pip install -e .` brings jax, flax, numpy and typing-extensions (and what flax itself needs).
The optional dependencies (libcst for drafting, matplotlib for plots, orbax and optax for
checkpoints, hypothesis and sybil for tests) are imported only by the code that uses them, so
`import loopbridge` and every command but `port` work without them. `.ci/run` runs the README's
first command on a fresh install; the check below keeps the two the same text.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
OPTIONAL = ("libcst", "matplotlib", "orbax", "optax", "hypothesis", "sybil")

# Imports what loopbridge needs anyway (flax.nnx imports optax itself), then watches every
# import of an optional dependency not loaded yet while the package and each of its modules
# are imported, naming the package's line that asked for it.
_IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
import jax, numpy, flax.linen, flax.nnx

OPTIONAL = {optional!r}
culprits = {{}}

class Watch:
  def find_spec(self, name, path=None, target=None):
    top = name.split(".")[0]
    if top in OPTIONAL and top not in culprits:
      # The innermost module body of the package running: the import-time code that asked.
      frame = sys._getframe(1)
      while frame and not (
        frame.f_code.co_name == "<module>"
        and frame.f_globals.get("__name__", "").startswith("loopbridge")
      ):
        frame = frame.f_back
      culprits[top] = f"{{frame.f_globals['__name__']}}:{{frame.f_lineno}}" if frame else "?"
    return None

sys.meta_path.insert(0, Watch())
package = importlib.import_module("loopbridge")
for found in pkgutil.walk_packages(package.__path__, "loopbridge."):
  importlib.import_module(found.name)
for name, where in sorted(culprits.items()):
  print(f"{{where}} imports {{name}} at import time")
"""


def test_no_module_imports_an_optional_dependency_at_import_time():
  # A fresh interpreter: this one has imported libcst, orbax and the others already. No TPU or
  # GPU for the child (one process holds the chip).
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
  script = _IMPORT_EVERY_MODULE.format(optional=OPTIONAL)
  done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout == "", done.stdout


def _bash_blocks(text: str) -> list[str]:
  return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_two_commands_as_written():
  first, second = _bash_blocks((ROOT / "README.md").read_text())[:2]
  assert "pip install" in first and "[" not in first, f"not the no-extras install: {first}"
  # The README's counts come from this run: every extra a test needs is installed.
  assert "'.[test,plot,lint]'" in second and "pytest" in second, second
  ci = (ROOT / ".ci" / "run").read_text()
  commands = [line.strip() for line in ci.splitlines()]
  for command in (first, second):
    assert command in commands, f".ci/run does not run the README's command as written: {command}"
