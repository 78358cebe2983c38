"""Times flax's own `nnx.Module.sow` on a plain NNX module, in a fresh process.

Used by `bench_recording.py` for the row "plain NNX sow, loopbridge recording elsewhere /
loopbridge not imported": run once as `plain` (loopbridge never imported) and once as
`loopbridge` (imported, with another native module recording through `lb.preallocate` in the
same process). Prints one JSON line: seconds per sow (median of batches, cpu and wall).
"""

from __future__ import annotations

import gc
import json
import sys
import time
import warnings

import jax.numpy as jnp
import numpy as np
from flax import nnx


class Plain(nnx.Module):
  def __call__(self, x):
    self.sow(nnx.Intermediate, "h", x)
    return x


def main(mode: str, batches: int = 30, per_batch: int = 2000) -> None:
  warnings.simplefilter("ignore", DeprecationWarning)  # flax 0.12: sow outside nnx.capture
  x = jnp.ones((4,))
  if mode == "loopbridge":
    import loopbridge as lb

    class Recording(nnx.Module):
      def __call__(self, x):
        self.sow(nnx.Intermediate, "h", x)
        return x

    recording = lb.preallocate(Recording(), x, capacity=4, overflow="wrap")
    for _ in range(8):
      recording(x)
  module = Plain()
  samples = []
  for _ in range(batches):
    gc.disable()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(per_batch):
      module(x)
      del module.h  # keep the tuple at one entry: time the call, not a growing tuple
    samples.append(
      ((time.process_time() - cpu) / per_batch, (time.perf_counter() - wall) / per_batch)
    )
    gc.enable()
  arr = np.asarray(samples)
  print(json.dumps({"cpu": float(np.median(arr[:, 0])), "wall": float(np.median(arr[:, 1]))}))


if __name__ == "__main__":
  main(sys.argv[1])
