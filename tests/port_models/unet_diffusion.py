"""A diffusion UNet (DDPM / Stable Diffusion shape, small): a sinusoidal timestep embedding,
residual blocks per level in nested loops, a downsampling block on every level but the last,
skip connections concatenated on the way up, nearest-neighbour upsampling."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp


def timestep_embedding(t, dim):
  """Sinusoidal embedding of the diffusion step (no parameters)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(10_000) * jnp.arange(half) / half)
  args = t[:, None] * freqs[None]
  return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


class ResBlock(nn.Module):
  """GroupNorm -> silu -> conv, the timestep added between, a 1x1 skip when the width changes."""

  out_ch: int
  groups: int = 2

  @nn.compact
  def __call__(self, x, temb):
    h = nn.silu(nn.GroupNorm(num_groups=self.groups)(x))
    h = nn.Conv(self.out_ch, (3, 3), padding="SAME")(h)
    h = h + nn.Dense(self.out_ch)(nn.silu(temb))[:, None, None, :]
    h = nn.silu(nn.GroupNorm(num_groups=self.groups)(h))
    h = nn.Conv(self.out_ch, (3, 3), padding="SAME")(h)
    if x.shape[-1] != self.out_ch:
      x = nn.Conv(self.out_ch, (1, 1), name="skip")(x)
    return x + h


class Downsample(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Conv(x.shape[-1], (3, 3), strides=(2, 2), padding="SAME")(x)


class Upsample(nn.Module):
  @nn.compact
  def __call__(self, x):
    b, h, w, c = x.shape
    x = jax.image.resize(x, (b, h * 2, w * 2, c), "nearest")
    return nn.Conv(c, (3, 3), padding="SAME")(x)


class UNet(nn.Module):
  ch: int = 4
  mults: tuple[int, ...] = (1, 2)
  blocks: int = 1

  @nn.compact
  def __call__(self, x, t):
    temb = timestep_embedding(t, self.ch)
    temb = nn.Dense(self.ch * 4)(nn.silu(nn.Dense(self.ch * 4)(temb)))
    h = nn.Conv(self.ch, (3, 3), padding="SAME")(x)
    hs = [h]
    for level, mult in enumerate(self.mults):
      for _ in range(self.blocks):
        h = ResBlock(self.ch * mult)(h, temb)
        hs.append(h)
      if level != len(self.mults) - 1:
        h = Downsample()(h)
        hs.append(h)
    h = ResBlock(h.shape[-1], name="mid")(h, temb)
    for level, mult in reversed(list(enumerate(self.mults))):
      for _ in range(self.blocks + 1):
        h = ResBlock(self.ch * mult)(jnp.concatenate([h, hs.pop()], axis=-1), temb)
      if level != 0:
        h = Upsample()(h)
    h = nn.silu(nn.GroupNorm(num_groups=2)(h))
    return nn.Conv(x.shape[-1], (3, 3), padding="SAME")(h)


model = UNet()


def sample_args():
  images = jax.random.normal(jax.random.key(16), (2, 8, 8, 3), jnp.float32)
  return images, jnp.array([3.0, 250.0], jnp.float32)


SAMPLE_KWARGS = {}
EXTRA_CALLS = ()
