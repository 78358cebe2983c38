"""A convolutional autoencoder (diffusion-UNet and VQ-GAN shape, small): GroupNorm, a
`nn.Sequential` encoder, strided `ConvTranspose` upsampling back to the input size."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class ResBlock(nn.Module):
  """GroupNorm -> swish -> conv, twice, with a 1x1 projection when the width changes."""

  features: int
  groups: int = 4

  @nn.compact
  def __call__(self, x):
    h = nn.swish(nn.GroupNorm(num_groups=self.groups)(x))
    h = nn.Conv(self.features, (3, 3))(h)
    h = nn.swish(nn.GroupNorm(num_groups=self.groups)(h))
    h = nn.Conv(self.features, (3, 3))(h)
    if x.shape[-1] != self.features:
      x = nn.Conv(self.features, (1, 1), name="skip")(x)
    return x + h


class AutoEncoder(nn.Module):
  base: int = 8
  latent: int = 4

  def setup(self):
    self.encoder = nn.Sequential(
      [
        nn.Conv(self.base, (3, 3), strides=(2, 2)),
        ResBlock(self.base * 2),
        nn.Conv(self.latent, (1, 1)),
      ]
    )
    self.up = nn.ConvTranspose(self.base, (4, 4), strides=(2, 2))
    self.decoder_block = ResBlock(self.base)
    self.to_rgb = nn.Conv(3, (3, 3))

  def encode(self, images):
    return self.encoder(images)

  def decode(self, z):
    return self.to_rgb(self.decoder_block(nn.swish(self.up(z))))

  def __call__(self, images):
    return self.decode(self.encode(images))


model = AutoEncoder()


def sample_args():
  return (jax.random.normal(jax.random.key(14), (2, 8, 8, 3), jnp.float32),)


def latents():
  return (jax.random.normal(jax.random.key(15), (2, 4, 4, 4), jnp.float32),)


SAMPLE_KWARGS = {}
EXTRA_CALLS = (("decode", latents, {}),)
