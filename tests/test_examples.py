"""Every `examples/*.py` runs as a user would run it, and the README quickstart block runs too.

Each script runs in a fresh interpreter (`sys.executable`, so the environment under test) and must
exit with 0 and print its key result line. A script not listed in KEY_LINES must still exit with 0
and print something; list it here so its result is checked, not just its exit code. Running the
scripts is marked slow (`-m slow`, run by .ci/run); the default run compiles each one.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

from conftest import child_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# The line of output that says the example did what it claims (a substring of one stdout line).
KEY_LINES = {
  "sow_in_while_loop.py": "last step, last layer carry equals the loop output: True",
  "two_models_in_fori_loop.py": "returned the caller's models: True",
  "layer_stacks_in_fori_loop.py": "fori_loop forward == Python-loop forward (bit-exact)",
  "decoding_with_cache.py": "matches step-by-step Linen: True",
}


def test_there_are_examples():
  assert {p.name for p in EXAMPLES} >= set(KEY_LINES)


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_compiles_and_prints_its_key_line(script: pathlib.Path):
  """The cheap check of the default run; running each script is `-m slow` (.ci/run)."""
  source = script.read_text()
  compile(source, str(script), "exec")  # raises SyntaxError naming the line
  key = KEY_LINES.get(script.name)
  if key is not None:  # the literal part before any formatted value
    literal = re.split(r"[{}]", key)[0].split(":")[0]
    assert literal in source, f"{script.name}: {literal!r} is not printed anywhere"


# A fresh interpreter each (imports jax, compiles everything again): slow. The guides execute
# the same code paths in-process in the default run.
@pytest.mark.slow
@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script: pathlib.Path):
  result = subprocess.run(
    [sys.executable, str(script)],
    cwd=ROOT,
    env=child_env(),
    capture_output=True,
    text=True,
    timeout=600,
  )
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
  # A line `expr  # (shape...)` in a block states a result: check it.
  claims = re.findall(
    r"^(\S.*?\.shape)\s+#\s*(\([\d, ]*\))", (ROOT / "README.md").read_text(), flags=re.M
  )
  for expr, shape in claims:
    assert tuple(eval(expr, namespace)) == ast.literal_eval(shape), expr


def _slug(heading: str) -> str:
  """GitHub's anchor for a markdown heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  anchors, fenced = set(), False
  for line in path.read_text().splitlines():
    if line.startswith("```"):
      fenced = not fenced
    elif not fenced and line.startswith("#"):
      anchors.add(_slug(line.lstrip("#")))
  return anchors


DOCS = sorted([ROOT / "README.md", *(ROOT / "migration_guides").glob("*.md")])


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: pathlib.Path):
  """Every relative link in the guides and README names a file (and heading) that exists."""
  if not page.exists():
    pytest.skip(f"{page.name} does not exist")
  prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # code blocks
  prose = re.sub(r"`[^`\n]*`", "", prose)  # inline code
  broken = []
  for target in re.findall(r"\]\(([^)\s]+)\)", prose):
    if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
      continue
    file_part, _, anchor = target.partition("#")
    linked = (page.parent / file_part).resolve() if file_part else page
    if not linked.exists():
      broken.append(f"{target}: no file {file_part}")
    elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
      broken.append(f"{target}: no heading #{anchor} in {linked.name}")
  assert not broken, f"{page.name}: " + "; ".join(broken)


# The pages a reader can land on: on GitHub (README, guides, benchmarks) or on the site (docs/).
PAGES = sorted(
  [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    *(ROOT / "migration_guides").glob("*.md"),
    *(ROOT / "docs").glob("**/*.md"),
  ]
)


def _prose_and_rows(path: pathlib.Path):
  """Paragraphs of prose (whitespace collapsed) and table rows, outside code blocks."""
  prose = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
  for paragraph in re.split(r"\n\s*\n", prose):
    rows = [line.strip() for line in paragraph.splitlines() if line.startswith("|")]
    if rows:
      yield from (row for row in rows if len(row.strip("|-: ")) > 40)
    else:
      yield " ".join(paragraph.split())


def test_each_long_text_has_one_copy():
  """A paragraph or table row kept in two pages is two chances to disagree: a page that shows
  another's text includes it at build time (pymdownx.snippets, `--8<--`) instead."""
  where: dict[str, list[str]] = {}
  for page in PAGES:
    for text in set(_prose_and_rows(page)):
      if len(text) >= 160 or text.startswith("|"):
        where.setdefault(text, []).append(str(page.relative_to(ROOT)))
  copies = {text[:80]: pages for text, pages in where.items() if len(pages) > 1}
  assert not copies, f"kept in more than one page: {copies}"
