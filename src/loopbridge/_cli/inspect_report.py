"""`inspect`'s report: the JSON document's fields, and the same report as text."""

from __future__ import annotations

import typing as tp

from typing_extensions import NotRequired

from .._core.errors import first_line
from .._diagnostics.sow_sites import format_bytes, format_table
from .live_check import LoopbridgeCheck, StockCheck

_SUMMARY = 240  # characters of an error's first line the text report shows (JSON: all)


class SiteCounts(tp.TypedDict):
  """Sows of the model and outputs `--capture` records, counted apart (a sown pytree is one
  site with a buffer per leaf)."""

  sow_sites: int
  captured_outputs: int
  buffers: int
  dropped_sows: int


class BufferMemory(tp.TypedDict):
  buffers_bytes: int
  counts_bytes: int
  total_bytes: int


class ParameterSize(tp.TypedDict):
  arrays: int
  values: int
  bytes: int


class LiveCheck(tp.TypedDict):
  stock: StockCheck
  loopbridge: LoopbridgeCheck


class InspectReport(tp.TypedDict):
  """Everything `loopbridge inspect` reports; `--json` prints it (without the text table)."""

  target: str | None
  description: str | None
  model: str
  inputs: list[str]
  method: str | None
  keyword_inputs: list[str]  # the names of the sample call's `--kwarg` inputs
  capture: str | None
  capacity: int
  steps: int
  versions: dict[str, str]
  sow_sites: dict[str, object]  # `SowSites.to_dict()`, each site marked `captured` or not
  site_counts: SiteCounts
  buffer_memory: BufferMemory
  parameters: dict[str, ParameterSize]
  live_check: LiveCheck
  sow_sites_table: NotRequired[str]  # the text report's table (not in the JSON)


def sites_headline(model: str, counts: SiteCounts, buffer_bytes: int, capture: bool) -> str:
  """The table's first line: the model's sow sites and, with `--capture`, its captured outputs.

  It has the form of `lb.sow_sites`' headline, but a sown pytree counts as one site (the
  buffer memory line counts its buffers, one per leaf).

  Examples:
    >>> counts = SiteCounts(sow_sites=1, captured_outputs=3, buffers=5, dropped_sows=0)
    >>> sites_headline("Net", counts, 2048, capture=True)
    'Net: 1 sow site(s), 3 captured output(s), buffers 2.0 KiB'
  """
  captured = f", {counts['captured_outputs']} captured output(s)" if capture else ""
  return (
    f"{model}: {counts['sow_sites']} sow site(s){captured}, buffers {format_bytes(buffer_bytes)}"
  )


def render_text(doc: InspectReport) -> str:
  """The report as text: the sow-site table, memory, parameters and the live check."""
  out = []
  what = doc["target"] or "(default)"
  out.append(
    f"loopbridge inspect {what}: {doc['model']}"
    + (f" — {doc['description']}" if doc["description"] else "")
  )
  out.append(
    f"inputs: {', '.join(doc['inputs']) or 'none'}"
    + (f"; method: {doc['method']}" if doc["method"] else "")
    + (f"; capture: {doc['capture']}" if doc["capture"] else "")
    + f"; capacity {doc['capacity']}; flax {doc['versions']['flax']}, "
    f"jax {doc['versions']['jax']}"
  )
  out.append("")
  out.append("Sow sites")
  out.extend(
    "  " + line if i == 0 else line
    for i, line in enumerate(doc.get("sow_sites_table", "").splitlines())
  )
  counts = doc["site_counts"]
  if not counts["dropped_sows"]:
    out.append("  dropped sows: none")
  mem = doc["buffer_memory"]
  out.append("")
  out.append(
    f"Buffer memory at capacity {doc['capacity']}: {format_bytes(mem['total_bytes'])} "
    f"({counts['buffers']} buffer(s) {format_bytes(mem['buffers_bytes'])} + counts "
    f"{format_bytes(mem['counts_bytes'])})"
  )
  out.append("")
  out.append("Parameters and other variables")
  rows = [
    (col, str(v["arrays"]), f"{v['values']:,}", format_bytes(v["bytes"]))
    for col, v in doc["parameters"].items()
  ]
  out.append(format_table(("collection", "arrays", "values", "bytes"), rows) if rows else "  none")
  out.append("")
  out.append(
    f"Live check: {doc['steps']} steps of a jitted nnx.while_loop calling the model "
    "on the sample inputs"
  )
  out.extend(_stock_lines(doc["live_check"]["stock"]))
  out.extend(_loopbridge_lines(doc["live_check"]["loopbridge"]))
  return "\n".join(out)


STOCK_EXPECTED = (
  "  stock flax.nnx.bridge.ToNNX: fails, as expected (the demonstration: stock ToNNX cannot "
  "run this model in an NNX loop, its calls change the loop carry; lb.ToNNX below is the fix)"
)


def _stock_lines(stock: StockCheck) -> list[str]:
  out = []
  if stock["ok"] and not stock["model_sows"]:
    out.append(
      f"  stock flax.nnx.bridge.ToNNX: ran {stock.get('steps_run')} steps (the model "
      "does not sow) — stock bridge works; loopbridge adds recording"
    )
  elif stock["ok"]:
    out.append(f"  stock flax.nnx.bridge.ToNNX: ran {stock.get('steps_run')} steps")
  else:
    # The demonstration, not a failure of this run: say so before the error it shows.
    out.append(STOCK_EXPECTED)
    out.append(f"    its error: {first_line(stock['error'] or '', _SUMMARY)}")
  explained = stock["explain"]
  text = stock["explain_text"]
  if text and (not stock["ok"] or (explained and not explained["ok"])):
    if explained is None:  # lb.explain itself failed: one line, as for the errors
      text = first_line(text, _SUMMARY)
    out.append("  why (lb.explain of one loop step):")
    out.extend("    " + line for line in text.splitlines())
  return out


def _loopbridge_lines(ours: LoopbridgeCheck) -> list[str]:
  if not ours["ok"]:
    return [f"  lb.ToNNX: FAILED  {first_line(ours['error'] or '', _SUMMARY)}"]
  out = [
    f"  lb.ToNNX: ran {ours.get('steps_run')} steps; first call "
    f"{ours.get('first_call_s', 0.0):.2f} s (trace + compile + run), next call "
    f"{ours.get('next_call_s', 0.0) * 1e3:.1f} ms (run)"
  ]
  recorded = ours.get("recorded", {})
  rows = [
    (
      path,
      str(r["sown"]),
      str(r["kept"]),
      str(r["capacity"]),
      "(" + ", ".join(map(str, r["value_shape"])) + ")",
    )
    for path, r in recorded.items()
  ]
  if not rows:
    out.append(
      "    (the model sows nothing; record submodule outputs with --capture all or --capture CLASS)"
    )
    return out
  out.append(
    format_table(("recorded site", "sown", "kept", "capacity", "value shape"), rows, indent="    ")
  )
  if any(r["sown"] > r["kept"] for r in recorded.values()):
    out.append(
      "    some sites sowed more than their capacity; raise --capacity to keep every value"
    )
  return out
