"""A T5-style encoder block: RMS norm, attention projections as `DenseGeneral` over
(heads, head_dim), an `Einsum` gated feed-forward, and a GRU cell over a short memory."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class Attention(nn.Module):
  num_heads: int = 2
  head_dim: int = 8

  @nn.compact
  def __call__(self, x):
    features = (self.num_heads, self.head_dim)
    q = nn.DenseGeneral(features, use_bias=False, name="query")(x)
    k = nn.DenseGeneral(features, use_bias=False, name="key")(x)
    v = nn.DenseGeneral(features, use_bias=False, name="value")(x)
    weights = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(self.head_dim))
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), use_bias=False, name="out")(out)


class T5Block(nn.Module):
  d_model: int = 16
  d_ff: int = 32

  @nn.compact
  def __call__(self, x, memory):
    x = x + Attention()(nn.RMSNorm(epsilon=1e-6, name="pre_attention_norm")(x))
    y = nn.RMSNorm(epsilon=1e-6, name="pre_mlp_norm")(x)
    # Gate and up projections fused in one einsum weight of shape (2, d_model, d_ff).
    gate_up = nn.Einsum((2, self.d_model, self.d_ff), "btd,gdf->gbtf", use_bias=False)(y)
    y = nn.gelu(gate_up[0]) * gate_up[1]
    x = x + nn.Dense(self.d_model, use_bias=False, name="wo")(y)
    # A recurrent summary of the memory, added to every position.
    carry = jnp.zeros((memory.shape[0], self.d_model))
    cell = nn.GRUCell(self.d_model, name="memory_cell")
    for t in range(memory.shape[1]):
      carry, _ = cell(carry, memory[:, t])
    return x + carry[:, None, :]


model = T5Block()


def sample_args():
  x = jax.random.normal(jax.random.key(16), (2, 5, 16), jnp.float32)
  memory = jax.random.normal(jax.random.key(17), (2, 3, 16), jnp.float32)
  return x, memory


SAMPLE_KWARGS = {}
EXTRA_CALLS = ()
