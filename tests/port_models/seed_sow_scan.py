"""The user's model from the "sowing across nnx.while_loop" report: a sow at the top and one
inside an `nn.scan` body that carries the `intermediates` collection (widths made small)."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class Block(nn.Module):
  @nn.compact
  def __call__(self, carry, unused_inputs):
    carry = nn.Dense(16)(carry)
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


model = MLP(depth=3)


def sample_args():
  return (jax.random.normal(jax.random.key(42), (1, 16), jnp.float32),)


SAMPLE_KWARGS = {}
EXTRA_CALLS = ()
