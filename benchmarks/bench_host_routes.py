"""Device-to-host routes for records: the bandwidth of each, in one process.

  A   `jax.device_get` to NumPy
  B   eager `jax.device_put` to each host memory kind
  C   a jitted copy whose output lives there (C2: moved there inside the body)
  L0  a loop of steps, nothing recorded; L1 each step's value written into a device buffer
  L2  each step's value written into a host buffer; L3 K steps gathered on the device, then
      written; L4 `lax.scan` outputs moved to the host
1 GiB and 64 steps of 64 MiB at SCALE=1 (a TPU); `SCALE=0.01 STEPS=16` runs it small on a CPU.
A route the backend cannot compile prints FAILED with the reason. Writes `$OUT/d2h.json` where
OUT is set.

Run:  python benchmarks/bench_host_routes.py
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

SCALE = float(os.environ.get("SCALE", "1"))
STEPS = int(os.environ.get("STEPS", "64"))
HOST_KINDS = ("pinned_host", "unpinned_host")


def timeit(results: dict, name: str, fn, nbytes: int, reps: int = 3) -> None:
  """Median seconds and GB/s of `fn` after one warm-up call; a failure is printed, not raised."""
  try:
    jax.block_until_ready(fn())
  except Exception as e:  # a route this backend cannot compile or run
    print(f"{name:48s} FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
    return
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  t = float(np.median(times))
  results[name] = dict(s=t, GBps=nbytes / t / 1e9, bytes=nbytes)
  print(f"{name:48s} {t * 1e3:9.1f} ms  {nbytes / t / 1e9:7.2f} GB/s", flush=True)


def copies(results: dict, device, kinds) -> None:
  n = int(256 * 1024 * 1024 * SCALE)  # floats: 1 GiB at SCALE 1
  x = jax.device_put(jnp.arange(n, dtype=jnp.float32) * 1e-9, device)
  nbytes = n * 4
  timeit(results, "A device_get (numpy)", lambda: np.asarray(jax.device_get(x + 0)), nbytes)
  for kind in kinds:
    host = SingleDeviceSharding(device, memory_kind=kind)
    out_host = jax.jit(lambda a: a * 1.0, out_shardings=host)
    in_body = jax.jit(lambda a, h=host: jax.device_put(a * 1.0, h), out_shardings=host)
    timeit(results, f"B eager device_put -> {kind}", lambda h=host: jax.device_put(x, h), nbytes)
    timeit(results, f"C jit out_shardings {kind}", lambda f=out_host: f(x), nbytes)
    timeit(results, f"C2 jit device_put in body {kind}", lambda f=in_body: f(x), nbytes)


def loops(results: dict, device, kinds) -> None:
  width = int(16 * 1024 * 1024 * SCALE) // 256 * 256  # floats a step: 64 MiB at SCALE 1
  weight = jnp.eye(256, dtype=jnp.float32) * 0.5

  def step(h):
    return jnp.tanh(h.reshape(-1, 256) @ weight).reshape(h.shape) + 1e-3

  h0 = jax.device_put(jnp.ones((width,), jnp.float32), device)
  nbytes = STEPS * width * 4
  compute = jax.jit(lambda h: jax.lax.fori_loop(0, STEPS, lambda i, h: step(h), h))
  timeit(results, "L0 compute only", lambda: compute(h0), nbytes)

  def write(buf, h, i):
    return jax.lax.dynamic_update_slice(buf, h[None], (i, 0))

  if nbytes < 8e9:
    zeros = jnp.zeros((STEPS, width), jnp.float32)
    on_device = jax.jit(
      lambda h: jax.lax.fori_loop(
        0, STEPS, lambda i, c: (write(c[0], step(c[1]), i), step(c[1])), (zeros, h)
      )
    )
    timeit(results, "L1 records on device", lambda: on_device(h0), nbytes)
  for kind in kinds:
    host = SingleDeviceSharding(device, memory_kind=kind)
    buffer = jax.device_put(jnp.zeros((STEPS, width), jnp.float32), host)

    def per_step_body(i, c, host=host):
      h = step(c[1])
      return write(c[0], jax.device_put(h, host), i), h

    per_step = jax.jit(lambda b, h, body=per_step_body: jax.lax.fori_loop(0, STEPS, body, (b, h)))
    timeit(results, f"L2 per-step DUS into {kind}", lambda f=per_step, b=buffer: f(b, h0), nbytes)
    for k in (4, 16):
      if STEPS % k:
        continue

      def chunk_body(j, c, host=host, k=k):
        staged, h = jax.lax.fori_loop(
          0,
          k,
          lambda i, s: (write(s[0], step(s[1]), i), step(s[1])),
          (jnp.zeros((k, width), jnp.float32), c[1]),
        )
        moved = jax.device_put(staged, host)
        return jax.lax.dynamic_update_slice(c[0], moved, (j * k, 0)), h

      chunked = jax.jit(
        lambda b, h, body=chunk_body, k=k: jax.lax.fori_loop(0, STEPS // k, body, (b, h))
      )
      timeit(results, f"L3 chunks of {k} into {kind}", lambda f=chunked, b=buffer: f(b, h0), nbytes)

    def scan_body(h, _, host=host):
      h = step(h)
      return h, jax.device_put(h, host)

    scanned = jax.jit(lambda h, body=scan_body: jax.lax.scan(body, h, None, length=STEPS))
    timeit(results, f"L4 scan ys device_put {kind}", lambda f=scanned: f(h0), nbytes)
    del buffer


def main() -> None:
  device = jax.devices()[0]
  kinds = [m.kind for m in device.addressable_memories()]
  print(jax.__version__, device.platform, device.device_kind, kinds, flush=True)
  results: dict = {}
  usable = [k for k in HOST_KINDS if k in kinds]
  copies(results, device, usable)
  loops(results, device, usable)
  out = os.environ.get("OUT")
  if out:
    with open(os.path.join(out, "d2h.json"), "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
