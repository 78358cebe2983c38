"""Pages that state the same fact state it alike: a measured ratio as its last benchmark run
recorded it (benchmarks/results/), the command line with every subcommand it has."""

from __future__ import annotations

import json
import pathlib
import re

from loopbridge._cli import main as cli_main

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Each page's sentence giving the cost of a call without donation at capacity 4096 (x capacity 16).
NO_DONATION_SENTENCES = {
  "README.md": r"without it, (\d+)\u00d7",
  "migration_guides/rules.md": r"at capacity 4096 a call cost (\d+)\u00d7 a call at capacity 16",
  "benchmarks/README.md": r"one call of C takes [\d.]+ s CPU, (\d+)\u00d7 capacity",
}


def test_the_cost_without_donation_is_the_last_run_s_everywhere():
  results = json.loads((ROOT / "benchmarks" / "results" / "recording.json").read_text())
  measured = results["ratios"]["C-graph per call cap 4096/16"]["value"]["cpu"]
  expected = round(measured, -1)  # the pages give it to two significant digits
  for page, pattern in NO_DONATION_SENTENCES.items():
    text = " ".join((ROOT / page).read_text().split())  # sentences wrap across lines
    found = re.findall(pattern, text)
    assert found, f"{page}: no sentence matches {pattern!r}"
    assert [int(n) for n in found] == [expected] * len(found), (page, found, measured)


def test_pages_listing_the_command_line_list_every_subcommand():
  names = [module.__name__.rsplit(".", 1)[-1].removesuffix("_cmd") for module in cli_main.COMMANDS]
  assert "convert" in names and "port" in names
  for page in ("docs/index.md", "migration_guides/README.md"):
    text = (ROOT / page).read_text()
    entry = next(p for p in text.split("\n- ") if "The command line" in p)
    missing = [n for n in names if f"`loopbridge {n}`" not in entry]
    assert not missing, f"{page} leaves out {missing}: {entry!r}"


def _paragraph(page: str, start: str) -> str:
  """The paragraph of `page` that begins with `start`, whitespace collapsed."""
  text = (ROOT / page).read_text()
  paragraph = text[text.index(start) :].split("\n\n", 1)[0]
  return " ".join(paragraph.split())


def test_the_porting_guide_states_compare_s_default_tolerance():
  """The porting guide's tolerance paragraph against what `lb.compare` reports it used on a
  port equal to its Linen original: the precision both models ran at, and float32's default."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from flax import nnx

  import loopbridge as lb

  x = jnp.ones((2, 4))
  linen = nn.Dense(3)
  variables = linen.init(jax.random.key(0), x)
  port = nnx.Linear(4, 3, rngs=nnx.Rngs(1))
  port.kernel.value = variables["params"]["kernel"]
  assert port.bias is not None
  port.bias.value = variables["params"]["bias"]
  report = lb.compare((linen, variables), port, x)
  assert report.ok, report
  used = report.default_tolerance
  assert used is not None  # no rtol=/atol= given: the default was used

  page = "migration_guides/porting_and_checking.md"
  text = _paragraph(page, "The `tolerance:` line says which default was used")
  assert used.precision == "highest"
  default = (
    'By default `lb.compare` runs both models under `jax.default_matmul_precision("highest")`'
  )
  assert default in text, text
  # The advice to wrap the call is what the default makes unnecessary.
  assert "inside `with jax.default_matmul_precision" not in (ROOT / page).read_text()
  stated = re.search(r"float32's own default tolerance: ([0-9.e+-]+) on a CPU", text)
  assert stated, text
  if used.backend == "cpu":
    assert float(stated.group(1)) == used.rtol == used.atol, (stated.group(1), used)
  else:
    assert used.rtol >= float(stated.group(1)), used  # "wider" elsewhere


def test_user_docs_name_no_private_module():
  pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
  pages += [*(ROOT / "migration_guides").glob("*.md"), *(ROOT / "docs").glob("**/*.md")]
  private = re.compile(r"\b(?:loopbridge|lb)\._\w+")
  found = {str(p.relative_to(ROOT)): private.findall(p.read_text()) for p in pages}
  assert not {page: names for page, names in found.items() if names}
