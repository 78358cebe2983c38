"""Layer stacks: when are `nnx.scan` / `nnx.fori_loop` over layers worth it?

Compile time and step time versus depth for three ways of running a stack of equal layers (a
residual MLP block, `x + Linear(2W, W)(gelu(Linear(W, 2W)(LayerNorm(x))))`, width W=32, the
shape of a transformer's feed-forward half), forward only and forward + gradient (w.r.t. every
parameter):

  unrolled  a Python loop over a list of layers (jit traces and compiles every layer)
  scan      `nnx.scan` over a stack (`lb.layers.scan`): one compiled layer body
  fori      `nnx.fori_loop` over a stack with `lb.layers.layer(stack, i)`, `i` traced

Each function takes the pure state (`nnx.split`) and runs under `jax.jit`. Compile time is the
process CPU time of `jax.jit(f).lower(...).compile()` (Python tracing, NNX graph work, lowering
and XLA) for a freshly built function, the minimum of `--compiles` tries, after one warm-up
compile per method; CPU time rather than wall time because the machine may be shared (wall
time is recorded in the JSON too). Step time: every case is compiled first, then timed in
interleaved rounds (each round calls every case once, in rotating order) so that load from
other processes hits all cases alike; reported step time is the best (minimum) over rounds, the
estimate least disturbed by other processes on a shared machine (the JSON also has the median).

Run:  python benchmarks/bench_stacking.py [--quick]
Writes benchmarks/results/stacking.json, prints a markdown table, and plots
migration_guides/stacking_layers.png when matplotlib is installed (optional).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import typing as tp

import flax
import jax
import jax.numpy as jnp
from flax import nnx

import loopbridge as lb

WIDTH, BATCH = 32, 16
METHODS = ("unrolled", "scan", "fori")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class Block(nnx.Module):
  """A residual MLP block: the per-layer work of a transformer's feed-forward half."""

  def __init__(self, width: int, rngs: nnx.Rngs):
    self.norm = nnx.LayerNorm(width, rngs=rngs)
    self.up = nnx.Linear(width, 2 * width, rngs=rngs)
    self.down = nnx.Linear(2 * width, width, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return x + self.down(nnx.gelu(self.up(self.norm(x))))


def _layer_body(layer: nnx.Module, x: jax.Array) -> jax.Array:
  return layer(x)


def build(method: str, depth: int) -> tuple[tp.Callable[..., jax.Array], tp.Any]:
  """The forward function `f(state, x)` of one method and its initial pure state."""
  layers = [Block(WIDTH, nnx.Rngs(i)) for i in range(depth)]
  if method == "unrolled":
    graphdef, state = nnx.split(layers)

    def forward(state, x):
      for layer in nnx.merge(graphdef, state):
        x = _layer_body(layer, x)
      return x

    return forward, state
  graphdef, state = nnx.split(lb.layers.stack(layers))
  if method == "scan":

    def forward(state, x):
      return lb.layers.scan(nnx.merge(graphdef, state), x, call=_layer_body)

    return forward, state

  def forward(state, x):
    def body(i, carry):
      stack, y = carry
      return stack, _layer_body(lb.layers.layer(stack, i), y)

    _, y = nnx.fori_loop(0, depth, body, (nnx.merge(graphdef, state), x))
    return y

  return forward, state


def make_step(method: str, depth: int, grad: bool) -> tuple[tp.Callable[..., tp.Any], tp.Any]:
  forward, state = build(method, depth)
  if not grad:
    return forward, state

  def loss(state, x):
    return jnp.mean(forward(state, x) ** 2)

  return jax.value_and_grad(loss), state


def _compile(method: str, depth: int, grad: bool, x: jax.Array):
  """Build a fresh step (new closures: no jit cache hit) and compile it.

  Returns (compiled, state, cpu, wall).
  """
  step, state = make_step(method, depth, grad)
  cpu, wall = time.process_time(), time.perf_counter()
  compiled = jax.jit(step).lower(state, x).compile()
  return compiled, state, time.process_time() - cpu, time.perf_counter() - wall


def run(depths: tp.Sequence[int], rounds: int, compiles: int) -> list[dict[str, tp.Any]]:
  x = jax.random.normal(jax.random.key(0), (BATCH, WIDTH))
  for method in METHODS:  # one-time costs (imports, first lowering) are not any case's
    for grad in (False, True):
      _compile(method, 2, grad, x)
  cases = []
  for grad in (False, True):
    for depth in depths:
      for method in METHODS:
        cpu_times, wall_times = [], []
        for _ in range(compiles):
          compiled, state, cpu_s, wall_s = _compile(method, depth, grad, x)
          cpu_times.append(cpu_s)
          wall_times.append(wall_s)
        jax.block_until_ready(compiled(state, x))  # warm up
        cases.append(
          {
            "method": method,
            "depth": depth,
            "grad": grad,
            "compile_s": min(cpu_times),
            "compile_wall_s": min(wall_times),
            "fn": compiled,
            "args": (state, x),
            "times": [],
          }
        )
        print(
          f"  compiled {method:8s} depth {depth:3d} {'fwd+grad' if grad else 'fwd':8s} "
          f"in {min(cpu_times):.2f} s CPU ({min(wall_times):.2f} s wall)",
          flush=True,
        )
  for r in range(rounds):
    order = cases[r % len(cases) :] + cases[: r % len(cases)]
    for case in order:
      start = time.perf_counter()
      jax.block_until_ready(case["fn"](*case["args"]))
      case["times"].append(time.perf_counter() - start)
  return [
    {
      "method": c["method"],
      "depth": c["depth"],
      "grad": c["grad"],
      "compile_s": c["compile_s"],
      "compile_wall_s": c["compile_wall_s"],
      "step_us": 1e6 * min(c["times"]),
      "step_median_us": 1e6 * statistics.median(c["times"]),
    }
    for c in cases
  ]


def table(results: list[dict[str, tp.Any]], depths: tp.Sequence[int]) -> str:
  index = {(r["method"], r["depth"], r["grad"]): r for r in results}
  head = (
    "| pass | depth | "
    + " | ".join(f"compile {m} (s CPU)" for m in METHODS)
    + " | "
    + " | ".join(f"step {m} (µs, best)" for m in METHODS)
    + " |"
  )
  lines = [head, "|" + "---|" * (2 + 2 * len(METHODS))]
  for grad in (False, True):
    for depth in depths:
      cells = [f"{index[(m, depth, grad)]['compile_s']:.2f}" for m in METHODS]
      cells += [f"{index[(m, depth, grad)]['step_us']:.0f}" for m in METHODS]
      lines.append(f"| {'fwd+grad' if grad else 'fwd'} | {depth} | " + " | ".join(cells) + " |")
  lo, hi = min(depths), max(depths)
  lines.append("")
  for grad in (False, True):
    ratios = ", ".join(
      f"{m} {index[(m, hi, grad)]['compile_s'] / index[(m, lo, grad)]['compile_s']:.1f}x"
      for m in METHODS
    )
    lines.append(
      f"Compile time, depth {hi} / depth {lo} ({'fwd+grad' if grad else 'fwd'}): {ratios}"
    )
  return "\n".join(lines)


def plot(results: list[dict[str, tp.Any]], path: str) -> bool:
  try:
    import matplotlib  # optional: not a dependency of loopbridge
  except ImportError:
    return False
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for ax, key, label in (
    (axes[0], "compile_s", "compile time (s CPU)"),
    (axes[1], "step_us", "step time (µs)"),
  ):
    for color, method in zip(("C0", "C1", "C2"), METHODS):
      for grad, style in ((False, "-"), (True, "--")):
        rows = sorted(
          (r for r in results if r["method"] == method and r["grad"] == grad),
          key=lambda r: r["depth"],
        )
        ax.plot(
          [r["depth"] for r in rows],
          [r[key] for r in rows],
          style,
          color=color,
          marker="o",
          label=f"{method} {'fwd+grad' if grad else 'fwd'}",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("depth (layers)")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(f"residual MLP blocks, width {WIDTH}, batch {BATCH}, {jax.default_backend()}")
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  return True


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="depths 2, 8 and few rounds")
  parser.add_argument("--rounds", type=int, default=50)
  parser.add_argument("--compiles", type=int, default=2, help="compiles per case (min kept)")
  parser.add_argument("--json", default=os.path.join(HERE, "results", "stacking.json"))
  parser.add_argument(
    "--png", default=os.path.join(ROOT, "migration_guides", "stacking_layers.png")
  )
  parser.add_argument(
    "--plot-only",
    action="store_true",
    help="redraw the table and plot from the JSON of an earlier run",
  )
  args = parser.parse_args()
  if args.plot_only:
    with open(args.json) as f:
      results = json.load(f)["results"]
    print(table(results, sorted({r["depth"] for r in results})))
    print("plot:", plot(results, args.png))
    return
  depths = (2, 8) if args.quick else (2, 8, 32, 64)
  rounds = 5 if args.quick else args.rounds
  print(
    f"flax {flax.__version__}, jax {jax.__version__}, {jax.default_backend()}, "
    f"{os.cpu_count()} cpus",
    flush=True,
  )
  results = run(depths, rounds, 1 if args.quick else args.compiles)
  text = table(results, depths)
  print(text)
  os.makedirs(os.path.dirname(args.json), exist_ok=True)
  with open(args.json, "w") as f:
    json.dump(
      {
        "flax": flax.__version__,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "width": WIDTH,
        "batch": BATCH,
        "rounds": rounds,
        "results": results,
      },
      f,
      indent=1,
    )
  if plot(results, args.png):
    print(f"plot: {os.path.relpath(args.png, ROOT)}")
  else:
    print("matplotlib not installed: no plot")


if __name__ == "__main__":
  main()
