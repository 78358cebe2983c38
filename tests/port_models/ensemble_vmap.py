"""An ensemble classifier: a shared trunk, a pooling layer written for one example and mapped
over the batch with `nn.vmap` (shared params), then an ensemble of small MLP heads made with
`nn.vmap` (one set of params per member): the members' mean is the prediction, and each
member's logits come back too (their disagreement is the uncertainty)."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class AttentionPool(nn.Module):
  """Pools one example's tokens `(T, D)` into `(D,)`, ignoring the padded ones."""

  @nn.compact
  def __call__(self, tokens, mask):
    scores = nn.Dense(1, use_bias=False)(tokens)[:, 0]
    scores = jnp.where(mask, scores, -1e9)
    return jax.nn.softmax(scores) @ tokens


class Head(nn.Module):
  """One member of the ensemble: a small MLP."""

  hidden: int
  num_classes: int

  @nn.compact
  def __call__(self, h, train):
    h = nn.gelu(nn.Dense(self.hidden)(h))
    h = nn.Dropout(0.2, deterministic=not train)(h)
    return nn.Dense(self.num_classes)(h)


class EnsembleClassifier(nn.Module):
  members: int = 4
  width: int = 16
  num_classes: int = 3

  @nn.compact
  def __call__(self, tokens, mask, train: bool = False):
    x = nn.relu(nn.Dense(self.width, name="embed")(tokens))
    x = nn.LayerNorm()(x)
    # Written for one example; vmap maps it over the batch with one set of params.
    pooled = nn.vmap(
      AttentionPool,
      variable_axes={"params": None},
      split_rngs={"params": False},
      in_axes=(0, 0),
      out_axes=0,
    )(name="pool")(x, mask)
    heads = nn.vmap(
      Head,
      variable_axes={"params": 0},
      split_rngs={"params": True, "dropout": True},  # each member drops its own units
      in_axes=None,
      out_axes=0,
      axis_size=self.members,
    )(2 * self.width, self.num_classes, name="heads")
    logits = heads(pooled, train)  # (members, batch, classes)
    return logits.mean(axis=0), logits


model = EnsembleClassifier()


def sample_args():
  tokens = jax.random.normal(jax.random.key(21), (2, 5, 6), jnp.float32)
  mask = jnp.arange(5)[None, :] < jnp.array([[5], [3]])
  return tokens, mask


SAMPLE_KWARGS = {"train": False}
EXTRA_CALLS = ()
