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
