"""Small Linen models showing idioms of published Linen code the drafter ports: classes wrapped
by a lifted transform at module level, layers built outside the method that calls them, a param
read by a second method, subclasses of flax layers and collections of the user's own."""

import flax.linen as nn
import jax.numpy as jnp


class Channel(nn.Module):
  """One channel's layer, made per-channel below by `nn.vmap` at module level."""

  width: int

  def setup(self):
    self.scale = self.param("scale", nn.initializers.normal(), (self.width,))

  def __call__(self, u):
    return jnp.tanh(u * self.scale.sum())


def per_channel(layer):
  return nn.vmap(
    layer, in_axes=1, out_axes=1, variable_axes={"params": 1}, split_rngs={"params": True}
  )


Channel = per_channel(Channel)


class RematBlock(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(self.features)(x))


RematBlock = nn.remat(RematBlock)
