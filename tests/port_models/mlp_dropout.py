"""An MLP classifier with dropout between its hidden layers (the flax MNIST-example shape)."""

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
  """Hidden Dense layers with ReLU and dropout, then a Dense head."""

  hidden: Sequence[int] = (32, 16)
  num_classes: int = 10
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, x, train: bool = False):
    for width in self.hidden:
      x = nn.Dense(width)(x)
      x = nn.relu(x)
      # Dropout only while training; evaluation is deterministic.
      x = nn.Dropout(rate=self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes, name="head")(x)


model = MLP()


def sample_args():
  return (jax.random.normal(jax.random.key(1), (4, 24), jnp.float32),)


SAMPLE_KWARGS = {"train": False}
EXTRA_CALLS = ()
