"""`lb.port.draft` of a setup layer no traced call reached (a time-embedding projection called
only when `temb` is passed): the port builds it only where its input width is given, so by
default it holds what Linen holds after the calls traced, and given the width it computes
what Linen computes when the layer is called.

The reference is Linen's own `init` and `apply` with the argument the sample never passed.
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
  features: int = 6
  temb_channels: int = 16

  def setup(self):
    self.dense = nn.Dense(self.features)
    if self.temb_channels:
      self.temb_proj = nn.Dense(self.features)
    self.norm = nn.LayerNorm()

  def __call__(self, x, temb=None):
    h = self.dense(self.norm(x))
    if temb is not None:
      h = h + self.temb_proj(temb)
    return h


class Outer(nn.Module):
  width: int = 6

  @nn.compact
  def __call__(self, x):
    return Block(self.width)(x) + Block(self.width, temb_channels=0)(x)


class ReadsSettings(nn.Module):
  def setup(self):
    self.conv = nn.Conv(4, kernel_size=(3,), padding="VALID")

  def __call__(self, x):
    return x * self.conv.features
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("unreached"), "unreached_models", SOURCE)


def test_a_layer_only_called_with_an_argument_never_passed_is_built_when_given(models):
  x = jax.random.normal(jax.random.key(0), (3, 5))
  draft = lb.port.draft(models.Block(), x)
  assert draft.ok, draft.report()
  assert "temb_proj_in_features: int | None = None" in draft.source
  assert "self.temb_proj: no traced call" in draft.report()
  port, _ = draft.port_and_variables()
  assert port.temb_proj is None  # as Linen's variables: no call made it
  # Given the width, the port computes what Linen computes where the layer is called.
  temb = jax.random.normal(jax.random.key(1), (3, 7))
  module = models.Block(features=9)
  variables = module.init(jax.random.key(2), x, temb)
  assert "temb_proj" in variables["params"]
  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  port = namespace["Block"](features=9, temb_proj_in_features=7, rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(module, variables, port, x, temb)
  np.testing.assert_allclose(port(x, temb), module.apply(variables, x, temb), rtol=RTOL, atol=ATOL)


def test_a_parent_leaves_the_unreached_width_unset(models):
  x = jax.random.normal(jax.random.key(0), (2, 5))
  draft = lb.port.draft(models.Outer(), x)
  assert draft.ok, draft.report()
  assert "temb_proj_in_features=" not in draft.source.split("class Outer")[1]


def test_a_layer_whose_settings_are_read_stays_a_todo(models):
  draft = lb.port.draft(models.ReadsSettings(), jax.numpy.ones((2, 5, 3)))
  assert not draft.ok
  (todo,) = draft.todos
  assert "nnx.Conv needs in_features" in todo.reason
