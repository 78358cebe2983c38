"""A small ResNet (the flax ImageNet example's shape): Conv, BatchNorm, strided projections."""

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

ModuleDef = Any


class ResNetBlock(nn.Module):
  """Two 3x3 convolutions; a 1x1 strided projection when the shape changes."""

  filters: int
  conv: ModuleDef
  norm: ModuleDef
  act: Callable
  strides: tuple[int, int] = (1, 1)

  @nn.compact
  def __call__(self, x):
    residual = x
    y = self.conv(self.filters, (3, 3), self.strides)(x)
    y = self.norm()(y)
    y = self.act(y)
    y = self.conv(self.filters, (3, 3))(y)
    # Zero-initialized last norm: each block starts as the identity.
    y = self.norm(scale_init=nn.initializers.zeros_init())(y)
    if residual.shape != y.shape:
      residual = self.conv(self.filters, (1, 1), self.strides, name="conv_proj")(residual)
      residual = self.norm(name="norm_proj")(residual)
    return self.act(residual + y)


class ResNet(nn.Module):
  """Stem, stages of residual blocks, global average pooling and a Dense head."""

  stage_sizes: Sequence[int] = (1, 1)
  num_filters: int = 8
  num_classes: int = 10
  dtype: Any = jnp.float32
  act: Callable = nn.relu

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = partial(nn.Conv, use_bias=False, dtype=self.dtype)
    norm = partial(
      nn.BatchNorm,
      use_running_average=not train,
      momentum=0.9,
      epsilon=1e-5,
      dtype=self.dtype,
    )
    x = conv(self.num_filters, (3, 3), name="conv_init")(x)
    x = norm(name="bn_init")(x)
    x = nn.relu(x)
    for i, block_size in enumerate(self.stage_sizes):
      for j in range(block_size):
        strides = (2, 2) if i > 0 and j == 0 else (1, 1)
        x = ResNetBlock(
          self.num_filters * 2**i, strides=strides, conv=conv, norm=norm, act=self.act
        )(x)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, dtype=self.dtype)(x)


model = ResNet()


def sample_args():
  return (jax.random.normal(jax.random.key(3), (2, 8, 8, 3), jnp.float32),)


SAMPLE_KWARGS = {"train": False}
EXTRA_CALLS = ((None, sample_args, {"train": True}),)
