"""Every `examples/*.py` runs as a user would run it, and the README quickstart block runs too.

Each script runs in a fresh interpreter (`sys.executable`, so the environment under test) and must
exit with 0 and print its key result line. A script not listed in KEY_LINES must still exit with 0
and print something; list it here so its result is checked, not just its exit code.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# The line of output that says the example did what it claims (a substring of one stdout line).
KEY_LINES = {
    "seed_000_sow_in_while_loop.py": "last step, last layer carry equals the loop output: True",
    "seed_001_two_models_fori_loop.py": "returned the caller's models: True",
    "seed_002_layer_stacks.py": "fori_loop forward == Python-loop forward (bit-exact)",
    "decoding_with_cache.py": "matches step-by-step Linen: True",
}


def test_there_are_examples():
  assert {p.name for p in EXAMPLES} >= set(KEY_LINES)


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script: pathlib.Path):
  result = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, f"{script.name} failed:\n{result.stdout}\n{result.stderr}"
  assert result.stdout.strip(), f"{script.name} printed nothing"
  key = KEY_LINES.get(script.name)
  if key is not None:
    assert key in result.stdout, f"{script.name}: expected {key!r} in:\n{result.stdout}"


def test_readme_python_blocks_run():
  """The README quickstart (its ```python blocks, in order, in one namespace) executes."""
  document = Sybil(parsers=[PythonCodeBlockParser()]).parse(ROOT / "README.md")
  examples = list(document)
  assert examples, "README.md has no ```python block"
  for example in examples:
    example.evaluate()
  namespace = document.namespace
  assert "lb" in namespace and "model" in namespace
