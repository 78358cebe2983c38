"""A T5X/MaxText-style MLP block whose params carry logical axis names."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class MlpBlock(nn.Module):
  """Gated-GELU feed-forward with logically partitioned kernels and a partitioned norm scale."""

  emb_dim: int = 16
  mlp_dim: int = 32
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = self.param(
      "scale",
      nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
      (self.emb_dim,),
    )
    # RMS normalization before the feed-forward.
    y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6) * scale
    wi_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    gate = nn.Dense(
      self.mlp_dim, use_bias=False, kernel_init=wi_init, dtype=self.dtype, name="wi_0"
    )(y)
    up = nn.Dense(self.mlp_dim, use_bias=False, kernel_init=wi_init, dtype=self.dtype, name="wi_1")(
      y
    )
    h = nn.gelu(gate) * up
    wo_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "embed"))
    out = nn.Dense(self.emb_dim, use_bias=False, kernel_init=wo_init, dtype=self.dtype, name="wo")(
      h
    )
    return x + out


model = MlpBlock()


def sample_args():
  return (jax.random.normal(jax.random.key(12), (2, 4, 16), jnp.float32),)


SAMPLE_KWARGS = {}
EXTRA_CALLS = ()
