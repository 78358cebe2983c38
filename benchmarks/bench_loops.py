"""Per-call time of lb.fori_loop / lb.while_loop against nnx.fori_loop / nnx.while_loop.

Both run side by side in one process on the same carries; each number is the median over
repeated calls (after a warm-up call that compiles), in milliseconds, results blocked on.
"jit" wraps the loop in `nnx.jit` (the usual way to run it); "eager" calls the loop directly.
Rows where the installed flax's nnx loop cannot run the carry (two nnx.Linear in one carry on
flax 0.10) say so.

Run: python benchmarks/bench_loops.py  [--repeats N] [--json PATH]   (under 2 minutes on CPU)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
import typing as tp

import flax
import jax
import jax.numpy as jnp
from flax import nnx

import loopbridge as lb
from loopbridge import _compat

STEPS = 10
WIDTH = 16


def _block(out: tp.Any) -> None:
  jax.block_until_ready([x for x in jax.tree_util.tree_leaves(out) if isinstance(x, jax.Array)])


def median_ms_pair(
  fn_a: tp.Callable[[], tp.Any], fn_b: tp.Callable[[], tp.Any] | None, repeats: int
) -> tuple[float, float | None]:
  """Median ms per call of two functions, timed alternately so machine load hits both alike."""
  _block(fn_a())  # warm-up: compiles
  if fn_b is not None:
    _block(fn_b())
  times_a, times_b = [], []
  for _ in range(repeats):
    for fn, times in ((fn_a, times_a), (fn_b, times_b)):
      if fn is None:
        continue
      start = time.perf_counter()
      _block(fn())
      times.append(time.perf_counter() - start)
  med_b = 1e3 * statistics.median(times_b) if times_b else None
  return 1e3 * statistics.median(times_a), med_b


def one_model():
  model = nnx.Linear(WIDTH, WIDTH, rngs=nnx.Rngs(0))
  x = jnp.ones((1, WIDTH))

  def body(i, carry):
    m, y = carry
    return m, jnp.tanh(m(y))

  return (model, x), body


def two_models():
  model = nnx.Linear(WIDTH, WIDTH, rngs=nnx.Rngs(jax.random.PRNGKey(0)))
  model2 = nnx.Linear(WIDTH, WIDTH, rngs=nnx.Rngs(jax.random.PRNGKey(1)))
  x = jnp.ones((1, WIDTH))

  def body(i, carry):
    m, m2, y = carry
    return m, m2, jnp.tanh(m2(m(y)))

  return (model, model2, x), body


def bridged_sow_model():
  from flax import linen as nn

  class Block(nn.Module):
    @nn.compact
    def __call__(self, carry, _):
      carry = nn.relu(nn.Dense(WIDTH)(carry))
      self.sow("intermediates", "carry", carry)
      return carry, None

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      self.sow("intermediates", "x", x)
      scan = nn.scan(
        Block,
        variable_axes={"params": 0, "intermediates": 0},
        split_rngs={"params": True},
        length=3,
      )
      return scan()(x, None)[0]

  x = jnp.ones((1, WIDTH))
  model = lb.ToNNX(MLP(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=STEPS)

  def body(i, carry):
    m, y = carry
    return m, m(y)

  return (model, x), body


def fori_runner(
  loop: tp.Callable[..., tp.Any], make: tp.Callable[[], tp.Any], jit: bool
) -> tp.Callable[[], tp.Any]:
  carry, body = make()

  def run(carry):
    return loop(0, STEPS, body, carry)

  if jit:
    run = nnx.jit(run)
  return lambda: run(carry)


def while_runner(loop: tp.Callable[..., tp.Any], jit: bool) -> tp.Callable[[], tp.Any]:
  (model, x), fori_body = one_model()

  def body(carry):
    m, y, n = carry
    m, y = fori_body(n, (m, y))
    return m, y, n + 1

  def cond(carry):
    return carry[2] < STEPS

  def run(model, x):
    return loop(cond, body, (model, x, 0))

  if jit:
    run = nnx.jit(run)
  return lambda: run(model, x)


def nnx_runner_or_note(build: tp.Callable[[], tp.Callable[[], tp.Any]]):
  """The nnx loop's runner, or None and a note when this flax's nnx loop rejects the carry."""
  runner = build()
  try:
    _block(runner())
  except (ValueError, TypeError) as e:  # flax 0.10: the two-model carry
    return None, f"fails ({type(e).__name__})"
  return runner, ""


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=30, help="timed calls per cell (jit)")
  parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
  args = parser.parse_args()
  jit_repeats, eager_repeats = args.repeats, max(3, args.repeats // 6)

  rows = []
  cases = [
    ("fori_loop, 1 nnx.Linear", lambda loop, jit: fori_runner(loop, one_model, jit)),
    ("fori_loop, 2 nnx.Linear in one carry", lambda loop, jit: fori_runner(loop, two_models, jit)),
    (
      "fori_loop, lb.ToNNX sowing MLP (recording)",
      lambda loop, jit: fori_runner(loop, bridged_sow_model, jit),
    ),
  ]
  for name, build in cases:
    for jit in (True, False):
      repeats = jit_repeats if jit else eager_repeats
      nnx_run, note = nnx_runner_or_note(functools.partial(build, nnx.fori_loop, jit))
      lb_ms, nnx_ms = median_ms_pair(build(lb.fori_loop, jit), nnx_run, repeats)
      rows.append((name, "jit" if jit else "eager", lb_ms, nnx_ms, note))
  for jit in (True, False):
    repeats = jit_repeats if jit else eager_repeats
    lb_ms, nnx_ms = median_ms_pair(
      while_runner(lb.while_loop, jit), while_runner(nnx.while_loop, jit), repeats
    )
    rows.append(("while_loop, 1 nnx.Linear", "jit" if jit else "eager", lb_ms, nnx_ms, ""))

  print(
    f"flax {flax.__version__}, jax {jax.__version__}, {jax.devices()[0].platform}; "
    f"{STEPS} steps per call, width {WIDTH}; median of {jit_repeats} (jit) / "
    f"{eager_repeats} (eager) calls"
  )
  print(f"nnx loops in their default mode (graph switch: {_compat.HAS_GRAPH_SWITCH})\n")
  print("| loop and carry | call | lb (ms) | nnx (ms) | nnx / lb |")
  print("|---|---|---:|---:|---:|")
  for name, how, lb_ms, nnx_ms, note in rows:
    nnx_text = f"{nnx_ms:.3f}" if nnx_ms is not None else note
    ratio = f"{nnx_ms / lb_ms:.2f}x" if nnx_ms is not None else "-"
    print(f"| {name} | {how} | {lb_ms:.3f} | {nnx_text} | {ratio} |")
  if args.json:
    result = {
      "command": "python benchmarks/bench_loops.py" + f" --repeats {args.repeats}",
      "flax": flax.__version__,
      "jax": jax.__version__,
      "platform": jax.devices()[0].platform,
      "load_average": list(os.getloadavg()),
      "cpus": os.cpu_count(),
      "steps_per_call": STEPS,
      "width": WIDTH,
      "repeats": {"jit": jit_repeats, "eager": eager_repeats},
      "rows": [
        {"case": name, "call": how, "lb_ms": lb_ms, "nnx_ms": nnx_ms, "note": note}
        for name, how, lb_ms, nnx_ms, note in rows
      ],
    }
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
