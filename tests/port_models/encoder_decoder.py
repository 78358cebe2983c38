"""A sequence-to-sequence Transformer (the flax WMT example's shape) with cross-attention.

`encode` and `decode` are methods of their own, as translation code calls them separately
(encode once, decode many times); `__call__` runs both.
"""

import flax.linen as nn
import jax


class EncoderLayer(nn.Module):
  num_heads: int
  mlp_dim: int

  @nn.compact
  def __call__(self, x, mask):
    y = nn.LayerNorm()(x)
    y = nn.SelfAttention(num_heads=self.num_heads)(y, mask=mask)
    x = x + y
    y = nn.LayerNorm()(x)
    y = nn.Dense(self.mlp_dim)(y)
    y = nn.relu(y)
    y = nn.Dense(x.shape[-1])(y)
    return x + y


class DecoderLayer(nn.Module):
  num_heads: int
  mlp_dim: int

  @nn.compact
  def __call__(self, targets, encoded, decoder_mask, encoder_decoder_mask):
    x = nn.LayerNorm()(targets)
    x = nn.SelfAttention(num_heads=self.num_heads, name="self_attention")(x, mask=decoder_mask)
    x = x + targets
    # Cross-attention: queries from the targets, keys and values from the encoder.
    y = nn.LayerNorm()(x)
    y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, name="cross_attention")(
      y, encoded, mask=encoder_decoder_mask
    )
    y = y + x
    z = nn.LayerNorm()(y)
    z = nn.Dense(self.mlp_dim)(z)
    z = nn.relu(z)
    z = nn.Dense(y.shape[-1])(z)
    return y + z


class Transformer(nn.Module):
  vocab_size: int = 30
  emb_dim: int = 16
  num_heads: int = 2
  num_layers: int = 2
  mlp_dim: int = 32

  def setup(self):
    self.shared_embedding = nn.Embed(self.vocab_size, self.emb_dim)
    self.encoder_layers = [
      EncoderLayer(self.num_heads, self.mlp_dim) for _ in range(self.num_layers)
    ]
    self.decoder_layers = [
      DecoderLayer(self.num_heads, self.mlp_dim) for _ in range(self.num_layers)
    ]
    self.encoder_norm = nn.LayerNorm()
    self.decoder_norm = nn.LayerNorm()
    self.logits_dense = nn.Dense(self.vocab_size)

  def encode(self, inputs):
    mask = nn.make_attention_mask(inputs > 0, inputs > 0)
    x = self.shared_embedding(inputs)
    for layer in self.encoder_layers:
      x = layer(x, mask)
    return self.encoder_norm(x)

  def decode(self, encoded, inputs, targets):
    decoder_mask = nn.combine_masks(
      nn.make_attention_mask(targets > 0, targets > 0), nn.make_causal_mask(targets)
    )
    encoder_decoder_mask = nn.make_attention_mask(targets > 0, inputs > 0)
    y = self.shared_embedding(targets)
    for layer in self.decoder_layers:
      y = layer(y, encoded, decoder_mask, encoder_decoder_mask)
    return self.logits_dense(self.decoder_norm(y))

  def __call__(self, inputs, targets):
    return self.decode(self.encode(inputs), inputs, targets)


model = Transformer()


def sample_args():
  inputs = jax.random.randint(jax.random.key(9), (2, 6), 1, 30)
  targets = jax.random.randint(jax.random.key(10), (2, 5), 1, 30)
  # The second pair is padded at the end.
  inputs = inputs.at[1, 4:].set(0)
  targets = targets.at[1, 3:].set(0)
  return inputs, targets


def encode_args():
  return (sample_args()[0],)


SAMPLE_KWARGS = {}
EXTRA_CALLS = (("encode", encode_args, {}),)
