"""A sentiment-style classifier: token embeddings, an LSTM over time with padding, a Dense head."""

import flax.linen as nn
import jax
import jax.numpy as jnp

PAD_ID = 0


class TextClassifier(nn.Module):
  """Embed tokens, run an LSTM over the unpadded steps, mean-pool them and classify."""

  vocab_size: int = 50
  embedding_size: int = 16
  hidden_size: int = 16
  num_classes: int = 3

  @nn.compact
  def __call__(self, tokens):
    mask = tokens != PAD_ID
    lengths = jnp.sum(mask, axis=-1)
    x = nn.Embed(self.vocab_size, self.embedding_size, name="embedder")(tokens)
    # The RNN stops carrying at each sequence's length; padded steps come back as zeros.
    hidden = nn.RNN(nn.OptimizedLSTMCell(self.hidden_size), name="lstm")(x, seq_lengths=lengths)
    pooled = jnp.sum(hidden * mask[..., None], axis=1) / jnp.maximum(lengths, 1)[:, None]
    return nn.Dense(self.num_classes, name="output_layer")(pooled)


model = TextClassifier()


def sample_args():
  tokens = jax.random.randint(jax.random.key(6), (3, 7), 1, 50)
  # Sequences of lengths 7, 5 and 2, padded at the end.
  lengths = jnp.array([7, 5, 2])
  return (jnp.where(jnp.arange(7)[None, :] < lengths[:, None], tokens, PAD_ID),)


SAMPLE_KWARGS = {}
EXTRA_CALLS = ()
