"""Records larger than the device: `memory="host"` against the unrecorded loop and the link.

One process. A Linen step sows a `(batch, width)` float32 activation every step; `lb.ToNNX`
records it with `memory="host"` in an `nnx.fori_loop` under `nnx.jit(donate_argnums=0)`.
Measured, each the median of `--rounds` runs:
  unrecorded  the same steps as a plain Linen `jax.lax.fori_loop` (the floor)
  host        the loop recording every step into host memory
and the device-to-host routes on a buffer of one step's records times `--probe-steps`:
  device_get       `jax.device_get` to NumPy
  put pinned_host  eager `jax.device_put` to the device's pinned_host memory
  jit to host      a jitted copy whose output lives in pinned_host memory
The report: the recorded step's time against the unrecorded step's, and the recorded bytes per
second against each route (the ratio to the best route says how close to the link it runs).
Records are checked against plain Linen `apply` on a sample of steps (first, second, middle,
last): each against `apply` of the record before it, read from host memory one step at a time
by a jitted copy (a read of the whole record would need as much host memory again).

`--total-gb` sets the records' size; `--fraction-of-hbm 1.5` sizes them from the device's own
memory limit (what the TPU run uses). On a CPU the defaults are small.

Run:  python benchmarks/bench_host_records.py [--fraction-of-hbm 1.5] [--width 4096]
Writes benchmarks/results/host_records.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from jax.sharding import SingleDeviceSharding

import loopbridge as lb


class Step(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    h = jnp.tanh(nn.Dense(self.width, use_bias=False)(x)) + 0.5 * x
    self.sow("intermediates", "h", h)
    return h


def _host_memory() -> str:
  """This process's resident host memory and the machine's free memory (Linux), in GB."""
  found = {}
  for path, key in (("/proc/self/status", "VmRSS"), ("/proc/meminfo", "MemFree")):
    try:
      with open(path) as f:
        line = next(line for line in f if line.startswith(key + ":"))
      found[key] = int(line.split()[1]) * 1024 / 1e9
    except (OSError, StopIteration):
      pass
  return ", ".join(f"{k} {v:.2f} GB" for k, v in found.items()) or "not readable here"


def _median_time(fn, rounds: int) -> float:
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _routes(step_bytes_array: jax.Array, rounds: int) -> dict[str, float]:
  """Bytes per second of each device-to-host route on the same array."""
  device = jax.devices()[0]
  host = SingleDeviceSharding(device, memory_kind="pinned_host")
  nbytes = step_bytes_array.nbytes
  to_host = jax.jit(lambda a: a * 1.0, out_shardings=host)
  to_host(step_bytes_array).block_until_ready()
  fresh = jax.jit(lambda a, k: a + k)  # a new array each round: JAX keeps a fetched copy

  def fetch():
    copies = [fresh(step_bytes_array, float(k)).block_until_ready() for k in range(rounds)]
    times = []
    for copy in copies:
      start = time.perf_counter()
      np.asarray(jax.device_get(copy))
      times.append(time.perf_counter() - start)
    return statistics.median(times)

  out = {
    "device_get": nbytes / fetch(),
    "put pinned_host": nbytes
    / _median_time(lambda: jax.device_put(step_bytes_array, host), rounds),
    "jit to host": nbytes / _median_time(lambda: to_host(step_bytes_array), rounds),
  }
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--width", type=int, default=256)
  parser.add_argument("--steps", type=int, default=0, help="default: from --total-gb")
  parser.add_argument("--total-gb", type=float, default=0.05)
  parser.add_argument("--fraction-of-hbm", type=float, default=0.0)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--probe-steps", type=int, default=16)
  parser.add_argument("--overflow", default="error", choices=["error", "drop", "wrap"])
  args = parser.parse_args()

  device = jax.devices()[0]
  step_bytes = args.batch * args.width * 4
  hbm = (device.memory_stats() or {}).get("bytes_limit")
  total = args.total_gb * 1e9
  if args.fraction_of_hbm:
    if not hbm:
      raise SystemExit("--fraction-of-hbm: this device does not report its memory limit")
    total = args.fraction_of_hbm * hbm
  steps = args.steps or max(2, int(np.ceil(total / step_bytes)))
  print(
    f"{device.platform} {device.device_kind}: {steps} steps x {step_bytes / 1e6:.1f} MB = "
    f"{steps * step_bytes / 1e9:.2f} GB of records"
    + (f" ({steps * step_bytes / hbm:.2f}x the device's {hbm / 1e9:.2f} GB)" if hbm else ""),
    flush=True,
  )

  print(f"host memory at the start: {_host_memory()}", flush=True)
  x = jax.random.normal(jax.random.key(0), (args.batch, args.width), jnp.float32)
  linen = Step(args.width)
  variables = linen.init(jax.random.key(1), x)
  with jax.default_matmul_precision("highest"):
    model = lb.ToNNX(linen, rngs=nnx.Rngs(1))
    lb.lazy_init(model, x, capacity=steps, memory="host", overflow=args.overflow)
    lb.checkpoint.load_linen_variables(model, variables)
    print(f"host memory after lazy_init: {_host_memory()}", flush=True)

    @nnx.jit(donate_argnums=0)
    def run(model, x):
      return nnx.fori_loop(0, steps, lambda i, c: (c[0], c[0](c[1])), (model, x))[1]

    # The floor: the same steps as a plain Linen loop, nothing recorded.
    plain = jax.jit(lambda v, x: jax.lax.fori_loop(0, steps, lambda i, h: linen.apply(v, h), x))

    results: dict[str, object] = {"steps": steps, "step_bytes": step_bytes, "hbm_bytes": hbm}
    print(f"host memory before the first call: {_host_memory()}", flush=True)
    plain(variables, x).block_until_ready()  # compile both
    run(model, x).block_until_ready()
    print(f"host memory after a recorded loop: {_host_memory()}", flush=True)
    t_off = _median_time(lambda: plain(variables, x), args.rounds)
    t_on = []
    for _ in range(args.rounds):
      lb.reset(model)
      start = time.perf_counter()
      out = run(model, x)
      # The loop's writes into host memory are waited for too, not only its output.
      jax.block_until_ready((out, lb.buffers(model)))
      t_on.append(time.perf_counter() - start)
    t_host = statistics.median(t_on)
    moved = steps * step_bytes / t_host
    results.update(unrecorded_s=t_off, host_s=t_host, host_bytes_per_s=moved)
    print(f"unrecorded loop {t_off:8.3f} s   ({t_off / steps * 1e3:.3f} ms a step)")
    print(
      f"host records    {t_host:8.3f} s   ({t_host / steps * 1e3:.3f} ms a step, "
      f"{t_host / t_off:.1f}x; {moved / 1e9:.3f} GB/s of records)"
    )

    probe = jnp.zeros((min(args.probe_steps, steps), args.batch, args.width), jnp.float32) + 1.0
    routes = _routes(probe, args.rounds)
    best = max(routes, key=lambda k: routes[k])
    for name, rate in routes.items():
      print(f"route {name:16s} {rate / 1e9:7.3f} GB/s   records at {moved / rate:.2f} of it")
    results.update(routes=routes, best_route=best, fraction_of_best=moved / routes[best])
    pinned = max(routes["put pinned_host"], routes["jit to host"])
    results["fraction_of_pinned_host"] = moved / pinned
    print(
      f"best route: {best}; records at {moved / routes[best]:.2f} of it, "
      f"{moved / pinned:.2f} of the best pinned_host route"
    )

    # Records against plain Linen `apply`, step by step: each sampled step's record against
    # `apply` of the step before's record (of `x` at step 0). Stepping Linen alone from `x` is
    # no reference over hundreds of steps: its rounding drifts from the compiled loop's.
    counts = int(lb.counts(model)["intermediates"]["h"])
    assert counts == steps, (counts, steps)
    buffer = lb.buffers(model)["intermediates"]["h"]
    on_device = SingleDeviceSharding(device, memory_kind=device.default_memory().kind)
    take = jax.jit(
      lambda b, i: jax.device_put(jax.lax.dynamic_index_in_dim(b, i, keepdims=False), on_device)
    )
    apply = jax.jit(lambda v, h: linen.apply(v, h))
    sample = sorted({0, 1, steps // 2, steps - 1})
    worst = 0.0
    for i in sample:
      before = x if i == 0 else take(buffer, i - 1)
      got = np.asarray(take(buffer, i))
      worst = max(worst, float(np.max(np.abs(got - np.asarray(apply(variables, before))))))
    results.update(sample_steps=sample, max_abs_diff_vs_linen=worst)
    print(f"records vs plain Linen apply at steps {sample}: max |diff| {worst:.2e}")
    assert worst <= 1e-4, worst

  os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
  out = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results")
  with open(os.path.join(out, "host_records.json"), "w") as f:
    json.dump(results, f, indent=1, default=float)


if __name__ == "__main__":
  main()
