"""`lb.port.draft` of widths that only another side of a test shows, on a residual block with
`out_channels: int = None` (its width then the input's), a shortcut chosen by a flag, and a
stage whose setup loop rebinds the width it passes to each block (vqgan-jax's idiom).

Each port is built at configurations and input widths the sample did not have, and compared
with Linen's own `init` and `apply` there.
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


class Block(nn.Module):
  in_channels: int
  out_channels: int = None
  use_dense_shortcut: bool = False

  def setup(self):
    self.out_channels_ = self.in_channels if self.out_channels is None else self.out_channels
    self.norm1 = nn.LayerNorm()
    self.dense1 = nn.Dense(self.out_channels_)
    self.norm2 = nn.LayerNorm()
    self.dense2 = nn.Dense(self.out_channels_)
    if self.in_channels != self.out_channels_:
      if self.use_dense_shortcut:
        self.dense_shortcut = nn.Dense(self.out_channels_, use_bias=False)
      else:
        self.nin_shortcut = nn.Dense(self.out_channels_)

  def __call__(self, x):
    h = self.dense1(nn.swish(self.norm1(x)))
    h = self.dense2(nn.swish(self.norm2(h)))
    if self.in_channels != self.out_channels_:
      if self.use_dense_shortcut:
        x = self.dense_shortcut(x)
      else:
        x = self.nin_shortcut(x)
    return x + h


class Stage(nn.Module):
  ch: int = 4
  mult: tuple = (1, 2)
  num_blocks: int = 2

  def setup(self):
    block_in = self.ch * self.mult[0]
    block_out = self.ch * self.mult[1]
    blocks = []
    for _ in range(self.num_blocks):
      blocks.append(Block(block_in, block_out))
      block_in = block_out
    self.blocks = blocks
    self.proj_in = nn.Dense(self.ch * self.mult[0])

  def __call__(self, x):
    x = self.proj_in(x)
    for block in self.blocks:
      x = block(x)
    return x
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("branch_evidence"), "branch_evidence_models", SOURCE)


def _port_at(draft, linen, x, **kwargs):
  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  port = namespace[draft.root](**kwargs, rngs=nnx.Rngs(0))
  variables = linen.init(jax.random.key(1), x)
  lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  np.testing.assert_allclose(port(x), linen.apply(variables, x), rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def block_draft(models):
  x = jax.random.normal(jax.random.key(0), (2, 4))
  return lb.port.draft(models.Block(4, 8), x)


def test_a_width_none_defaults_to_is_traced_at_none(block_draft):
  assert block_draft.ok, block_draft.report()
  assert "out_channels=None" in block_draft.report()
  assert "self.out_channels," not in block_draft.source  # norm2 reads the built width


@pytest.mark.parametrize(
  "settings",
  [dict(in_channels=6), dict(in_channels=6, out_channels=10, use_dense_shortcut=True)],
  ids=["out-channels-none", "dense-shortcut"],
)
def test_the_block_computes_linen_at_the_other_sides(models, block_draft, settings):
  x = jax.random.normal(jax.random.key(2), (3, 6))  # another input width than the sample's 4
  _port_at(block_draft, models.Block(**settings), x, **settings, x_features=6)


def test_a_setup_loop_passes_its_rebound_local(models):
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.Stage(), x)
  assert draft.ok, draft.report()
  assert "Block(block_in, block_out" in draft.source.replace("\\n", " ").replace("    ", "")
  settings = dict(ch=3, mult=(2, 3), num_blocks=3)
  x = jax.random.normal(jax.random.key(3), (2, 6))
  _port_at(draft, models.Stage(**settings), x, **settings, x_features=6)
