"""Shared test setup: version markers and the loop-mode parameter used across the suite."""

from __future__ import annotations

import pytest

from loopbridge import _compat

# Loop modes to test: graph mode everywhere; tree mode (graph=False) where flax has the switch.
LOOP_GRAPH_MODES = [True, False] if _compat.HAS_GRAPH_SWITCH else [True]


def graph_kw(graph: bool) -> dict:
  """Keyword arguments selecting graph/tree mode for nnx transforms on this flax."""
  return {"graph": graph} if _compat.HAS_GRAPH_SWITCH else {}


@pytest.fixture(params=LOOP_GRAPH_MODES, ids=lambda g: "graph" if g else "tree")
def graph(request) -> bool:
  return request.param


needs_graph_switch = pytest.mark.skipif(
    not _compat.HAS_GRAPH_SWITCH,
    reason=f"flax {'.'.join(map(str, _compat.FLAX_VERSION))} has no graph=/tree mode switch "
    "(added in flax 0.11)")
