"""A `setup`-style block with raw `self.param` / `self.variable` and custom initializers."""

import flax.linen as nn
import jax
import jax.numpy as jnp


def scaled_normal(scale: float):
  """A normal initializer with a fixed standard deviation."""

  def init(key, shape, dtype=jnp.float32):
    return scale * jax.random.normal(key, shape, dtype)

  return init


class GatedLinear(nn.Module):
  """y = (x W + b) * sigmoid(x G), with a running mean of the inputs kept for monitoring."""

  in_features: int
  features: int
  momentum: float = 0.9

  def setup(self):
    self.kernel = self.param(
      "kernel",
      nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"),
      (self.in_features, self.features),
    )
    self.gate = self.param("gate", scaled_normal(0.02), (self.in_features, self.features))
    self.bias = self.param("bias", nn.initializers.constant(0.1), (self.features,))
    # Not trained: a running mean of the inputs, updated only while training.
    self.input_mean = self.variable(
      "batch_stats", "input_mean", lambda: jnp.zeros((self.in_features,), jnp.float32)
    )

  def __call__(self, x, train: bool = False):
    if train and not self.is_initializing():
      mean = jnp.mean(x, axis=0)
      self.input_mean.value = self.momentum * self.input_mean.value + (1 - self.momentum) * mean
    y = x @ self.kernel + self.bias
    return y * nn.sigmoid(x @ self.gate)


class Regressor(nn.Module):
  """Two gated layers and a scalar output."""

  in_features: int = 12
  hidden: int = 16

  def setup(self):
    self.first = GatedLinear(self.in_features, self.hidden)
    self.second = GatedLinear(self.hidden, self.hidden)
    self.out = nn.Dense(1, kernel_init=nn.initializers.normal(0.02))

  def __call__(self, x, train: bool = False):
    x = nn.gelu(self.first(x, train))
    x = nn.gelu(self.second(x, train))
    return self.out(x)[..., 0]


model = Regressor()


def sample_args():
  return (jax.random.normal(jax.random.key(2), (5, 12), jnp.float32),)


SAMPLE_KWARGS = {"train": False}
EXTRA_CALLS = ((None, sample_args, {"train": True}),)
