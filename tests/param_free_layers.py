"""A layer without params, in a module of its own: `sharded_remat_idioms` builds it as
`param_free_layers.Blur(...)`."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp


class Blur(nn.Module):
  """A layer without params: a fixed filter made in setup, a depthwise convolution."""

  size: int = 3

  def setup(self):
    taps = jnp.array([math.comb(self.size - 1, k) for k in range(self.size)], jnp.float32)
    self.taps = taps / taps.sum()

  def __call__(self, x):
    c = x.shape[-1]
    kernel = jnp.tile(self.taps[:, None, None], (1, 1, c))
    return jax.lax.conv_general_dilated(
      x, kernel, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=c
    )


class TapsBlur(nn.Module):
  """A layer without params whose filter setup binds to a list of taps first, then to an array
  made from it (normalized in place)."""

  size: int = 3

  def setup(self):
    if self.size == 3:
      self.taps = [1.0, 2.0, 1.0]
    else:
      self.taps = [1.0, 4.0, 6.0, 4.0, 1.0]
    self.taps = jnp.array(self.taps, jnp.float32)
    self.taps /= jnp.sum(self.taps)

  def __call__(self, x):
    c = x.shape[-1]
    kernel = jnp.tile(self.taps[:, None, None], (1, 1, c))
    return jax.lax.conv_general_dilated(
      x, kernel, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=c
    )
