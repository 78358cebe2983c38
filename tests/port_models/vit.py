"""A Vision Transformer (the big_vision/scenic shape): patch embedding, class token, and the
encoder as `nn.scan(nn.remat(Block))` with parameters stacked along a layer axis."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class MlpBlock(nn.Module):
  mlp_dim: int
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x, deterministic=True):
    d = x.shape[-1]
    x = nn.Dense(self.mlp_dim, kernel_init=nn.initializers.xavier_uniform())(x)
    x = nn.gelu(x)
    x = nn.Dropout(rate=self.dropout)(x, deterministic)
    return nn.Dense(d, kernel_init=nn.initializers.xavier_uniform())(x)


class Encoder1DBlock(nn.Module):
  """A pre-norm Transformer block, written to be scanned: (carry, _) -> (carry, None)."""

  mlp_dim: int
  num_heads: int
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x, deterministic):
    y = nn.LayerNorm()(x)
    y = nn.MultiHeadDotProductAttention(
      num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform()
    )(y, y, deterministic=deterministic)
    y = nn.Dropout(rate=self.dropout)(y, deterministic)
    x = x + y
    y = nn.LayerNorm()(x)
    y = MlpBlock(mlp_dim=self.mlp_dim, dropout=self.dropout)(y, deterministic)
    return x + y, None


class Encoder(nn.Module):
  depth: int
  mlp_dim: int
  num_heads: int
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool = False):
    block = nn.remat(Encoder1DBlock, prevent_cse=False, static_argnums=(2,))
    x, _ = nn.scan(
      block,
      variable_axes={"params": 0},
      split_rngs={"params": True, "dropout": True},
      in_axes=nn.broadcast,
      length=self.depth,
    )(self.mlp_dim, self.num_heads, self.dropout, name="encoderblock")(x, not train)
    return nn.LayerNorm(name="encoder_norm")(x)


class ViT(nn.Module):
  num_classes: int = 10
  patch_size: int = 4
  width: int = 16
  depth: int = 2
  mlp_dim: int = 32
  num_heads: int = 2
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, image, train: bool = False):
    x = nn.Conv(
      self.width,
      (self.patch_size, self.patch_size),
      strides=(self.patch_size, self.patch_size),
      padding="VALID",
      name="embedding",
    )(image)
    n, h, w, c = x.shape
    x = jnp.reshape(x, [n, h * w, c])
    cls = self.param("cls", nn.initializers.zeros, (1, 1, c), x.dtype)
    x = jnp.concatenate([jnp.tile(cls, [n, 1, 1]), x], axis=1)
    posemb = self.param("pos_embedding", nn.initializers.normal(stddev=0.02), (1, x.shape[1], c))
    x = x + posemb
    x = Encoder(self.depth, self.mlp_dim, self.num_heads, name="Transformer")(x, train)
    return nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros, name="head")(x[:, 0])


model = ViT()


def sample_args():
  return (jax.random.normal(jax.random.key(11), (2, 8, 8, 3), jnp.float32),)


SAMPLE_KWARGS = {}
EXTRA_CALLS = ()
