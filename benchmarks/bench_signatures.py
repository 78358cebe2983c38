"""Does a recorded decode step cost more when the model declares more call signatures?

A decoding program declares a prompt signature and a one-token step signature (and often the
full-length one `lazy_init` used to size a cache). Each call writes its own signature's
buffers only, so the step should cost the same however many signatures are declared. This
times the same one-token recording loop (`lb.compile_step` around an `nnx.fori_loop`, the
fastest path) on two copies of one model: declared for the step signature only, and for the
step plus two more (batch 2 and 3). Both are compiled first, then timed in interleaved rounds
(each round runs both, in alternating order), so load from other processes hits both alike.
Reported: the median over rounds of the per-round ratio (3 signatures / 1), with its range.
The HLO guard `test_decode_step_cost_does_not_grow_with_the_number_of_signatures` (in
`tests/test_perf_guards.py`) checks the same property structurally.

Run:  python benchmarks/bench_signatures.py [--rounds 21] [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import flax
import jax
import jax.numpy as jnp
from flax import nnx

import loopbridge as lb

from bench_recording import MLP  # the model of the recording benchmark

WIDTH, DEPTH, BATCH = 256, 6, 1


def declared(signatures: int) -> lb.ToNNX:
  model = lb.ToNNX(MLP(DEPTH, WIDTH), rngs=nnx.Rngs(0))
  lb.lazy_init(model, jnp.ones((BATCH, WIDTH)), capacity=1024, overflow="wrap")
  for batch in range(2, signatures + 1):
    lb.preallocate(model, jnp.ones((batch, WIDTH)), capacity=1024, overflow="wrap")
  return model


def loop(model, x, n):
  return nnx.fori_loop(0, n, lambda i, c: (c[0], c[0](c[1])), (model, x))[1]


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--rounds", type=int, default=21)
  parser.add_argument("--steps", type=int, default=200)
  args = parser.parse_args()
  x = jnp.full((BATCH, WIDTH), 0.01)
  steps = {k: lb.compile_step(loop, declared(k)) for k in (1, 3)}
  for step in steps.values():
    jax.block_until_ready(step(x, args.steps))  # compile
  ratios, times = [], {1: [], 3: []}
  for r in range(args.rounds):
    order = (1, 3) if r % 2 == 0 else (3, 1)
    got = {}
    for k in order:
      start = time.perf_counter()
      jax.block_until_ready(steps[k](x, args.steps))
      got[k] = (time.perf_counter() - start) / args.steps
      times[k].append(got[k])
    ratios.append(got[3] / got[1])
  print(
    f"jax {jax.__version__}, flax {flax.__version__}; MLP width {WIDTH} depth {DEPTH}, "
    f"{args.steps} recorded steps per call, {args.rounds} rounds"
  )
  for k in (1, 3):
    print(f"  {k} signature(s): median {statistics.median(times[k]) * 1e6:.1f} us per step")
  print(
    f"  per-step ratio 3 signatures / 1: median {statistics.median(ratios):.3f} "
    f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
  )


if __name__ == "__main__":
  main()
