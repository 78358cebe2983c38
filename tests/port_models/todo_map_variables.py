"""A weight-normalized Dense built with `nn.map_variables`: a lifted transform of the variables
themselves, which has no one-to-one NNX counterpart to draft."""

import flax.linen as nn
import jax
import jax.numpy as jnp


def weight_norm(params):
  """Scale each kernel column to unit norm (nothing to scale before the kernel exists)."""
  if "kernel" not in params:
    return params
  kernel = params["kernel"]
  return {**params, "kernel": kernel / jnp.linalg.norm(kernel, axis=0, keepdims=True)}


class WeightNormMLP(nn.Module):
  features: int = 8

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(16)(x))
    WNDense = nn.map_variables(nn.Dense, "params", trans_in_fn=weight_norm, init=True)
    return WNDense(self.features)(x)


model = WeightNormMLP()


def sample_args():
  return (jax.random.normal(jax.random.key(13), (2, 12), jnp.float32),)


SAMPLE_KWARGS = {}
EXTRA_CALLS = ()
