"""A decoder-only Transformer LM (the flax lm1b example's shape).

A config dataclass, shared token embeddings read back with `Embed.attend` for the logits, learned
position embeddings that count the decoded position in the `cache` collection, `layers_N`
blocks under `nn.remat`, dropout, and flax's attention with `decode=True` for sampling.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class TransformerConfig:
  vocab_size: int = 40
  emb_dim: int = 16
  num_heads: int = 2
  num_layers: int = 2
  mlp_dim: int = 32
  max_len: int = 8
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  deterministic: bool = True
  decode: bool = False
  dtype: Any = jnp.float32


class AddPositionEmbs(nn.Module):
  """Learned position embeddings; while decoding, the position comes from a cache index."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs):
    config = self.config
    length = inputs.shape[1]
    pos_embedding = self.param(
      "pos_embedding",
      nn.initializers.normal(stddev=0.02),
      (1, config.max_len, inputs.shape[-1]),
    )
    if config.decode:
      is_initialized = self.has_variable("cache", "cache_index")
      cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.uint32))
      if is_initialized:
        i = cache_index.value
        cache_index.value = i + 1
        _, _, df = pos_embedding.shape
        pe = jax.lax.dynamic_slice(pos_embedding, jnp.array((0, i, 0)), (1, 1, df))
        return inputs + pe
    return inputs + pos_embedding[:, :length, :]


class MlpBlock(nn.Module):
  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs):
    config = self.config
    x = nn.Dense(config.mlp_dim, dtype=config.dtype)(inputs)
    x = nn.gelu(x)
    x = nn.Dropout(rate=config.dropout_rate)(x, deterministic=config.deterministic)
    x = nn.Dense(inputs.shape[-1], dtype=config.dtype)(x)
    return nn.Dropout(rate=config.dropout_rate)(x, deterministic=config.deterministic)


class DecoderBlock(nn.Module):
  """Pre-norm self-attention and MLP, each with a residual connection."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs, decoder_mask=None):
    config = self.config
    x = nn.LayerNorm(dtype=config.dtype)(inputs)
    x = nn.MultiHeadDotProductAttention(
      num_heads=config.num_heads,
      dtype=config.dtype,
      qkv_features=config.emb_dim,
      dropout_rate=config.attention_dropout_rate,
      deterministic=config.deterministic,
      decode=config.decode,
    )(x, mask=decoder_mask)
    x = nn.Dropout(rate=config.dropout_rate)(x, deterministic=config.deterministic)
    x = x + inputs
    z = nn.LayerNorm(dtype=config.dtype)(x)
    z = MlpBlock(config)(z)
    return x + z


class TransformerLM(nn.Module):
  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs):
    config = self.config
    # While decoding, flax's attention masks by the cache index; no causal mask is built.
    decoder_mask = None if config.decode else nn.make_causal_mask(inputs)
    embed = nn.Embed(
      config.vocab_size,
      config.emb_dim,
      embedding_init=nn.initializers.normal(stddev=1.0),
      name="embed",
    )
    y = embed(inputs.astype("int32"))
    y = AddPositionEmbs(config, name="posembed")(y)
    y = nn.Dropout(rate=config.dropout_rate)(y, deterministic=config.deterministic)
    block = nn.remat(DecoderBlock)
    for lyr in range(config.num_layers):
      y = block(config, name=f"layers_{lyr}")(y, decoder_mask)
    y = nn.LayerNorm(dtype=config.dtype, name="decoder_norm")(y)
    # Output logits share the token embedding matrix.
    return embed.attend(y.astype(jnp.float32)) / jnp.sqrt(y.shape[-1])


config = TransformerConfig()
model = TransformerLM(config)


def sample_args():
  return (jax.random.randint(jax.random.key(7), (2, config.max_len), 0, config.vocab_size),)


SAMPLE_KWARGS = {}
EXTRA_CALLS = ()
