"""What `lb.checkpoint.linen_to_nnx` / `nnx_to_linen` cost against the same job done by hand.

Model: a transformer-shaped Linen model (token embedding, `--layers` pre-norm blocks in an
`nn.scan` stack along axis 0 with attention projections `q`/`k`/`v`/`o` and an MLP `up`/`down`,
a final norm and a head) and its hand NNX port keeping Linen's layout (same attribute names, an
`nnx.vmap`-built stack run by `nnx.scan`). The defaults give ~98M parameters (width 768, ffn
3072, 12 layers, vocabulary 8192: GPT-2 small's blocks); `--quick` is a tiny smoke run.

The hand path is the floor: the Linen params *are* the port's state for this layout, so
linen -> nnx is `nnx.update(port, params)` and nnx -> linen is the port's pure state dict.

- **Time**: every case runs once as a warm-up, then in interleaved rounds (each round runs
  every case once, in rotating order, so load from other processes hits all of them alike).
  Reported: the median wall time per case (with its range) and the median of the
  per-round ratios (converter / hand, paired within a round): medians, because one round
  slowed by another process moves neither. Also the warm-up's own time ("first call": what
  a process that converts once pays, compilation included; the nnx -> linen warm-up runs
  after linen -> nnx's, in the same process).
- **Peak memory**: each case runs in a fresh child process. The child builds the Linen
  variables and the port, collects garbage, reads its resident set (VmRSS), resets the
  kernel's high-water mark (`/proc/self/clear_refs`, Linux), runs the case once and reads
  the high-water mark (VmHWM). Reported: the peak resident set of the case, and the part of
  it above what the process held before (the case's own extra memory). Median over
  `--memory-runs` children per case.
- **Where the time goes**: `cProfile` of one conversion per direction: the loopbridge
  functions with the largest cumulative time, and jax's abstract evaluation (`eval_shape`,
  the models' traced runs) beside them. No private name is imported, so the benchmark runs
  unchanged after the converter's internals change.
- **Context**, timed in the same rounds: one abstract run of each model (`jax.eval_shape` of
  the Linen `init` and of the port's call: what the converter's pairing runs at least once),
  and reading the same params from a local orbax checkpoint (what `loopbridge convert` does
  before converting: the hand floor moves no bytes, a real conversion always reads them).

Run:  python benchmarks/bench_convert.py [--quick] [--rounds 9] [--memory-runs 3]
Writes benchmarks/results/convert.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
import typing as tp

import flax
import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

import loopbridge as lb

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("hand linen->nnx", "lb.linen_to_nnx", "hand nnx->linen", "lb.nnx_to_linen")
READ = "orbax read of the params (context)"
TRACE_LINEN = "jax.eval_shape of the Linen init (context)"
TRACE_PORT = "jax.eval_shape of the port's call (context)"
CONTEXT = (TRACE_LINEN, TRACE_PORT, READ)


class Sizes(tp.NamedTuple):
  width: int
  ffn: int
  layers: int
  heads: int
  vocab: int


# --- the models -----------------------------------------------------------------------------


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, heads: int) -> jax.Array:
  b, t, d = q.shape
  split = lambda a: a.reshape(b, t, heads, d // heads)  # noqa: E731
  logits = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / jnp.sqrt(d // heads)
  mask = jnp.tril(jnp.ones((t, t), bool))
  weights = jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", weights, split(v)).reshape(b, t, d)


class LinenBlock(nn.Module):
  sizes: Sizes

  @nn.compact
  def __call__(self, x, _):
    s = self.sizes
    h = nn.LayerNorm(name="ln1")(x)
    q, k, v = (nn.Dense(s.width, name=n)(h) for n in ("q", "k", "v"))
    x = x + nn.Dense(s.width, name="o")(_attend(q, k, v, s.heads))
    h = nn.LayerNorm(name="ln2")(x)
    x = x + nn.Dense(s.width, name="down")(nn.gelu(nn.Dense(s.ffn, name="up")(h)))
    return x, None


class LinenModel(nn.Module):
  sizes: Sizes

  @nn.compact
  def __call__(self, tokens):
    s = self.sizes
    x = nn.Embed(s.vocab, s.width, name="embed")(tokens)
    stack = nn.scan(
      LinenBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=s.layers
    )
    x, _ = stack(s, name="layers")(x, None)
    return nn.Dense(s.vocab, name="head")(nn.LayerNorm(name="ln_f")(x))


class PortBlock(nnx.Module):
  def __init__(self, s: Sizes, rngs: nnx.Rngs):
    self.heads = s.heads
    self.ln1 = nnx.LayerNorm(s.width, rngs=rngs)
    self.q = nnx.Linear(s.width, s.width, rngs=rngs)
    self.k = nnx.Linear(s.width, s.width, rngs=rngs)
    self.v = nnx.Linear(s.width, s.width, rngs=rngs)
    self.o = nnx.Linear(s.width, s.width, rngs=rngs)
    self.ln2 = nnx.LayerNorm(s.width, rngs=rngs)
    self.up = nnx.Linear(s.width, s.ffn, rngs=rngs)
    self.down = nnx.Linear(s.ffn, s.width, rngs=rngs)

  def __call__(self, x):
    h = self.ln1(x)
    x = x + self.o(_attend(self.q(h), self.k(h), self.v(h), self.heads))
    return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class Port(nnx.Module):
  def __init__(self, s: Sizes, rngs: nnx.Rngs):
    self.embed = nnx.Embed(s.vocab, s.width, rngs=rngs)

    @nnx.split_rngs(splits=s.layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return PortBlock(s, rngs)

    self.layers = make(rngs)
    self.ln_f = nnx.LayerNorm(s.width, rngs=rngs)
    self.head = nnx.Linear(s.width, s.vocab, rngs=rngs)

  def __call__(self, tokens):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, block):
      return block(x)

    return self.head(self.ln_f(run(self.embed(tokens), self.layers)))


def _setup(s: Sizes):
  """(Linen module, its variables, the port, sample tokens): nothing converted yet."""
  tokens = jnp.zeros((1, 8), jnp.int32)
  linen = LinenModel(s)
  variables = jax.jit(linen.init)(jax.random.key(0), tokens)
  port = Port(s, nnx.Rngs(1))
  jax.block_until_ready((variables, nnx.state(port)))
  return linen, variables, port, tokens


def _case(name: str, linen, variables, port, tokens) -> tp.Callable[[], object]:
  """One job as a function of nothing; each returns what it produced (blocked on)."""
  jobs: dict[str, tp.Callable[[], object]] = {
    "hand linen->nnx": lambda: (nnx.update(port, dict(variables["params"])), nnx.state(port)),
    "lb.linen_to_nnx": lambda: (
      lb.checkpoint.linen_to_nnx(linen, variables, port, tokens),
      nnx.state(port),
    ),
    "hand nnx->linen": lambda: {"params": nnx.state(port, nnx.Param).to_pure_dict()},
    "lb.nnx_to_linen": lambda: lb.checkpoint.nnx_to_linen(port, linen, tokens),
  }
  run = jobs[name]
  return lambda: jax.block_until_ready(jax.tree.leaves(run()))


def _orbax_read(variables, directory: str) -> tp.Callable[[], object]:
  """Reading the params back from an orbax checkpoint written once here (the context row)."""
  import orbax.checkpoint as ocp  # flax depends on it

  checkpointer = ocp.StandardCheckpointer()
  path = os.path.join(directory, "params")
  checkpointer.save(path, variables["params"])
  checkpointer.wait_until_finished()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), variables["params"]
  )
  return lambda: jax.block_until_ready(checkpointer.restore(path, target))


def _traces(linen, port, tokens) -> dict[str, tp.Callable[[], object]]:
  """One abstract run of each model, as the converter's pairing runs them (context rows)."""
  graphdef, state = nnx.split(port)
  return {
    TRACE_LINEN: lambda: jax.eval_shape(lambda: linen.init(jax.random.key(0), tokens)),
    TRACE_PORT: lambda: jax.eval_shape(lambda s: nnx.merge(graphdef, s)(tokens), state),
  }


def _param_count(variables) -> int:
  return sum(int(a.size) for a in jax.tree.leaves(variables))


# --- peak memory (child processes) ----------------------------------------------------------


def _status_kb(field: str) -> int:
  with open("/proc/self/status", encoding="ascii") as f:
    return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))  # type: ignore[union-attr]


def child(case: str, s: Sizes) -> None:
  """Run one case once in this fresh process; print its memory as one JSON line."""
  linen, variables, port, tokens = _setup(s)
  job = _case(case, linen, variables, port, tokens)
  gc.collect()
  before = _status_kb("VmRSS")
  with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
    f.write("5")  # the high-water mark restarts from the current resident set
  out = job()
  peak = _status_kb("VmHWM")
  del out
  print(json.dumps({"case": case, "before_kb": before, "peak_kb": peak}))


def _memory(s: Sizes, runs: int) -> dict[str, dict[str, float]]:
  found: dict[str, list[dict[str, int]]] = {c: [] for c in CASES}
  argv = [f"--{k}={v}" for k, v in s._asdict().items()]
  env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
  for r in range(runs):
    for case in CASES[r % len(CASES) :] + CASES[: r % len(CASES)]:
      done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", case, *argv],
        capture_output=True,
        text=True,
        env=env,
        check=True,
      )
      found[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
  return {
    c: {
      "peak_mb": statistics.median(m["peak_kb"] for m in ms) / 1024,
      "extra_mb": statistics.median(m["peak_kb"] - m["before_kb"] for m in ms) / 1024,
    }
    for c, ms in found.items()
  }


# --- time and profile -----------------------------------------------------------------------


def _times(
  jobs: dict[str, tp.Callable[[], object]], rounds: int
) -> tuple[dict[str, float], dict[str, list[float]]]:
  """(the first call's seconds, the timed rounds' seconds) per case."""
  first: dict[str, float] = {}
  for name, job in jobs.items():
    gc.collect()
    start = time.perf_counter()
    job()  # warm-up: jax's caches, first traces (what a process converting once pays)
    first[name] = time.perf_counter() - start
  times: dict[str, list[float]] = {c: [] for c in jobs}
  names = list(jobs)
  for r in range(rounds):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      gc.collect()
      start = time.perf_counter()
      jobs[name]()
      times[name].append(time.perf_counter() - start)
  return first, times


def _spread(seconds: list[float]) -> str:
  return f"{min(seconds):.4f}-{max(seconds):.4f}"


def _profile(job: tp.Callable[[], object], top: int) -> list[tuple[str, float]]:
  """(function, cumulative seconds) of the loopbridge functions and jax's eval_shape."""
  profile = cProfile.Profile()
  profile.enable()
  job()
  profile.disable()
  stats = pstats.Stats(profile)
  rows = []
  for (filename, _line, func), (*_, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
    if "loopbridge" in filename and "benchmarks" not in filename:
      where = filename.split("loopbridge" + os.sep)[-1]
      rows.append((f"{where}:{func}", cumulative))
    elif func == "eval_shape" and "jax" in filename:
      rows.append(("jax.eval_shape (abstract runs of the models)", cumulative))
  rows.sort(key=lambda r: -r[1])
  seen: set[str] = set()  # older jax nests one eval_shape in another: the outer one counts
  return [r for r in rows if not (r[0] in seen or seen.add(r[0]))][:top]


def main() -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="tiny model, few rounds (smoke run)")
  parser.add_argument("--width", type=int, default=768)
  parser.add_argument("--ffn", type=int, default=3072)
  parser.add_argument("--layers", type=int, default=12)
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--vocab", type=int, default=8192)
  parser.add_argument("--rounds", type=int, default=9)
  parser.add_argument("--memory-runs", type=int, default=3)
  parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
  parser.add_argument("--out", default=os.path.join(HERE, "results", "convert.json"))
  args = parser.parse_args()
  if args.quick:
    args.width, args.ffn, args.layers, args.heads, args.vocab = 32, 64, 2, 2, 64
    args.rounds, args.memory_runs = 3, 1
  s = Sizes(args.width, args.ffn, args.layers, args.heads, args.vocab)
  if args.child:
    child(args.child, s)
    return

  load = os.getloadavg()
  linen, variables, port, tokens = _setup(s)
  params = _param_count(variables)
  print(f"model: {params / 1e6:.1f}M parameters {s._asdict()}", flush=True)
  jobs = {c: _case(c, linen, variables, port, tokens) for c in CASES}
  jobs |= _traces(linen, port, tokens)
  with tempfile.TemporaryDirectory() as directory:
    jobs[READ] = _orbax_read(variables, directory)
    first, times = _times(jobs, args.rounds)
  for name in CONTEXT:
    del jobs[name]
  ratios = {
    conv: statistics.median(a / b for a, b in zip(times[conv], times[hand]))
    for hand, conv in ((CASES[0], CASES[1]), (CASES[2], CASES[3]))
  }
  profiles = {c: _profile(jobs[c], 8) for c in (CASES[1], CASES[3])}
  del jobs, linen, variables, port
  gc.collect()
  memory = _memory(s, args.memory_runs)

  # Medians (and the range beside them): one slow round on a shared machine moves neither.
  print(f"\n{args.rounds} rounds; load average at the start {load[0]:.1f}, at the end", end=" ")
  print(f"{os.getloadavg()[0]:.1f}")
  print(
    "\n| case | wall s (median) | min-max s | first call s | / hand | peak RSS MB | extra MB "
    "| peak / hand |"
  )
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  for hand, conv in ((CASES[0], CASES[1]), (CASES[2], CASES[3])):
    for c in (hand, conv):
      t = statistics.median(times[c])
      ratio = f"{ratios[conv]:.2f}" if c == conv else "1"
      peak = memory[c]["peak_mb"] / memory[hand]["peak_mb"]
      print(
        f"| {c} | {t:.4f} | {_spread(times[c])} | {first[c]:.4f} | {ratio} "
        f"| {memory[c]['peak_mb']:.0f} "
        f"| {memory[c]['extra_mb']:.0f} | {peak:.2f} |"
      )
  for name in CONTEXT:
    t = statistics.median(times[name])
    print(f"| {name} | {t:.4f} | {_spread(times[name])} | {first[name]:.4f} | | | | |")
  for c, rows in profiles.items():
    print(f"\nwhere {c} spends its time (cProfile, cumulative s, one run):")
    for name, seconds in rows:
      print(f"  {seconds:8.4f}  {name}")

  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(
      {
        "sizes": s._asdict(),
        "parameters": params,
        "rounds": args.rounds,
        "memory_runs": args.memory_runs,
        "times_s": times,
        "time_median_s": {c: statistics.median(t) for c, t in times.items()},
        "time_first_call_s": first,
        "time_ratio_median": ratios,
        "memory": memory,
        "profiles": profiles,
        "versions": {
          "python": platform.python_version(),
          "jax": jax.__version__,
          "flax": flax.__version__,
        },
        "loadavg_start": load,
        "loadavg": os.getloadavg(),
      },
      f,
      indent=2,
    )
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
