"""One JAX process of the multi-host test (tests/test_multihost.py starts two).

    python tests/multihost_worker.py PORT PROCESS_ID CHECKPOINT_DIR

Each process owns 2 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=2); the
mesh spans the 4 devices of both. The model records batch-sharded global inputs in a jitted
`nnx.fori_loop`; each process gathers the records and checks them against plain Linen
`apply(..., mutable=['intermediates'])` on the whole batch, step by step (in this process,
no collectives). Then both save one checkpoint and restore it into a fresh model. Prints
`MULTIHOST OK <process_id>` on success; any failure is an exception (non-zero exit).
"""

from __future__ import annotations

import sys
import typing as tp

import jax

PROCESSES, LOCAL_DEVICES, BATCH, FEATURES, STEPS = 2, 2, 8, 3, 4
TOL: dict[str, tp.Any] = dict(rtol=1e-5, atol=1e-6)


def main(port: int, process_id: int, checkpoint_dir: str) -> None:
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
    f"localhost:{port}", num_processes=PROCESSES, process_id=process_id, initialization_timeout=120
  )

  import flax.linen as nn
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from jax.experimental import multihost_utils
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import loopbridge as lb

  assert jax.process_count() == PROCESSES and jax.local_device_count() == LOCAL_DEVICES
  mesh = Mesh(np.array(jax.devices()), ("data",))

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.relu(nn.Dense(FEATURES)(x))
      self.sow("intermediates", "h", h)
      return nn.Dense(FEATURES)(h)

  # The same data in every process (a fixed seed), as each host of a real job would load
  # its part of one global batch.
  xs = np.random.default_rng(0).normal(size=(STEPS, BATCH, FEATURES)).astype(np.float32)
  variables = Net().init(jax.random.key(0), jnp.asarray(xs[0]))

  def global_array(host_value, spec):
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(host_value.shape, sharding, lambda i: host_value[i])

  def new_model():
    params = jax.tree.map(lambda a: global_array(np.asarray(a), P()), variables)
    x0 = global_array(xs[0], P("data"))
    model = lb.checkpoint.from_linen_variables(Net(), params, x0)
    lb.preallocate(model, x0, capacity=STEPS, overflow="error")
    return lb.sharding.shard_buffers(model, P("data"), mesh=mesh)

  model = new_model()
  buffer = lb.buffers(model)["intermediates"]["h"]
  assert not buffer.is_fully_addressable and buffer.sharding.spec == P(None, "data"), (
    buffer.sharding
  )

  @nnx.jit
  def run(model, xs):
    def body(i, model):
      model(xs[i])
      return model

    return nnx.fori_loop(0, STEPS, body, model)

  run(model, global_array(xs, P(None, "data")))

  def gathered(model):
    counts = multihost_utils.process_allgather(lb.counts(model)["intermediates"]["h"], tiled=True)
    records = multihost_utils.process_allgather(lb.buffers(model)["intermediates"]["h"], tiled=True)
    return int(np.max(counts)), np.asarray(records)

  count, records = gathered(model)
  assert count == STEPS, count
  for step in range(STEPS):  # plain Linen on the whole batch, one apply per step
    _, state = Net().apply(variables, xs[step], mutable=["intermediates"])
    np.testing.assert_allclose(
      records[step], state["intermediates"]["h"][0], **TOL, err_msg=f"step {step}"
    )

  path = lb.checkpoint.save(checkpoint_dir, model)
  restored = lb.checkpoint.restore(path, new_model())
  count_r, records_r = gathered(restored)
  assert count_r == STEPS
  np.testing.assert_array_equal(records_r, records)
  assert lb.buffers(restored)["intermediates"]["h"].sharding.spec == P(None, "data")
  print(f"MULTIHOST OK {process_id}", flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
