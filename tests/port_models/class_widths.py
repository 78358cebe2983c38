"""Models for drafting the class, not one instance (`tests/test_port_class.py`).

`Net` reads its widths from a config dataclass and runs lm1b's `MlpBlock` idiom (the output
width is the input's unless `out_dim` is given); `Odd` has a width no field expression
explains (`3 * features + 1`), so its port is right at the traced configuration only.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Config:
  features: int = 8
  hidden: int = 12


class Mlp(nn.Module):
  config: Config
  out_dim: int | None = None

  @nn.compact
  def __call__(self, inputs):
    actual_out_dim = inputs.shape[-1] if self.out_dim is None else self.out_dim
    x = nn.Dense(self.config.hidden)(inputs)
    x = nn.relu(x)
    return nn.Dense(actual_out_dim)(x)


class Net(nn.Module):
  config: Config

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.config.features)(x)
    x = nn.LayerNorm()(x)
    y = Mlp(self.config)(x)
    z = Mlp(self.config, out_dim=5, name="head")(x)
    return y, z


class Odd(nn.Module):
  features: int = 4

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(3 * self.features + 1)(x)
    return nn.Dense(2)(x)


model = Net(Config())


def sample_args():
  return (jax.random.normal(jax.random.key(0), (2, 6), jnp.float32),)


class Frozen(nn.Module):
  """Layers frozen by a literal (fine-tuning on top of fixed statistics, no dropout)."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    x = nn.BatchNorm(use_running_average=True)(x)
    x = nn.Dropout(0.5, deterministic=True)(x)
    return nn.Dense(3)(x)


class Widths(nn.Module):
  """A field with a default factory: each instance gets its own list of widths."""

  widths: list[int] = dataclasses.field(default_factory=lambda: [6, 4])

  @nn.compact
  def __call__(self, x):
    for w in self.widths:
      x = nn.Dense(w)(x)
    return x


class Trainable(nn.Module):
  """A field named `train`, as many Linen models have."""

  train: bool = False

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    x = nn.Dropout(0.5)(x, deterministic=not self.train)
    return nn.Dense(2)(x) * (2.0 if self.train else 1.0)


class AddPositions(nn.Module):
  """lm1b's `AddPositionEmbs`: a learned table sized from the input's width, and the sequence
  length read by the call alone (`pe[:, :length]`)."""

  max_len: int = 16

  @nn.compact
  def __call__(self, inputs):
    length = inputs.shape[1]
    pos_emb_shape = (1, self.max_len, inputs.shape[-1])
    table = self.param("pos_embedding", nn.initializers.normal(0.02), pos_emb_shape)
    return inputs + table[:, :length, :]


class Embedder(nn.Module):
  config: Config

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(50, self.config.features)(tokens)
    return nn.Dense(3)(AddPositions()(x))


def token_args(length: int = 8):
  return (jax.random.randint(jax.random.key(4), (2, length), 0, 50),)


class OptionalPositions(nn.Module):
  """lm1b's `AddPositionEmbs` at its default config: the learned table is built only when
  asked for, so the sample's trace never makes it (a fixed table stands in otherwise)."""

  max_len: int = 16
  learned: bool = False

  @nn.compact
  def __call__(self, inputs):
    length = inputs.shape[1]
    pos_emb_shape = (1, self.max_len, inputs.shape[-1])
    if self.learned:
      table = self.param("pos_embedding", nn.initializers.normal(0.02), pos_emb_shape)
    else:
      table = jnp.zeros(pos_emb_shape)
    return inputs + table[:, :length, :]


class OptionalEmbedder(nn.Module):
  config: Config
  learned: bool = False

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(50, self.config.features)(tokens)
    return nn.Dense(3)(OptionalPositions(learned=self.learned)(x))
