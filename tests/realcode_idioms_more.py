"""Small Linen models in idioms of published Linen code that drafting translates through
`_port/transforms/` (HF transformers' heads, flax layer subclasses, flax's examples).

Each class names the real code whose idiom it copies. A file, so their source is readable.
"""

import flax.linen as nn
import jax
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


class GroupedBlock(nn.Module):
  """A field default naming another field (ResNeXt-style blocks: `cardinality: int = groups`):
  the class body reads the other field's default when the class is made."""

  features: int = 4
  groups: int = 2
  cardinality: int = groups

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features * self.cardinality)(x)


class WideGroupedBlock(GroupedBlock):
  """A subclass that only changes fields (timm-style variants of one block)."""

  features: int = 6


class UsesFieldOnlySubclass(nn.Module):
  depth: int = 2

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(12)(x)
    for _ in range(self.depth):
      x = WideGroupedBlock()(x)
    return GroupedBlock(features=3)(x)


class NarrowGroupedBlock(GroupedBlock):
  features: int = 2
  groups: int = 3


class ReadsAllItsLayersVariables(nn.Module):
  """Linen machinery the draft has no NNX form for: a submodule's whole variable dict."""

  def setup(self):
    self.dense = nn.Dense(3)

  def __call__(self, x):
    y = self.dense(x)
    sizes = jax.tree.map(jnp.size, self.dense.variables)
    return y * sum(jax.tree.leaves(sizes))


class DottedNames(nn.Module):
  """Layers named with a dot (`name=f"down.block_{i}"`, as ported PyTorch code names them)."""

  depth: int = 2

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(4, name="stem.proj")(x)
    for i in range(self.depth):
      x = nn.Dense(4, name=f"down.block_{i}")(x)
    return nn.Dense(2, name="head.proj")(x)


class MLMHead(nn.Module):
  """HF ALBERT's/BERT's prediction head: the decoder applied with the embedding it is handed."""

  vocab: int = 11
  width: int = 6

  def setup(self):
    self.dense = nn.Dense(self.width)
    self.decoder = nn.Dense(self.vocab, use_bias=False)
    self.bias = self.param("bias", nn.initializers.zeros, (self.vocab,))

  def __call__(self, hidden_states, shared_embedding=None):
    hidden_states = self.dense(hidden_states)
    if shared_embedding is not None:
      hidden_states = self.decoder.apply({"params": {"kernel": shared_embedding.T}}, hidden_states)
    else:
      hidden_states = self.decoder(hidden_states)
    return hidden_states + self.bias


class TiedThroughAnArgument(nn.Module):
  """HF ALBERT for pretraining: the base model's embedding handed to the head when tied."""

  vocab: int = 11
  width: int = 6
  tie_word_embeddings: bool = True

  def setup(self):
    self.model = SharedEmbedModel(self.vocab, self.width)
    self.predictions = MLMHead(self.vocab, self.width)

  def __call__(self, ids):
    hidden_states = self.model(ids)
    if self.tie_word_embeddings:
      shared_embedding = self.model.variables["params"]["shared"]["embedding"]
    else:
      shared_embedding = None
    return self.predictions(hidden_states, shared_embedding=shared_embedding)
