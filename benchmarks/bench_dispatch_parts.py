"""What one compiled call of the tiny model is made of: the dispatch cost of each extra array.

`bench_recording.py` finds `lb.compile_step` on the tiny model about 1.2x a `jax.jit` of the
hand-written recording step (B). This splits that ratio: B with one array more in each way
the bridged model has one more (a donated scalar in and out, as the rng stream's counter
that `lb.ToNNX` built with `rngs=` advances on every call, like stock `bridge.ToNNX`; an
output only; a read-only input only), against D with and without an rng stream, and D with
the count vector written per site (one scatter each, as before 0.3's single write) against
the single write. Every case is compiled first, then timed in interleaved rounds, paired per
round (the harness of `bench_recording.py`).

Run:  python benchmarks/bench_dispatch_parts.py [--rounds 21]
"""

from __future__ import annotations

import argparse
import functools
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import loopbridge as lb
from loopbridge._core import buffers  # the count write under comparison (internal)

from bench_recording import (
  MLP,
  Stateful,
  bootstrap_interval,
  calls_for,
  functional_steps,
  new_model,
  new_records,
  nnx_step,
  paired_ratio,
  run_rounds,
  timed,
  write_sows,
)

DEPTH, WIDTH, BATCH, CAPACITY = 3, 8, 1, 16


def hand_written_steps(module: MLP) -> dict[str, tp.Callable]:
  """B and B with one array more, each `jax.jit`-compiled with the record state donated."""

  def record(params, bx, bc, k, x):
    y, state = module.apply(params, x, mutable=["intermediates"])
    bx, bc = write_sows(bx, bc, state, k, k)
    return y, bx, bc

  def donated_scalar(params, rec, x):  # the rng counter: in, +1, out
    bx, bc, k, r = rec
    y, bx, bc = record(params, bx, bc, k, x)
    return y, (bx, bc, k + 1, r + 1)

  def scalar_output(params, rec, x):
    bx, bc, k = rec
    y, bx, bc = record(params, bx, bc, k, x)
    return (y, k.astype(jnp.uint32)), (bx, bc, k + 1)

  def read_only_input(params, rec, x, r):
    bx, bc, k = rec
    y, bx, bc = record(params, bx, bc, k, x)
    return y + 0 * r.astype(y.dtype), (bx, bc, k + 1)

  def donating(fn):
    return jax.jit(fn, donate_argnums=1)

  return {
    "B": functional_steps(module)[1],  # bench_recording's B
    "B + donated scalar in and out": donating(donated_scalar),
    "B + scalar output": donating(scalar_output),
    "B + read-only scalar input": donating(read_only_input),
  }


def per_site_count_writes(counts, records) -> None:
  """The count write before 0.3's single one: each site's entry by its own scatter."""
  for buffer, site, values, label in records:
    buffers.append(buffer, counts, site, values, label, checked=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=21)
  args = parser.parse_args()
  module, x = MLP(depth=DEPTH, features=WIDTH), jnp.ones((BATCH, WIDTH))
  params = {"params": module.init(jax.random.key(1), x)["params"]}
  cases: dict[str, tp.Callable] = {}
  for name, fn in hand_written_steps(module).items():
    rec = new_records(CAPACITY, DEPTH, BATCH, WIDTH)
    extra: tuple = ()
    if name == "B + donated scalar in and out":
      rec = (*rec, jnp.zeros((), jnp.uint32))  # its own: it is donated
    if name == "B + read-only scalar input":
      extra = (jnp.zeros((), jnp.uint32),)
    state = Stateful(fn, params, rec)
    cases[name] = functools.partial(lambda s, extra: s(x, *extra), state, extra)
  cases["D"] = functools.partial(
    lambda s: s(x), lb.compile_step(nnx_step, new_model(module, x, CAPACITY))
  )
  no_stream = lb.lazy_init(lb.ToNNX(module), x, capacity=CAPACITY, rngs=nnx.Rngs(0))
  cases["D, no rng stream"] = functools.partial(
    lambda s: s(x), lb.compile_step(nnx_step, no_stream)
  )
  # The count write is chosen while tracing: trace a step with the per-site version, restore.
  single_write = buffers.append_all
  buffers.append_all = per_site_count_writes
  try:
    per_site = lb.compile_step(nnx_step, new_model(module, x, CAPACITY))
    jax.block_until_ready(per_site(x))
  finally:
    buffers.append_all = single_write
  cases["D, count vector written per site"] = functools.partial(lambda s: s(x), per_site)
  for fn in cases.values():
    jax.block_until_ready(fn())
  timers = {name: functools.partial(timed, fn, calls_for(fn, 0.02)) for name, fn in cases.items()}
  samples = run_rounds(timers, args.rounds)
  print(
    f"jax {jax.__version__}; {args.rounds} rounds; CPU time; µs per call, ratio to B [90% interval]"
  )
  for name, got in samples.items():
    per_round = np.asarray(got) / np.asarray(samples["B"])
    median_us = np.median(np.asarray(got)[:, 0]) * 1e6
    print(
      f"  {name:36s} {median_us:6.2f} µs  {paired_ratio(got, samples['B'])['cpu']:.3f} "
      f"{[round(v, 3) for v in bootstrap_interval(per_round)['cpu']]}"
    )
  got, base = samples["D"], samples["D, count vector written per site"]
  per_round = np.asarray(got) / np.asarray(base)
  print(
    f"  D / D with the count vector written per site: {paired_ratio(got, base)['cpu']:.3f} "
    f"{[round(v, 3) for v in bootstrap_interval(per_round)['cpu']]}"
  )


if __name__ == "__main__":
  main()
