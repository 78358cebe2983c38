"""Shared test setup: version markers and the loop-mode parameter used across the suite."""

from __future__ import annotations

import typing as tp

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


# --- sharding marker and hypothesis profiles (tests/test_sharding.py, tests/test_properties.py)

SHARDING_DEVICES = 8
SHARDING_COMMAND = (
    f"XLA_FLAGS=--xla_force_host_platform_device_count={SHARDING_DEVICES} "
    "python -m pytest -q -m sharding tests/test_sharding.py tests/test_bad_inputs.py")


def pytest_configure(config):
  config.addinivalue_line(
      "markers",
      f"sharding: needs {SHARDING_DEVICES} (simulated) devices; runs in its own process: "
      f"{SHARDING_COMMAND}")
  config.addinivalue_line(
      "markers",
      "multihost: starts 2 JAX processes (gloo CPU collectives, 2 devices each) that run as "
      "one multi-host job; deselect with -m 'not multihost'")


def _register_hypothesis_profiles() -> None:
  import os

  from hypothesis import HealthCheck, settings

  # Every example compiles small JAX programs, so examples are slow and timing varies: no
  # deadline, and a CI-sized default. LOOPBRIDGE_HYPOTHESIS_PROFILE=thorough for a deep run.
  common: dict[str, tp.Any] = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                                   print_blob=True)
  settings.register_profile("ci", max_examples=20, **common)
  settings.register_profile("thorough", max_examples=300, **common)
  settings.load_profile(os.environ.get("LOOPBRIDGE_HYPOTHESIS_PROFILE", "ci"))


_register_hypothesis_profiles()
