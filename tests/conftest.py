"""Shared test setup: version markers and the loop-mode parameter used across the suite."""

from __future__ import annotations

import os

# Tests compile many tiny XLA programs: LLVM's optimization level barely changes their run
# time but is a quarter of the suite's. Set before the first JAX computation creates the CPU
# backend (which reads XLA_FLAGS once); a level the caller chose is kept. Benchmarks do not
# load this file.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
  ).strip()


import typing as tp

import pytest

from loopbridge import _compat

# Loop modes to test: graph mode everywhere; tree mode (graph=False) where flax has the switch.
LOOP_GRAPH_MODES = [True, False] if _compat.HAS_GRAPH_SWITCH else [True]


def graph_kw(graph: bool) -> dict:
  """Keyword arguments selecting graph/tree mode for nnx transforms on this flax."""
  return {"graph": graph} if _compat.HAS_GRAPH_SWITCH else {}


def matmul_tolerance(rtol: float, atol: float) -> tuple[float, float]:
  """(rtol, atol) for comparing float32 results of matmuls with plain Linen on this backend.

  The given values where float32 matmuls run in float32 (CPU); widened to `lb.compare`'s
  default for the backend where they run narrower (TensorFloat-32 on NVIDIA GPUs, one
  bfloat16 pass on TPUs), so the suite passes there without hiding what it checks on CPU.
  Asked when a test module is imported: it starts the JAX backend (after this file's
  XLA_FLAGS).
  """
  from loopbridge._diagnostics.compare_tolerance import FLOAT32, default_tolerance

  choice = default_tolerance()
  if choice.float32_matmuls == FLOAT32:
    return rtol, atol
  return max(rtol, choice.rtol), max(atol, choice.atol)


def full_precision_tolerance(rtol: float, atol: float) -> tuple[float, float]:
  """(rtol, atol) for comparing float32 results with plain Linen when both ran under
  `jax.default_matmul_precision('highest')`, as loopbridge's checks run them.

  The given values where that default is float32's own (CPU, GPU); widened to the check's
  default on a TPU, whose transcendentals still differ in the 5th digit.
  """
  from loopbridge._diagnostics.compare_tolerance import HIGHEST, default_tolerance

  choice = default_tolerance(precision=HIGHEST)
  return max(rtol, choice.rtol), max(atol, choice.atol)


def child_env(*front_paths: str, drop: tp.Sequence[str] = ()) -> dict[str, str]:
  """The environment of a Python process a test starts: this one's, on the CPU.

  An accelerator chip admits one process (a TPU: the next one fails with "Unable to initialize
  backend 'tpu': ... libtpu multi-process lockfile"), and the test process holds it, so the
  child gets `JAX_PLATFORMS=cpu` (it never competes for the chip). `front_paths` go in front of
  PYTHONPATH, which is kept (a TPU image names its JAX there); `drop` names variables to leave
  out.
  """
  env = {k: v for k, v in os.environ.items() if k not in drop}
  env["JAX_PLATFORMS"] = "cpu"
  # JAX's start-up warning on a stock TPU VM is printed by any process importing JAX there,
  # whatever its platform; tests that read a child's stderr would read it as the child's own.
  # (The same filter as pyproject's filterwarnings; PYTHONWARNINGS matches a message's start.)
  quiet = "ignore:Transparent hugepages are not enabled"
  env["PYTHONWARNINGS"] = ",".join(w for w in (env.get("PYTHONWARNINGS"), quiet) if w)
  paths = [*front_paths, env.get("PYTHONPATH", "")]
  env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
  return env


def on_cpu() -> bool:
  """Whether the suite's JAX backend is the CPU (asked lazily: it starts the backend)."""
  import jax

  return jax.default_backend() == "cpu"


def feedback_while_loop(graph: bool = True) -> tp.Callable:
  """`run(model, x, n)`: the seed loop, n calls in `nnx.while_loop`, each output fed back in."""
  from flax import nnx

  def body(c):
    model, h, i = c
    return model, model(h), i + 1

  def run(model, x, n):
    return nnx.while_loop(lambda c: c[2] < n, body, (model, x, 0), **graph_kw(graph))[1]

  return run


@pytest.fixture(params=LOOP_GRAPH_MODES, ids=lambda g: "graph" if g else "tree")
def graph(request) -> bool:
  return request.param


needs_graph_switch = pytest.mark.skipif(
  not _compat.HAS_GRAPH_SWITCH,
  reason=f"flax {'.'.join(map(str, _compat.FLAX_VERSION))} has no graph=/tree mode switch "
  "(loops and transforms take it from flax 0.12.5)",
)


# --- markers (sharding, multihost, slow) and hypothesis profiles

SHARDING_DEVICES = 8
SHARDING_COMMAND = (
  f"XLA_FLAGS=--xla_force_host_platform_device_count={SHARDING_DEVICES} "
  "python -m pytest -q -m sharding tests/test_sharding.py tests/test_bad_inputs.py"
)


def pytest_configure(config):
  config.addinivalue_line(
    "markers",
    f"sharding: needs {SHARDING_DEVICES} (simulated) devices; runs in its own process: "
    f"{SHARDING_COMMAND}",
  )
  config.addinivalue_line(
    "markers",
    "multihost: starts 2 JAX processes (gloo CPU collectives, 2 devices each) that run as "
    "one multi-host job; also marked slow",
  )
  config.addinivalue_line(
    "markers",
    f"slow: {SLOW_REASON}; left out of a plain `pytest` run, run by {SLOW_COMMAND!r} "
    "(as .ci/run does) or by naming the test",
  )


# Slow tests repeat work the default run already covers more cheaply, so a plain run leaves
# them out to stay within its time budget; CI runs them in a second pass, so each test still
# runs exactly once there.
SLOW_REASON = (
  "subprocess runs of the examples and the CLI (the guides and in-process tests "
  "cover the same code), hypothesis property tests, the 2-process job, the real-model corpus "
  "(tests/corpus: each feature it uses has a faster test of its own), the drafting guide "
  "(migration_guides/drafting_the_port.md: the drafting tests cover each case it shows)"
)
SLOW_COMMAND = "python -m pytest -q -m slow"


def _is_plain_run(config) -> bool:
  """True for a plain run: no -m expression and no test paths named (the configured testpaths)."""
  if config.option.markexpr:
    return False  # the user's -m decides, slow or not
  return config.args_source == pytest.Config.ArgsSource.TESTPATHS


def pytest_collection_modifyitems(config, items):
  if not _is_plain_run(config):
    return
  slow = [item for item in items if item.get_closest_marker("slow") is not None]
  if slow:
    config.hook.pytest_deselected(items=slow)
    items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def pytest_report_header(config):
  if _is_plain_run(config):
    return f"slow tests left out ({SLOW_REASON}); run them with: {SLOW_COMMAND}"
  return None


def _register_hypothesis_profiles() -> None:
  import os

  from hypothesis import HealthCheck, settings

  # Every example compiles small JAX programs, so examples are slow and timing varies: no
  # deadline, and a CI-sized default. LOOPBRIDGE_HYPOTHESIS_PROFILE=thorough (or `deep`, or
  # pytest's --hypothesis-profile=deep) for a deep run; `deep` also takes longer stateful
  # sequences (tests/test_stateful.py, tests/STATEFUL.md).
  common: dict[str, tp.Any] = dict(
    deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
  )
  # The default (`ci`) profile is derandomized: CI, which decides whether a change lands, tries
  # the same examples on every run; the other profiles draw new ones (a found failure is then
  # pinned with @example).
  settings.register_profile("ci", max_examples=20, derandomize=True, **common)
  settings.register_profile("thorough", max_examples=300, **common)
  settings.register_profile("deep", max_examples=300, stateful_step_count=25, **common)
  settings.load_profile(os.environ.get("LOOPBRIDGE_HYPOTHESIS_PROFILE", "ci"))


_register_hypothesis_profiles()
