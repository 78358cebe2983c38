"""What recording every `sow` costs, side by side with the hand-written loop.

One process, every scenario compiled once, then timed in interleaved rounds (the scenario order
rotates each round) so that load from other processes hits all of them alike; reported numbers
are medians over rounds, and ratios are medians of per-round ratios (paired).

Model: the MLP of `examples/sow_in_while_loop.py` (a top-level sow and a sow inside an `nn.scan`
body of Dense + relu),
widened to width 256, depth 6, batch 32.

Scenarios (loops of 50 and 500 steps; the loop length is a traced argument, so both lengths run
the same executable and "per step" is the marginal cost (t500 - t50) / 450, free of per-call
costs):
  A  jax.lax.while_loop around linen apply, nothing recorded (the floor)
  B  the hand-written loop: linen apply(mutable=['intermediates']) writing each sown value into a
     preallocated buffer with dynamic_update_index_in_dim, buffers donated (the practical limit)
  C  lb.ToNNX in nnx.while_loop under nnx.jit (graph mode; tree mode where flax has graph=);
     "C-graph donate" is the same with nnx.jit(donate_argnums=0)
  D  lb.compile_step around the same nnx.while_loop (split once, jax.jit, state donated)
  lb.while_loop (eager): lb.while_loop called from Python, outside any jit
The main loops record every step (capacity MAIN_CAPACITY > the long loop).
C-graph donate and D also run at capacity 16 and 4096 under each overflow policy ("D drop@16").
Roofline section: A, B, D and
  W  loop A plus a dynamic_update_index_in_dim of every sown array's bytes (values the step
     already has, no Linen sow machinery): what XLA's slot write of the sown bytes costs alone
in three times the rounds, with an in-place pass over a buffer-sized array measuring this
machine's copy bandwidth in the same rounds (recording's extra time per step against moving
every sown byte once). Ratios carry a 90% bootstrap interval over rounds.

Run:  python benchmarks/bench_recording.py [--quick]
Writes benchmarks/results/recording.json (medians and ratios) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import subprocess
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
# Larger than the long loop: every timed step of the main loops records (past the capacity,
# 'error'/'drop' keep rewriting one hot slot, which is cheaper and is not what users time).
MAIN_CAPACITY = 512
LAZY_INIT_CAPACITY = 64  # lazy_init times declaration, not the zero-filling of large buffers
CAPACITIES = (16, 256, 4096)
POLICIES = ("error", "drop", "wrap")  # "error" is the default; its rows carry no policy name
GRAPH_MODES = (True, False) if _compat.HAS_GRAPH_SWITCH else (True,)


class Block(nn.Module):
  """The scan body of `examples/sow_in_while_loop.py`: Dense + relu, sows its carry."""

  features: int

  @nn.compact
  def __call__(self, carry, unused_inputs):
    carry = nn.relu(nn.Dense(self.features)(carry))
    self.sow("intermediates", "carry", carry)
    return carry, None


class MLP(nn.Module):
  """The model of `examples/sow_in_while_loop.py`: a top-level sow and a sow in an `nn.scan`."""

  depth: int
  features: int

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    scan_block = nn.scan(
      Block,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      length=self.depth,
    )(self.features)
    carry, _ = scan_block(x, None)
    return carry


def graph_kw(graph: bool) -> dict:
  return {"graph": graph} if _compat.HAS_GRAPH_SWITCH else {}


def mode_name(graph: bool) -> str:
  return "graph" if graph else "tree"


# ------------------------------------------------------------------------------ the scenarios
def write_sows(bx, bc, state, kx, kc):
  """The hand-written recording: each value one `apply(..., mutable=...)` sowed into its slot."""
  sown = state["intermediates"]
  bx = jax.lax.dynamic_update_index_in_dim(bx, sown["x"][0], kx, 0)
  bc = jax.lax.dynamic_update_index_in_dim(bc, sown["ScanBlock_0"]["carry"][0], kc, 0)
  return bx, bc


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
      bx, bc = write_sows(bx, bc, state, k, k)
      return i + 1, y, (bx, bc, k + 1)

    _, h, rec = jax.lax.while_loop(lambda c: c[0] < n, body, (0, x, rec))
    return h, rec

  return jax.jit(loop_a), jax.jit(loop_b, donate_argnums=1)


def slot_write_loop(module: nn.Module):
  """W: loop A plus one slot write per sown array, of values the step already has.

  The same bytes as recording, written by the same XLA op (`dynamic-update-slice`), with no
  Linen sow machinery (no `nn.scan` stacking): what writing the sown bytes costs on its own.
  """

  def loop_w(params, rec, x, n):
    def body(c):
      i, h, (bx, bc, k) = c
      y = module.apply(params, h)
      bx = jax.lax.dynamic_update_index_in_dim(bx, h, k, 0)
      bc = jax.lax.dynamic_update_index_in_dim(bc, jnp.broadcast_to(y, bc.shape[1:]), k, 0)
      return i + 1, y, (bx, bc, k + 1)

    _, h, rec = jax.lax.while_loop(lambda c: c[0] < n, body, (0, x, rec))
    return h, rec

  return jax.jit(loop_w, donate_argnums=1)


def functional_steps(module: nn.Module):
  """One call, functional: plain apply, and apply writing the sows into donated buffers."""

  def step_a(params, x):
    return module.apply(params, x)

  def step_b(params, rec, x):
    y, state = module.apply(params, x, mutable=["intermediates"])
    bx, bc, k = rec
    bx, bc = write_sows(bx, bc, state, k, k)
    return y, (bx, bc, k + 1)

  def step_b_same_state(params, rec, x):
    # The state an lb.ToNNX built with `rngs=` keeps: one count vector for the recorder's two
    # sites and the rng stream's counter, which stock flax.nnx.bridge.ToNNX advances on every
    # call (it draws a key from each stream it holds, used or not).
    y, state = module.apply(params, x, mutable=["intermediates"])
    bx, bc, counts, rng_count = rec
    bx, bc = write_sows(bx, bc, state, counts[0], counts[1])
    return y, (bx, bc, counts + 1, rng_count + 1)

  return (
    jax.jit(step_a),
    jax.jit(step_b, donate_argnums=1),
    jax.jit(step_b_same_state, donate_argnums=1),
  )


def new_records(capacity: int, depth: int, batch: int, width: int):
  return (
    jnp.zeros((capacity, batch, width)),
    jnp.zeros((capacity, depth, batch, width)),
    jnp.zeros((), jnp.int32),
  )


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


def new_model(module: nn.Module, x, capacity: int, overflow: str = "error") -> lb.ToNNX:
  model = lb.ToNNX(module, rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=capacity, overflow=overflow)
  return model


def policy_name(overflow: str) -> str:
  return "" if overflow == "error" else f" {overflow}"


def sown_bytes_per_step(model) -> int:
  """Bytes one call sows (every buffer's slot size): what recording must move per step."""
  return sum(
    int(np.prod(b.shape[1:])) * b.dtype.itemsize
    for b in jax.tree_util.tree_leaves(lb.buffers(model))
  )


class CopyBandwidth:
  """One in-place elementwise pass over a donated array: reads and writes every byte once.

  Its bytes moved (read + written) per second is the copy bandwidth the roofline row divides
  by; the array is as large as the main loop's buffers (MAIN_CAPACITY), the memory the
  recording loop writes.
  """

  def __init__(self, nbytes: int):
    self.array = jnp.zeros((max(1, nbytes // 4),), jnp.float32)
    self.nbytes = self.array.size * 4
    self.fn = jax.jit(lambda a: a * 0.5 + 1.0, donate_argnums=0)

  def __call__(self):
    self.array = self.fn(self.array)
    return self.array


class Stateful:
  """Holds a donated record tuple between calls of a functional loop/step (as users must)."""

  def __init__(self, fn, params, rec):
    self.fn, self.params, self.rec = fn, params, rec

  def __call__(self, *args):
    out, self.rec = self.fn(self.params, self.rec, *args)
    return out


# ------------------------------------------------------------------------------ timing
# Every sample is taken on two clocks: wall time, and this process's CPU time (all threads).
# On a shared machine other processes stretch wall time by whole scheduler slices; CPU time
# only counts the work this process did, so its ratios are the stable ones (see README).
CLOCKS = ("cpu", "wall")


def timed(fn: tp.Callable[[], tp.Any], calls: int = 1) -> np.ndarray:
  """Seconds per call as [cpu, wall] (calls run back to back, then one block).

  The garbage collector is off while timing (as in `timeit`): a full collection triggered by
  the garbage of an earlier scenario (nnx.jit allocates many small objects) would otherwise be
  charged to whichever scenario happens to run next.
  """
  gc.disable()
  try:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
      out = fn()
    jax.block_until_ready(out)
    return np.array([time.process_time() - cpu, time.perf_counter() - wall]) / calls
  finally:
    gc.enable()


def calls_for(fn: tp.Callable[[], tp.Any], target_s: float, max_calls: int = 1000) -> int:
  """How many back-to-back calls make one sample last about `target_s` (at least one)."""
  one = timed(fn)[1]
  return max(1, min(max_calls, int(target_s / max(one, 1e-6))))


def run_rounds(
  cases: dict[str, tp.Callable[[], np.ndarray]], rounds: int
) -> dict[str, list[np.ndarray]]:
  """Run every case once per round, rotating the order each round; return all samples."""
  names = list(cases)
  samples: dict[str, list[np.ndarray]] = {name: [] for name in names}
  for r in range(rounds if names else 0):
    order = names[r % len(names) :] + names[: r % len(names)]
    for name in order:
      samples[name].append(cases[name]())
  return samples


def per_clock(values: tp.Sequence[np.ndarray], scale: float = 1.0) -> dict[str, float]:
  """Median per clock."""
  arr = np.asarray(values) * scale
  return {clock: float(np.median(arr[:, k])) for k, clock in enumerate(CLOCKS)}


def bootstrap_interval(per_round: np.ndarray, draws: int = 2000) -> dict[str, list[float]]:
  """90% bootstrap interval of the median over rounds, per clock (rounds resampled)."""
  rng = np.random.default_rng(0)
  values = np.asarray(per_round)
  picks = rng.integers(0, len(values), size=(draws, len(values)))
  medians = np.median(values[picks], axis=1)
  return {
    clock: [float(np.percentile(medians[:, k], 5)), float(np.percentile(medians[:, k], 95))]
    for k, clock in enumerate(CLOCKS)
  }


def paired_ratio(num: tp.Sequence[np.ndarray], den: tp.Sequence[np.ndarray]) -> dict[str, float]:
  """Median over rounds of num/den, per clock (samples of the same round are paired)."""
  r = np.asarray(num) / np.asarray(den)
  return {clock: float(np.median(r[:, k])) for k, clock in enumerate(CLOCKS)}


def loop_case(fn):
  """Sample = marginal per-step cost [cpu, wall] and the two totals, of one executable."""

  def sample():
    short, long = timed(lambda: fn(SHORT)), timed(lambda: fn(LONG))
    return np.stack([(long - short) / (LONG - SHORT), short, long])

  return sample


# ------------------------------------------------------------------------------ sections
def bench_loops(args, module, params, x) -> dict:
  """A, B, C, D at capacity 64, then C/D at capacities 16/256/4096 (one model per capacity).

  Loops that copy their buffers on every call (no donation) allocate up to 2 GB per call at
  capacity 4096, which disturbs whatever runs next; they are timed in their own rounds.
  """
  loop_a, loop_b = functional_loops(module)
  rec_b = Stateful(loop_b, params, new_records(MAIN_CAPACITY, DEPTH, BATCH, WIDTH))
  models = {cap: new_model(module, x, cap) for cap in (MAIN_CAPACITY, *CAPACITIES)}
  cases: dict[str, tp.Callable] = {
    "A": lambda n: loop_a(params, x, n),
    "B": lambda n: rec_b(x, n),
  }
  copying: dict[str, tp.Callable] = {}
  for cap, model in models.items():
    suffix = "" if cap == MAIN_CAPACITY else f"@{cap}"
    for graph in GRAPH_MODES:
      if cap != MAIN_CAPACITY and not graph:
        continue
      jitted = nnx.jit(nnx_loop(graph), **graph_kw(graph))
      (cases if cap == MAIN_CAPACITY else copying)[f"C-{mode_name(graph)}{suffix}"] = (
        functools.partial(lambda n, jitted=jitted, model=model: jitted(model, x, n))
      )
    if cap != MAIN_CAPACITY:
      donating = nnx.jit(nnx_loop(True), donate_argnums=0)
      cases[f"C-graph donate{suffix}"] = functools.partial(
        lambda n, jitted=donating, model=model: jitted(model, x, n)
      )
    # D runs on a model of its own (see bench_calls).
    step = lb.compile_step(nnx_loop(True), new_model(module, x, cap))
    cases[f"D{suffix}"] = functools.partial(lambda n, step=step: step(x, n))
  for overflow in POLICIES[1:]:  # the other policies at the smallest and largest capacity
    for cap in (CAPACITIES[0], CAPACITIES[-1]):
      donating = nnx.jit(nnx_loop(True), donate_argnums=0)
      model = new_model(module, x, cap, overflow)
      cases[f"C-graph donate{policy_name(overflow)}@{cap}"] = functools.partial(
        lambda n, jitted=donating, model=model: jitted(model, x, n)
      )
      step = lb.compile_step(nnx_loop(True), new_model(module, x, cap, overflow))
      cases[f"D{policy_name(overflow)}@{cap}"] = functools.partial(lambda n, step=step: step(x, n))
  if hasattr(lb, "while_loop"):
    model = models[MAIN_CAPACITY]

    def eager(n):
      return lb.while_loop(_cond_n, _body_n, (model, x, 0, n))[1]

    copying["lb.while_loop (eager)"] = eager
  t0 = time.perf_counter()
  for fn in (*cases.values(), *copying.values()):  # compile and settle donation, untimed
    jax.block_until_ready(fn(SHORT))
  print(
    f"  compiled {len(cases) + len(copying)} loops in {time.perf_counter() - t0:.1f}s",
    file=sys.stderr,
  )
  samples = run_rounds({name: loop_case(fn) for name, fn in cases.items()}, args.rounds)
  samples.update(
    run_rounds({name: loop_case(fn) for name, fn in copying.items()}, max(3, args.rounds // 3))
  )
  return loop_results(samples)


def loop_results(samples: dict[str, list[np.ndarray]]) -> dict:
  return {
    name: {
      "per_step_us": per_clock([x[0] for x in v], 1e6),
      f"t{SHORT}_ms": per_clock([x[1] for x in v], 1e3),
      f"t{LONG}_ms": per_clock([x[2] for x in v], 1e3),
      "samples": [x[0] for x in v],
    }
    for name, v in samples.items()
    if name != "copy"
  }


def bench_roofline(args, module, params, x) -> dict:
  """A, W, B and D only, with three times the rounds, and the copy bandwidth in each round.

  Recording adds a few percent to a step (tens of µs on ~600): the difference of two loop
  timings, which needs more rounds than the other rows to be told apart from noise.
  """
  loop_a, loop_b = functional_loops(module)
  rec_b = Stateful(loop_b, params, new_records(MAIN_CAPACITY, DEPTH, BATCH, WIDTH))
  rec_w = Stateful(slot_write_loop(module), params, new_records(MAIN_CAPACITY, DEPTH, BATCH, WIDTH))
  model = new_model(module, x, MAIN_CAPACITY)
  step = lb.compile_step(nnx_loop(True), model)
  cases = {
    "A": lambda n: loop_a(params, x, n),
    "W": lambda n: rec_w(x, n),
    "B": lambda n: rec_b(x, n),
    "D": lambda n: step(x, n),
  }
  for fn in cases.values():
    jax.block_until_ready(fn(SHORT))
  copy = CopyBandwidth(lb.sow_sites(model).buffer_bytes)
  jax.block_until_ready(copy())
  passes = calls_for(copy, args.sample_s * 5)
  timers = {name: loop_case(fn) for name, fn in cases.items()}
  timers["copy"] = lambda: np.stack([timed(copy, passes)] * 3)  # per pass, in loop_case's shape
  samples = run_rounds(timers, 3 * args.rounds)
  out = loop_results(samples)
  per_pass = [x[0] for x in samples["copy"]]
  out["copy"] = {
    "bytes": copy.nbytes,
    "GBps": per_clock([2 * copy.nbytes / t / 1e9 for t in per_pass]),
    "sown_bytes_per_step": sown_bytes_per_step(model),
    "samples": per_pass,
  }
  return out


def _cond_n(c):
  return c[2] < c[3]


def _body_n(c):
  model, h, i, n = c
  return model, model(h), i + 1, n


def bench_calls(args, module, x, *, capacities, tiny: bool) -> dict:
  """Per-call time of one jitted step: functional apply vs nnx.jit vs lb.compile_step.

  Steps that copy a large buffer on every call are timed in their own rounds (see bench_loops).
  """
  key = jax.random.key(1)
  params = module.init(key, x)
  params = {"params": params["params"]}
  step_a, step_b, step_b_same_state = functional_steps(module)
  depth, batch, width = module.depth, x.shape[0], x.shape[1]
  cases: dict[str, tp.Callable] = {"jax.jit apply": lambda: step_a(params, x)}
  copying: dict[str, tp.Callable] = {}
  for cap in capacities:
    suffix = f"@{cap}"
    rec = Stateful(step_b, params, new_records(cap, depth, batch, width))
    cases[f"jax.jit apply+buffers{suffix}"] = functools.partial(lambda rec: rec(x), rec)
    if tiny:
      same_state = (jnp.zeros((2,), jnp.int32), jnp.zeros((), jnp.uint32))
      rec_same = Stateful(
        step_b_same_state, params, (*new_records(cap, depth, batch, width)[:2], *same_state)
      )
      cases[f"jax.jit apply+buffers, count vector + rng counter{suffix}"] = functools.partial(
        lambda rec: rec(x), rec_same
      )
    model = new_model(module, x, cap)
    for graph in GRAPH_MODES:
      jitted = nnx.jit(nnx_step, **graph_kw(graph))
      (cases if tiny else copying)[f"C-{mode_name(graph)}{suffix}"] = functools.partial(
        lambda jitted, model: jitted(model, x), jitted, model
      )
      if not tiny:
        break  # tree mode costs the same per call on the wide model; once is enough
    donating = nnx.jit(nnx_step, donate_argnums=0)
    cases[f"C-graph donate{suffix}"] = functools.partial(
      lambda jitted, model: jitted(model, x), donating, model
    )
    # D gets a model of its own: sharing one with nnx.jit would time D on arrays that
    # nnx.jit just allocated, and interleave nnx.jit's bookkeeping with D's.
    step = lb.compile_step(nnx_step, new_model(module, x, cap))
    cases[f"D{suffix}"] = functools.partial(lambda step: step(x), step)
    if tiny:
      # rngs given to lazy_init only: the model keeps no rng stream, so its state is the
      # hand-written step's (buffers and counts).
      no_stream = lb.lazy_init(lb.ToNNX(module), x, capacity=cap, rngs=nnx.Rngs(0))
      step_no_stream = lb.compile_step(nnx_step, no_stream)
      cases[f"D, no rng stream{suffix}"] = functools.partial(lambda step: step(x), step_no_stream)
  timers, copy_timers = {}, {}
  for group, timer_group in ((cases, timers), (copying, copy_timers)):
    for name, fn in group.items():
      jax.block_until_ready(fn())
      timer_group[name] = functools.partial(timed, fn, calls_for(fn, args.sample_s))
  samples = run_rounds(timers, args.rounds)
  samples.update(run_rounds(copy_timers, max(3, args.rounds // 3)))
  return {name: {"per_call_us": per_clock(v, 1e6), "samples": v} for name, v in samples.items()}


def memory_stats(compiled) -> dict:
  stats = compiled.memory_analysis()
  return {
    k: int(getattr(stats, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp")
  }


def bench_memory(module, params, x) -> dict:
  """Compiled argument/output/alias/temp bytes of the main loops (MAIN_CAPACITY)."""
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
  buffer_bytes = sum(
    int(np.prod(b.shape)) * b.dtype.itemsize for b in jax.tree_util.tree_leaves(lb.buffers(model))
  )
  for name in ("C", "D"):
    out[name]["temp_minus_A"] = out[name]["temp"] - out["A"]["temp"]
  out["buffer_bytes"] = buffer_bytes
  return out


class SowingBlock(nn.Module):
  """A block with two sow sites (attention-like and MLP-like outputs)."""

  features: int

  @nn.compact
  def __call__(self, x):
    h = x + nn.Dense(self.features)(nn.LayerNorm()(x))
    self.sow("intermediates", "attn", h)
    h = h + nn.Dense(self.features)(nn.relu(nn.Dense(2 * self.features)(nn.LayerNorm()(h))))
    self.sow("intermediates", "mlp", h)
    return h


class ManySites(nn.Module):
  """12 blocks built in setup, 24 sow sites: the shape of a real decoder stack."""

  blocks: int = 12
  features: int = 64

  def setup(self):
    self.layers = [SowingBlock(self.features) for _ in range(self.blocks)]

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


def bench_lazy_init(args, cases_by_model: dict[str, tuple[nn.Module, tp.Any]]) -> dict:
  """lb.lazy_init vs bridge.lazy_init, paired per round, for each model."""
  cases = {}
  for label, (module, x) in cases_by_model.items():

    def ours(module=module, x=x):
      model = lb.ToNNX(module, rngs=nnx.Rngs(0))
      lb.lazy_init(model, x, capacity=LAZY_INIT_CAPACITY)
      return jax.tree_util.tree_leaves(nnx.state(model))

    def stock(module=module, x=x):
      model = bridge.ToNNX(module, rngs=nnx.Rngs(0))
      bridge.lazy_init(model, x)
      return jax.tree_util.tree_leaves(nnx.state(model))

    cases[f"lb.lazy_init {label}"] = functools.partial(timed, ours)
    cases[f"bridge.lazy_init {label}"] = functools.partial(timed, stock)
  for fn in cases.values():
    fn()
  samples = run_rounds(cases, max(5, args.rounds // 2))
  return {name: {"ms": per_clock(v, 1e3), "samples": v} for name, v in samples.items()}


def bench_plain_sow(args) -> dict:
  """Flax's own sow on a plain NNX module: loopbridge never imported vs imported and recording
  another module, each in a fresh process, alternated round by round."""
  worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_sow_worker.py")

  def run(mode):
    def sample():
      out = subprocess.run(
        [sys.executable, worker, mode], capture_output=True, text=True, check=True, timeout=600
      )
      d = json.loads(out.stdout.strip().splitlines()[-1])
      return np.array([d["cpu"], d["wall"]])

    return sample

  cases = {
    "plain sow, loopbridge recording elsewhere": run("loopbridge"),
    "plain sow, loopbridge not imported": run("plain"),
  }
  # Process-to-process noise is about ±10 % here: many short pairs, judged by their median.
  samples = run_rounds(cases, max(5, args.rounds // 2))
  return {name: {"us": per_clock(v, 1e6), "samples": v} for name, v in samples.items()}


# ------------------------------------------------------------------------------ report
def check(value: float, target: float) -> str:
  return "ok" if value <= target else "MISSED"


def main(argv: tp.Sequence[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="fewer rounds (about 2 minutes)")
  parser.add_argument("--rounds", type=int, default=None, help="timed rounds per scenario")
  parser.add_argument(
    "--judge",
    choices=CLOCKS,
    default="cpu",
    help="clock whose ratios are checked against the targets (default cpu)",
  )
  parser.add_argument(
    "--only",
    default=None,
    help="comma-separated sections to run: loops,roofline,calls,memory,lazy_init,"
    "plain_sow (default: all); ratios of sections not run are left out",
  )
  parser.add_argument(
    "--out",
    default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "recording.json"),
  )
  args = parser.parse_args(argv)
  if args.rounds is None:
    args.rounds = 5 if args.quick else 21
  args.sample_s = 0.01 if args.quick else 0.02  # one per-call sample lasts about this long
  started = time.perf_counter()

  module = MLP(depth=DEPTH, features=WIDTH)
  x = jax.random.normal(jax.random.key(0), (BATCH, WIDTH))
  params = {"params": module.init(jax.random.key(1), x)["params"]}

  only = (
    set(args.only.split(","))
    if args.only
    else {"loops", "roofline", "calls", "memory", "lazy_init", "plain_sow"}
  )
  loops = roofline = dispatch = per_call = memory = lazy = plain_sow = {}
  if "loops" in only:
    print("loops ...", file=sys.stderr)
    loops = bench_loops(args, module, params, x)
  if "roofline" in only:
    print("roofline ...", file=sys.stderr)
    roofline = bench_roofline(args, module, params, x)
  if "calls" in only:
    print("per-call, tiny model ...", file=sys.stderr)
    tiny_module, tiny_x = MLP(depth=3, features=8), jnp.ones((1, 8))
    dispatch = bench_calls(args, tiny_module, tiny_x, capacities=(16,), tiny=True)
    print("per-call, wide model ...", file=sys.stderr)
    per_call = bench_calls(args, module, x, capacities=(16, 4096), tiny=False)
  if "memory" in only:
    print("memory ...", file=sys.stderr)
    memory = bench_memory(module, params, x)
  if "lazy_init" in only:
    print("lazy_init ...", file=sys.stderr)
    lazy = bench_lazy_init(
      args,
      {
        "2 sites": (module, x),
        "24 sites": (ManySites(), jax.random.normal(jax.random.key(2), (BATCH, 64))),
      },
    )
  if "plain_sow" in only:
    print("plain NNX sow ...", file=sys.stderr)
    plain_sow = bench_plain_sow(args)

  ratios = {}

  def info(name, value, interval=None):
    ratios[name] = {"value": value, "interval": interval, "target": None, "status": "info"}

  def ratio(name, num, den, target):
    value = paired_ratio(num["samples"], den["samples"])
    ratios[name] = {
      "value": value,
      "interval": bootstrap_interval(np.asarray(num["samples"]) / np.asarray(den["samples"])),
      "target": target,
      "status": "info" if target is None else check(value[args.judge], target),
    }

  if loops:
    b_over_a = paired_ratio(loops["B"]["samples"], loops["A"]["samples"])[args.judge]
    for graph in GRAPH_MODES:
      ratio(f"C-{mode_name(graph)}/B step", loops[f"C-{mode_name(graph)}"], loops["B"], 1.05)
    ratio("D/B step", loops["D"], loops["B"], 1.05)
    ratio("B/A step", loops["B"], loops["A"], None)
    ratio(f"D/A step (cap {MAIN_CAPACITY})", loops["D"], loops["A"], max(1.15, b_over_a))
    for overflow in POLICIES:
      for name in ("D", "C-graph donate"):
        label = f"{name}{policy_name(overflow)}"
        ratio(f"{label} step cap 4096/16", loops[f"{label}@4096"], loops[f"{label}@16"], 1.10)
    # Without donation each call of C copies the buffers (0.6 s at 4096); that per-call time
    # dominates both loop lengths, so their difference is too noisy to check against 1.10.
    ratio("C-graph step cap 4096/16", loops["C-graph@4096"], loops["C-graph@16"], None)
  if roofline:
    # Recording's extra time per step over the plain loop, against the time to read and write
    # every sown byte once at the copy bandwidth measured in the same round. W (XLA writing the
    # same bytes one slot at a time, no sow machinery) and B (plus Linen's sow collection) show
    # where the rest goes. With a 90% bootstrap interval: the differences are a few percent of
    # a step.
    copy = roofline["copy"]
    floor = [t * copy["sown_bytes_per_step"] / copy["bytes"] for t in copy["samples"]]
    for name, target in (("D", 1.5), ("B", None), ("W", None)):
      extra = [
        np.asarray(a) - np.asarray(b)
        for a, b in zip(roofline[name]["samples"], roofline["A"]["samples"])
      ]
      ratio(
        f"roofline: ({name} - A) step / sown-bytes floor",
        {"samples": extra},
        {"samples": floor},
        target,
      )
      info(
        f"roofline: {name} - A, µs per step",
        per_clock(extra, 1e6),
        bootstrap_interval(np.asarray(extra) * 1e6),
      )
    info("roofline floor µs (2 x sown bytes / copy bandwidth)", per_clock(floor, 1e6))
  if dispatch:
    ratio(
      "D dispatch / jax.jit apply+buffers",
      dispatch["D@16"],
      dispatch["jax.jit apply+buffers@16"],
      1.1,
    )
    ratio(
      "D dispatch, no rng stream / jax.jit apply+buffers",
      dispatch["D, no rng stream@16"],
      dispatch["jax.jit apply+buffers@16"],
      1.1,
    )
    ratio("D dispatch / jax.jit apply", dispatch["D@16"], dispatch["jax.jit apply"], None)
    ratio(
      "D dispatch / jax.jit apply+buffers, count vector + rng counter",
      dispatch["D@16"],
      dispatch["jax.jit apply+buffers, count vector + rng counter@16"],
      None,
    )
    ratio(
      "C-graph dispatch / jax.jit apply+buffers",
      dispatch["C-graph@16"],
      dispatch["jax.jit apply+buffers@16"],
      None,
    )
    # "C-graph donate" is the README's pattern (nnx.jit(..., donate_argnums=0)); "C-graph"
    # (no donation) copies every written buffer per call by XLA's rules: shown, not a target.
    for name, target in (("D", 1.10), ("C-graph donate", 1.10), ("C-graph", None)):
      ratio(
        f"{name} per call cap 4096/16", per_call[f"{name}@4096"], per_call[f"{name}@16"], target
      )
  for label in ("2 sites", "24 sites"):
    if lazy:
      ratio(
        f"lb.lazy_init / bridge.lazy_init ({label})",
        lazy[f"lb.lazy_init {label}"],
        lazy[f"bridge.lazy_init {label}"],
        1.2,
      )
  if plain_sow:
    ratio(
      "plain NNX sow, loopbridge recording elsewhere / loopbridge not imported",
      plain_sow["plain sow, loopbridge recording elsewhere"],
      plain_sow["plain sow, loopbridge not imported"],
      1.05,
    )
  for name in ("C", "D") if memory else ():
    extra = memory[name]["temp_minus_A"]
    ratios[f"{name} temp - A temp (bytes) vs buffer bytes"] = {
      "value": dict.fromkeys(CLOCKS, extra),
      "target": memory["buffer_bytes"],
      "status": check(extra, memory["buffer_bytes"]),
    }

  def strip(section):
    return {name: {k: v for k, v in d.items() if k != "samples"} for name, d in section.items()}

  result = {
    "command": "python benchmarks/bench_recording.py"
    + (" --quick" if args.quick else "")
    + (f" --only {args.only}" if args.only else ""),
    "rounds": args.rounds,
    "judge": args.judge,
    "versions": {
      "python": platform.python_version(),
      "jax": jax.__version__,
      "jaxlib": getattr(__import__("jaxlib"), "__version__", "?"),
      "flax": flax.__version__,
      "loopbridge": lb.__version__,
    },
    "machine": {
      "platform": platform.platform(),
      "cpus": os.cpu_count(),
      "device": str(jax.devices()[0]),
      "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    },
    "model": {
      "width": WIDTH,
      "depth": DEPTH,
      "batch": BATCH,
      "steps": [SHORT, LONG],
      "capacity": MAIN_CAPACITY,
    },
    "loops": strip(loops),
    "roofline": strip(roofline),
    "dispatch_tiny": strip(dispatch),
    "per_call_wide": strip(per_call),
    "memory": memory,
    "lazy_init": strip(lazy),
    "plain_sow": strip(plain_sow),
    "ratios": ratios,
    "seconds": time.perf_counter() - started,
  }
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print(render(result))
  return result


def _cw(d: dict[str, float], fmt: str) -> str:
  return f"{d['cpu']:{fmt}} | {d['wall']:{fmt}}"


def render(r: dict) -> str:
  v = r["versions"]
  load = r["machine"]["load_average"]
  lines = [
    f"`{r['command']}` — jax {v['jax']}, flax {v['flax']}, {r['machine']['cpus']} CPUs"
    + (f" (load average {load[0]:.1f} at the end)" if load else "")
    + f", {r['rounds']} rounds, {r['seconds']:.0f} s. "
    + f"Model: the MLP of `examples/sow_in_while_loop.py`, width {WIDTH}, "
    f"depth {DEPTH}, batch {BATCH}. Medians; cpu = this process's CPU time, wall = elapsed.",
  ]
  if r["loops"]:
    lines += [
      "",
      f"Loops: per step = (t{LONG} - t{SHORT}) / {LONG - SHORT} of one executable; capacity "
      f"{MAIN_CAPACITY} unless @capacity",
      "",
      f"| scenario | per step µs cpu | wall | t{SHORT} ms cpu | wall | t{LONG} ms cpu | wall |",
      "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in r["loops"].items():
      if name == "copy":
        continue
      lines.append(
        f"| {name} | {_cw(d['per_step_us'], '.0f')} | "
        f"{_cw(d[f't{SHORT}_ms'], '.1f')} | {_cw(d[f't{LONG}_ms'], '.1f')} |"
      )
  if r.get("roofline"):
    lines += [
      "",
      f"Roofline loops ({3 * r['rounds']} rounds): per step µs, cpu | wall: "
      + "; ".join(
        f"{name} {_cw(d['per_step_us'], '.0f')}"
        for name, d in r["roofline"].items()
        if name != "copy"
      ),
    ]
    c = r["roofline"]["copy"]
    lines += [
      "",
      f"Copy bandwidth (read + written bytes per second, in-place pass over "
      f"{c['bytes'] / 2**20:.0f} MiB): {_cw(c['GBps'], '.1f')} GB/s (cpu | wall); "
      f"sown per step: {c['sown_bytes_per_step'] / 1024:.0f} KiB",
    ]
  if r["dispatch_tiny"]:
    lines += [
      "",
      "Per call of one jitted step, µs",
      "",
      "| step | tiny model cpu | wall | wide model cpu | wall |",
      "|---|---:|---:|---:|---:|",
    ]
    for name in dict.fromkeys([*r["dispatch_tiny"], *r["per_call_wide"]]):
      cells = []
      for section in (r["dispatch_tiny"], r["per_call_wide"]):
        cells.append(_cw(section[name]["per_call_us"], ".0f") if name in section else " | ")
      lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
  mem = r["memory"]
  if mem:
    lines += [
      "",
      f"Compiled memory of the capacity-{MAIN_CAPACITY} loop, bytes (buffers: "
      f"{mem['buffer_bytes']})",
      "",
      "| loop | argument | output | alias | temp |",
      "|---|---:|---:|---:|---:|",
    ]
    for name in ("A", "B", "C", "D"):
      m = mem[name]
      lines.append(f"| {name} | {m['argument']} | {m['output']} | {m['alias']} | {m['temp']} |")
  if r["lazy_init"]:
    lines += [
      "",
      "lazy_init, ms: "
      + "; ".join(
        f"{k} {_cw(d['ms'], '.1f').replace(' | ', ' cpu, ')} wall"
        for k, d in r["lazy_init"].items()
      ),
    ]
  if r["plain_sow"]:
    lines += [
      "",
      "plain NNX sow, µs per call: "
      + "; ".join(
        f"{k} {_cw(d['us'], '.2f').replace(' | ', ' cpu, ')} wall"
        for k, d in r["plain_sow"].items()
      ),
    ]
  lines += [
    "",
    f"| ratio: median of paired ratios [90% bootstrap interval] | cpu | wall | target | "
    f"status ({r['judge']}) |",
    "|---|---:|---:|---:|---|",
  ]
  for name, d in r["ratios"].items():
    value, target = d["value"], d["target"]
    if isinstance(target, int) and not isinstance(target, bool) and target > 1000:
      cells, tgt = f"{value['cpu']} | ", f"≤ {target}"
    else:
      fmt = ".1f" if "µs" in name else ".3f"
      cells = " | ".join(
        f"{value[clock]:{fmt}}"
        + (" [{:{f}}, {:{f}}]".format(*d["interval"][clock], f=fmt) if d.get("interval") else "")
        for clock in CLOCKS
      )
      tgt = "" if target is None else f"≤ {target:.3f}"
    lines.append(f"| {name} | {cells} | {tgt} | {d['status']} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
