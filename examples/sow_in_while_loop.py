"""A Linen model that sows (also inside `nn.scan`) runs in `nnx.while_loop`.

Wrapped the model with `flax.nnx.bridge.ToNNX` and failed with
"nnx.while_loop requires body function's input and output to have the same reference and
pytree structure". With loopbridge only the import and `capacity=` change.

Run: python examples/sow_in_while_loop.py
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

import loopbridge as lb


class Block(nn.Module):
  @nn.compact
  def __call__(self, carry, unused_inputs):
    carry = nn.Dense(100)(carry)
    carry = nn.relu(carry)
    self.sow("intermediates", "carry", carry)
    return carry, None


class MLP(nn.Module):
  depth: int

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    scan_block = nn.scan(
      Block,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      length=self.depth,
    )()
    carry, _unused_outputs = scan_block(x, None)
    return carry


def main() -> None:
  key = jax.random.key(42)
  key, nnx_key = jax.random.split(key, 2)

  x = jax.random.normal(key, (1, 100))
  model_nnx = lb.ToNNX(MLP(depth=3), rngs=nnx.Rngs(nnx_key))
  lb.lazy_init(model_nnx, x, capacity=5)

  def step(carry):
    model, inputs, step = carry
    outputs = model(inputs, mutable=True)
    return model, outputs, step + 1

  def cond(carry):
    _, _, step = carry
    return step < 5

  @nnx.jit
  def run(model, x):
    return nnx.while_loop(cond, step, (model, x, 0))

  model, outputs, steps_run = run(model_nnx, x)

  print(f"ran {int(steps_run)} steps of nnx.while_loop under nnx.jit")
  for path, value in sorted(
    jax.tree_util.tree_flatten_with_path(lb.recorded(model))[0],
    key=lambda kv: jax.tree_util.keystr(kv[0]),
  ):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    print(f"  recorded {name:<32} shape={tuple(value.shape)} dtype={value.dtype}")
  final = lb.recorded(model)["intermediates"]["ScanBlock_0"]["carry"][-1, -1]
  print(
    f"  last step, last layer carry equals the loop output: {bool(jnp.allclose(final, outputs))}"
  )


if __name__ == "__main__":
  main()
