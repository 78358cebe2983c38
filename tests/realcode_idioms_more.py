"""Small Linen models in idioms of published Linen code that drafting translates through
`_port/transforms/` (HF transformers' heads, flax layer subclasses, flax's examples).

Each class names the real code whose idiom it copies. A file, so their source is readable.
"""

import flax.linen as nn
import jax.numpy as jnp


class SharedEmbedModel(nn.Module):
  """The base model of an HF head: its token embedding is the head's output layer too."""

  vocab: int = 11
  width: int = 6

  def setup(self):
    self.shared = nn.Embed(self.vocab, self.width)
    self.mix = nn.Dense(self.width)

  def __call__(self, ids):
    return jnp.tanh(self.mix(self.shared(ids)))


class TiedLMHead(nn.Module):
  """HF BART's ...ForConditionalGeneration (GPT-2's, OPT's LM heads alike): the output layer
  applied with the embedding's transpose as its kernel when the embeddings are tied."""

  vocab: int = 11
  width: int = 6
  tie_word_embeddings: bool = True

  def setup(self):
    self.model = SharedEmbedModel(self.vocab, self.width)
    self.lm_head = nn.Dense(self.vocab, use_bias=False)

  def __call__(self, ids):
    hidden_states = self.model(ids)
    if self.tie_word_embeddings:
      shared_embedding = self.model.variables["params"]["shared"]["embedding"]
      lm_logits = self.lm_head.apply({"params": {"kernel": shared_embedding.T}}, hidden_states)
    else:
      lm_logits = self.lm_head(hidden_states)
    return lm_logits
