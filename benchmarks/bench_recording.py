"""What recording every `sow` costs, side by side with the hand-written loop.

One process, every scenario compiled once, then timed in interleaved rounds (the scenario order
rotates each round) so that load from other processes hits all of them alike; reported numbers
are medians over rounds, and ratios are medians of per-round ratios (paired).

Model: the seed-000 MLP (a top-level sow and a sow inside an `nn.scan` body of Dense + relu),
widened to width 256, depth 6, batch 32.

Scenarios (loops of 50 and 500 steps; the loop length is a traced argument, so both lengths run
the same executable and "per step" is the marginal cost (t500 - t50) / 450, free of per-call
costs):
  A  jax.lax.while_loop around linen apply, nothing recorded (the floor)
  B  the hand-written loop: linen apply(mutable=['intermediates']) writing each sown value into a
     preallocated buffer with dynamic_update_index_in_dim, buffers donated (the practical limit)
  C  lb.ToNNX in nnx.while_loop under nnx.jit (graph mode; tree mode where flax has graph=)
  D  lb.compile_step around the same nnx.while_loop (split once, jax.jit, state donated)

Run:  python benchmarks/bench_recording.py [--quick]
Writes benchmarks/results/recording.json (medians and ratios) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
import typing as tp

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx import bridge

import loopbridge as lb
from loopbridge import _compat

WIDTH, DEPTH, BATCH = 256, 6, 32
SHORT, LONG = 50, 500
MAIN_CAPACITY = 64
CAPACITIES = (16, 256, 4096)
GRAPH_MODES = (True, False) if _compat.HAS_GRAPH_SWITCH else (True,)


class Block(nn.Module):
  """The seed-000 scan body: Dense + relu, sows its carry."""

  features: int

  @nn.compact
  def __call__(self, carry, unused_inputs):
    carry = nn.relu(nn.Dense(self.features)(carry))
    self.sow("intermediates", "carry", carry)
    return carry, None


class MLP(nn.Module):
  """The seed-000 model: a top-level sow and a sow inside an `nn.scan` body."""

  depth: int
  features: int

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    scan_block = nn.scan(Block, variable_axes={"params": 0, "intermediates": 0},
                         split_rngs={"params": True}, length=self.depth)(self.features)
    carry, _ = scan_block(x, None)
    return carry


def graph_kw(graph: bool) -> dict:
  return {"graph": graph} if _compat.HAS_GRAPH_SWITCH else {}


def mode_name(graph: bool) -> str:
  return "graph" if graph else "tree"


# ------------------------------------------------------------------------------ the scenarios
def functional_loops(module: nn.Module):
  """A and B: what an expert writes with plain Linen and jax.lax."""

  def loop_a(params, x, n):
    def body(c):
      i, h = c
      return i + 1, module.apply(params, h)

    return jax.lax.while_loop(lambda c: c[0] < n, body, (0, x))[1]

  def loop_b(params, rec, x, n):
    def body(c):
      i, h, (bx, bc, k) = c
      y, state = module.apply(params, h, mutable=["intermediates"])
      sown = state["intermediates"]
      bx = jax.lax.dynamic_update_index_in_dim(bx, sown["x"][0], k, 0)
      bc = jax.lax.dynamic_update_index_in_dim(bc, sown["ScanBlock_0"]["carry"][0], k, 0)
      return i + 1, y, (bx, bc, k + 1)

    _, h, rec = jax.lax.while_loop(lambda c: c[0] < n, body, (0, x, rec))
    return h, rec

  return jax.jit(loop_a), jax.jit(loop_b, donate_argnums=1)


def functional_steps(module: nn.Module):
  """One call, functional: plain apply, and apply writing the sows into donated buffers."""

  def step_a(params, x):
    return module.apply(params, x)

  def step_b(params, rec, x):
    y, state = module.apply(params, x, mutable=["intermediates"])
    sown = state["intermediates"]
    bx, bc, k = rec
    bx = jax.lax.dynamic_update_index_in_dim(bx, sown["x"][0], k, 0)
    bc = jax.lax.dynamic_update_index_in_dim(bc, sown["ScanBlock_0"]["carry"][0], k, 0)
    return y, (bx, bc, k + 1)

  return jax.jit(step_a), jax.jit(step_b, donate_argnums=1)


def new_records(capacity: int, depth: int, batch: int, width: int):
  return (jnp.zeros((capacity, batch, width)), jnp.zeros((capacity, depth, batch, width)),
          jnp.zeros((), jnp.int32))


def nnx_loop(graph: bool):
  kw = graph_kw(graph)

  def body(c):
    model, h, i = c
    return model, model(h), i + 1

  def loop(model, x, n):
    return nnx.while_loop(lambda c: c[2] < n, body, (model, x, 0), **kw)[1]

  return loop


def nnx_step(model, x):
  return model(x)


def new_model(module: nn.Module, x, capacity: int) -> lb.ToNNX:
  model = lb.ToNNX(module, rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=capacity)
  return model


class Stateful:
  """Holds a donated record tuple between calls of a functional loop/step (as users must)."""

  def __init__(self, fn, params, rec):
    self.fn, self.params, self.rec = fn, params, rec

  def __call__(self, *args):
    out, self.rec = self.fn(self.params, self.rec, *args)
    return out


# ------------------------------------------------------------------------------ timing
def timed(fn: tp.Callable[[], tp.Any], calls: int = 1) -> float:
  start = time.perf_counter()
  for _ in range(calls):
    out = fn()
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls


def calls_for(fn: tp.Callable[[], tp.Any], target_s: float, max_calls: int = 1000) -> int:
  """How many back-to-back calls make one sample last about `target_s` (at least one)."""
  one = timed(fn)
  return max(1, min(max_calls, int(target_s / max(one, 1e-6))))


def run_rounds(cases: dict[str, tp.Callable[[], float]], rounds: int) -> dict[str, list[float]]:
  """Run every case once per round, rotating the order each round; return all samples."""
  names = list(cases)
  samples: dict[str, list[float]] = {name: [] for name in names}
  for r in range(rounds):
    order = names[r % len(names):] + names[:r % len(names)]
    for name in order:
      samples[name].append(cases[name]())
  return samples


def med(values: tp.Sequence[float]) -> float:
  return float(statistics.median(values))


def paired_ratio(num: tp.Sequence[float], den: tp.Sequence[float]) -> float:
  return med([a / b for a, b in zip(num, den)])


def loop_case(fn):
  """Sample = (t_short, t_long) of one executable; per step = marginal cost."""

  def sample():
    return (timed(lambda: fn(SHORT)), timed(lambda: fn(LONG)))

  return sample


def marginal(samples):
  return [(long - short) / (LONG - SHORT) for short, long in samples]


# ------------------------------------------------------------------------------ sections
def bench_loops(args, module, params, x) -> dict:
  """A, B, C, D at capacity 64, then C/D at capacities 16/256/4096 (one model per capacity)."""
  loop_a, loop_b = functional_loops(module)
  rec_b = Stateful(loop_b, params, new_records(MAIN_CAPACITY, DEPTH, BATCH, WIDTH))
  models = {cap: new_model(module, x, cap) for cap in (MAIN_CAPACITY, *CAPACITIES)}
  cases: dict[str, tp.Callable] = {
      "A": lambda n: loop_a(params, x, n),
      "B": lambda n: rec_b(x, n),
  }
  for cap, model in models.items():
    suffix = "" if cap == MAIN_CAPACITY else f"@{cap}"
    for graph in GRAPH_MODES:
      if cap != MAIN_CAPACITY and not graph:
        continue
      jitted = nnx.jit(nnx_loop(graph), **graph_kw(graph))
      cases[f"C-{mode_name(graph)}{suffix}"] = functools.partial(
          lambda n, jitted=jitted, model=model: jitted(model, x, n))
    step = lb.compile_step(nnx_loop(True), model)
    cases[f"D{suffix}"] = functools.partial(lambda n, step=step: step(x, n))
  t0 = time.perf_counter()
  for name, fn in cases.items():  # compile (and settle donation) outside the timed rounds
    jax.block_until_ready(fn(SHORT))
  print(f"  compiled {len(cases)} loops in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
  samples = run_rounds({name: loop_case(fn) for name, fn in cases.items()}, args.rounds)
  out = {}
  for name, s in samples.items():
    m = marginal(s)
    out[name] = {
        "per_step_us": med(m) * 1e6,
        "per_step_samples_us": [v * 1e6 for v in m],
        f"t{SHORT}_ms": med([a for a, _ in s]) * 1e3,
        f"t{LONG}_ms": med([b for _, b in s]) * 1e3,
    }
  return out


def bench_calls(args, module, x, *, capacities, tiny: bool) -> dict:
  """Per-call time of one jitted step: functional apply vs nnx.jit vs lb.compile_step."""
  key = jax.random.key(1)
  params = module.init(key, x)
  params = {"params": params["params"]}
  step_a, step_b = functional_steps(module)
  depth, batch, width = module.depth, x.shape[0], x.shape[1]
  cases: dict[str, tp.Callable] = {"jax.jit apply": lambda: step_a(params, x)}
  for cap in capacities:
    suffix = f"@{cap}"
    rec = Stateful(step_b, params, new_records(cap, depth, batch, width))
    cases[f"jax.jit apply+buffers{suffix}"] = functools.partial(lambda rec: rec(x), rec)
    model = new_model(module, x, cap)
    for graph in GRAPH_MODES:
      jitted = nnx.jit(nnx_step, **graph_kw(graph))
      cases[f"C-{mode_name(graph)}{suffix}"] = functools.partial(
          lambda jitted, model: jitted(model, x), jitted, model)
      if not tiny:
        break  # tree mode costs the same per call on the wide model; once is enough
    donating = nnx.jit(nnx_step, donate_argnums=0)
    cases[f"C-graph donate{suffix}"] = functools.partial(
        lambda jitted, model: jitted(model, x), donating, model)
    step = lb.compile_step(nnx_step, model)
    cases[f"D{suffix}"] = functools.partial(lambda step: step(x), step)
  timers = {}
  for name, fn in cases.items():
    jax.block_until_ready(fn())
    timers[name] = functools.partial(timed, fn, calls_for(fn, args.sample_s))
  samples = run_rounds(timers, args.rounds)
  return {name: {"per_call_us": med(s) * 1e6, "samples_us": [v * 1e6 for v in s]}
          for name, s in samples.items()}


def memory_stats(compiled) -> dict:
  stats = compiled.memory_analysis()
  return {k: int(getattr(stats, f"{k}_size_in_bytes")) for k in
          ("argument", "output", "alias", "temp")}


def bench_memory(module, params, x) -> dict:
  """Compiled argument/output/alias/temp bytes of the capacity-64 loops."""
  loop_a, loop_b = functional_loops(module)
  out = {"A": memory_stats(loop_a.lower(params, x, SHORT).compile())}
  rec = new_records(MAIN_CAPACITY, DEPTH, BATCH, WIDTH)
  out["B"] = memory_stats(loop_b.lower(params, rec, x, SHORT).compile())
  model = new_model(module, x, MAIN_CAPACITY)
  # What nnx.jit compiles: the same loop on the split state, nothing donated.
  graphdef, state = nnx.split(model)

  def loop_c(state, x, n):
    m = nnx.merge(graphdef, state)
    y = nnx_loop(True)(m, x, n)
    return y, nnx.state(m)

  out["C"] = memory_stats(jax.jit(loop_c).lower(state, x, SHORT).compile())
  out["D"] = memory_stats(lb.compile_step(nnx_loop(True), model).lower(x, SHORT).compile())
  buffer_bytes = sum(int(np.prod(b.shape)) * b.dtype.itemsize
                     for b in jax.tree_util.tree_leaves(lb.buffers(model)))
  for name in ("C", "D"):
    out[name]["temp_minus_A"] = out[name]["temp"] - out["A"]["temp"]
  out["buffer_bytes"] = buffer_bytes
  return out


def bench_lazy_init(args, module, x) -> dict:
  def ours():
    model = lb.ToNNX(module, rngs=nnx.Rngs(0))
    lb.lazy_init(model, x, capacity=MAIN_CAPACITY)
    return jax.tree_util.tree_leaves(nnx.state(model))

  def stock():
    model = bridge.ToNNX(module, rngs=nnx.Rngs(0))
    bridge.lazy_init(model, x)
    return jax.tree_util.tree_leaves(nnx.state(model))

  cases = {"lb.lazy_init": functools.partial(timed, ours),
           "bridge.lazy_init": functools.partial(timed, stock)}
  for fn in cases.values():
    fn()
  samples = run_rounds(cases, max(3, args.rounds // 3))
  return {name: {"wall_ms": med(s) * 1e3, "samples_ms": [v * 1e3 for v in s]}
          for name, s in samples.items()}, samples


# ------------------------------------------------------------------------------ report
def check(value: float, target: float) -> str:
  return "ok" if value <= target else "MISSED"


def main(argv: tp.Sequence[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="fewer rounds (about 1-2 minutes)")
  parser.add_argument("--rounds", type=int, default=None, help="timed rounds per scenario")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "results", "recording.json"))
  args = parser.parse_args(argv)
  if args.rounds is None:
    args.rounds = 5 if args.quick else 21
  args.sample_s = 0.01 if args.quick else 0.02  # one per-call sample lasts about this long
  started = time.perf_counter()

  module = MLP(depth=DEPTH, features=WIDTH)
  x = jax.random.normal(jax.random.key(0), (BATCH, WIDTH))
  params = {"params": module.init(jax.random.key(1), x)["params"]}

  print("loops ...", file=sys.stderr)
  loops = bench_loops(args, module, params, x)
  print("per-call, tiny model ...", file=sys.stderr)
  tiny_module, tiny_x = MLP(depth=3, features=8), jnp.ones((1, 8))
  dispatch = bench_calls(args, tiny_module, tiny_x, capacities=(16,), tiny=True)
  print("per-call, wide model ...", file=sys.stderr)
  per_call = bench_calls(args, module, x, capacities=(16, 4096), tiny=False)
  print("memory ...", file=sys.stderr)
  memory = bench_memory(module, params, x)
  print("lazy_init ...", file=sys.stderr)
  lazy, lazy_samples = bench_lazy_init(args, module, x)

  def steps(name):
    return loops[name]["per_step_samples_us"]

  ratios = {}

  def ratio(name, value, target):
    ratios[name] = {"value": value, "target": target, "status": check(value, target)}

  b_over_a = paired_ratio(steps("B"), steps("A"))
  for graph in GRAPH_MODES:
    ratio(f"C-{mode_name(graph)}/B step", paired_ratio(steps(f"C-{mode_name(graph)}"),
                                                        steps("B")), 1.05)
  ratio("D/B step", paired_ratio(steps("D"), steps("B")), 1.05)
  ratios["B/A step"] = {"value": b_over_a, "target": None, "status": "info"}
  ratio("D/A step (cap 64)", paired_ratio(steps("D"), steps("A")), max(1.15, b_over_a))
  for name in ("C-graph", "D"):
    ratio(f"{name} step cap 4096/16", paired_ratio(steps(f"{name}@4096"), steps(f"{name}@16")),
          1.10)
  tiny_ref = dispatch["jax.jit apply+buffers@16"]["samples_us"]
  ratio("D dispatch / jax.jit apply+buffers", paired_ratio(dispatch["D@16"]["samples_us"],
                                                           tiny_ref), 2.0)
  ratio("D dispatch / jax.jit apply", paired_ratio(dispatch["D@16"]["samples_us"],
                                                   dispatch["jax.jit apply"]["samples_us"]), 2.0)
  for name in ("D", "C-graph donate", "C-graph"):
    ratio(f"{name} per call cap 4096/16", paired_ratio(per_call[f"{name}@4096"]["samples_us"],
                                                       per_call[f"{name}@16"]["samples_us"]),
          1.10)
  for name in ("C", "D"):
    ratios[f"{name} temp - A temp <= buffer bytes"] = {
        "value": memory[name]["temp_minus_A"], "target": memory["buffer_bytes"],
        "status": check(memory[name]["temp_minus_A"], memory["buffer_bytes"])}
  ratio("lb.lazy_init / bridge.lazy_init",
        paired_ratio(lazy_samples["lb.lazy_init"], lazy_samples["bridge.lazy_init"]), 1.5)

  result = {
      "command": "python benchmarks/bench_recording.py" + (" --quick" if args.quick else ""),
      "rounds": args.rounds,
      "versions": {"python": platform.python_version(), "jax": jax.__version__,
                   "jaxlib": getattr(__import__("jaxlib"), "__version__", "?"),
                   "flax": flax.__version__, "loopbridge": lb.__version__},
      "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                  "device": str(jax.devices()[0])},
      "model": {"width": WIDTH, "depth": DEPTH, "batch": BATCH, "steps": [SHORT, LONG],
                "capacity": MAIN_CAPACITY},
      "loops": loops, "dispatch_tiny": dispatch, "per_call_wide": per_call, "memory": memory,
      "lazy_init": lazy, "ratios": ratios,
      "seconds": time.perf_counter() - started,
  }
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print(render(result))
  return result


def render(r: dict) -> str:
  v = r["versions"]
  lines = [
      f"`{r['command']}` — jax {v['jax']}, flax {v['flax']}, {r['machine']['cpus']} CPUs, "
      f"{r['rounds']} rounds, {r['seconds']:.0f}s. Model: seed-000 MLP, width {WIDTH}, "
      f"depth {DEPTH}, batch {BATCH}.",
      "",
      f"Loops (per step = (t{LONG} - t{SHORT}) / {LONG - SHORT}, median; capacity "
      f"{MAIN_CAPACITY} unless @cap)",
      "",
      f"| scenario | per step µs | t{SHORT} ms | t{LONG} ms |",
      "|---|---:|---:|---:|",
  ]
  for name, d in r["loops"].items():
    lines.append(f"| {name} | {d['per_step_us']:.1f} | {d[f't{SHORT}_ms']:.2f} | "
                 f"{d[f't{LONG}_ms']:.2f} |")
  lines += ["", "Per call of one jitted step (µs, median)", "",
            "| step | tiny model (width 8, depth 3, batch 1) | wide model |", "|---|---:|---:|"]
  names = list(dict.fromkeys([*r["dispatch_tiny"], *r["per_call_wide"]]))
  for name in names:
    tiny = r["dispatch_tiny"].get(name)
    wide = r["per_call_wide"].get(name)
    lines.append(f"| {name} | {tiny['per_call_us']:.0f} | " if tiny else f"| {name} | | ")
    lines[-1] += f"{wide['per_call_us']:.0f} |" if wide else " |"
  mem = r["memory"]
  lines += ["", f"Compiled memory of the capacity-{MAIN_CAPACITY} loop (bytes; buffers: "
            f"{mem['buffer_bytes']})", "",
            "| loop | argument | output | alias | temp |", "|---|---:|---:|---:|---:|"]
  for name in ("A", "B", "C", "D"):
    m = mem[name]
    lines.append(f"| {name} | {m['argument']} | {m['output']} | {m['alias']} | {m['temp']} |")
  lines += ["", "lazy_init wall time (ms, median): " + ", ".join(
      f"{k} {d['wall_ms']:.0f}" for k, d in r["lazy_init"].items()), "",
            "| ratio (paired medians) | value | target | |", "|---|---:|---:|---|"]
  for name, d in r["ratios"].items():
    value, target = d["value"], d["target"]
    fmt = (lambda z: f"{z:.3f}") if isinstance(value, float) else str
    lines.append(f"| {name} | {fmt(value)} | "
                 f"{'' if target is None else ('≤ ' + fmt(target))} | {d['status']} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
