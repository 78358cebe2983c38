"""`lb.port.draft` of residual blocks whose widths a number in the source divides
(`nn.GroupNorm(num_groups=32)` of `ch` channels, as taming-transformers' VQGAN writes them): a
lone symbol cannot pass the group norm's divisibility check, so the setting is traced as a
multiple of its own value. The stage passes each block its input width, and a shortcut only the
first block builds (`in_channels != out_channels`) takes that block's input width, not a tuple
of the sample's numbers per block.

The reference is Linen's own `init` and `apply` at settings, block counts and input widths the
draft never saw.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from symbolic_port_helpers import ATOL, RTOL, load

import loopbridge as lb

pytest.importorskip("libcst")

SOURCE = """
import flax.linen as nn


class Res(nn.Module):
  in_channels: int
  out_channels: int = None

  def setup(self):
    self.out_ = self.in_channels if self.out_channels is None else self.out_channels
    self.norm1 = nn.GroupNorm(num_groups=32)
    self.conv1 = nn.Conv(self.out_, (3, 3))
    self.norm2 = nn.GroupNorm(num_groups=32)
    self.conv2 = nn.Conv(self.out_, (3, 3))
    if self.in_channels != self.out_:
      self.nin = nn.Conv(self.out_, (1, 1))

  def __call__(self, x):
    r = x
    h = self.conv1(nn.swish(self.norm1(x)))
    h = self.conv2(nn.swish(self.norm2(h)))
    if self.in_channels != self.out_:
      r = self.nin(r)
    return h + r


class Up(nn.Module):
  ch: int
  n: int = 2

  def setup(self):
    block_in = self.ch * 2
    blocks = []
    for _ in range(self.n):
      blocks.append(Res(block_in, self.ch))
      block_in = self.ch
    self.blocks = blocks

  def __call__(self, x):
    for b in self.blocks:
      x = b(x)
    return x
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("divided_widths"), "divided_width_models", SOURCE)


@pytest.fixture(scope="module")
def draft(models):
  return lb.port.draft(models.Up(32), jax.random.normal(jax.random.key(0), (1, 4, 4, 64)))


def _port_error(draft, linen, x, **kwargs):
  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  port = namespace[draft.root](**kwargs, rngs=nnx.Rngs(0))
  variables = linen.init(jax.random.key(1), x)
  lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  x2 = jax.random.normal(jax.random.key(2), x.shape)
  np.testing.assert_allclose(port(x2), linen.apply(variables, x2), rtol=RTOL, atol=ATOL)


def test_no_width_is_the_samples_number(draft):
  assert draft.ok, draft.report()
  assert not draft.literals
  # The shortcut's width is the block's input width, wherever the block builds it.
  assert "self.nin = nnx.Conv(norm1_num_features, self.out_" in draft.source
  assert "(64, None)" not in draft.source


@pytest.mark.parametrize(("ch", "n", "width"), [(64, 3, 128), (32, 1, 96), (64, 2, 32)])
def test_the_port_computes_linen_elsewhere(models, draft, ch, n, width):
  x = jax.random.normal(jax.random.key(3), (2, 5, 5, width))
  _port_error(draft, models.Up(ch, n), x, ch=ch, n=n, x_features=width)
