"""`lb.port.draft` of layers a loop builds, and of settings Linen only takes in order.

A loop whose count is a setting builds as many layers as that setting says: each layer's input
width is the previous layer's width, never the sample's widths indexed by the loop (which hold
only for the sample's count). A model whose settings must divide one another refuses the
distinct primes; the draft is checked at distinct powers of two in the sample's order instead,
and says so.

The reference is Linen's own `apply` at a configuration the draft never traced.
"""

from __future__ import annotations

import re

import jax
import pytest
from symbolic_port_helpers import assert_equal_at, load

import loopbridge as lb

SOURCE = """
import flax.linen as nn


class Layer(nn.Module):
  in_features: int
  out_features: int

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(self.out_features)(x))


class Stage(nn.Module):
  in_features: int = 4
  out_features: int = 6
  depth: int = 2

  def setup(self):
    layers = [Layer(self.in_features, self.out_features, name="0")]
    for i in range(self.depth - 1):
      layers.append(Layer(self.out_features, self.out_features, name=str(i + 1)))
    self.layers = layers

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


class Heads(nn.Module):
  features: int = 8
  heads: int = 2

  @nn.compact
  def __call__(self, x):
    if self.features % self.heads:
      raise ValueError("heads must divide features")
    y = nn.Dense(self.features)(x).reshape(x.shape[0], self.heads, -1)
    return nn.Dense(3)(y.sum(axis=1))
"""


@pytest.mark.slow  # a draft and its checks at three configurations
def test_a_layer_appended_in_a_loop_takes_the_previous_layers_width(tmp_path):
  """`depth` is a count the symbolic trace keeps concrete: before, the appended layers' input
  widths were the sample's `(4, 6)[len(layers)]`, out of range at a deeper configuration."""
  m = load(tmp_path, "loop_widths_stage", SOURCE)
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(m.Stage(), x, configs=())
  assert draft.ok, draft.report()
  code = re.sub(r"\s+", "", draft.source)
  assert "(x_featuresifnotlayerselselayers[-1].out_features)" in code
  assert_equal_at(draft, tmp_path, m.Stage(out_features=7, depth=4), x)


@pytest.mark.slow  # a draft and its checks at three configurations
def test_settings_that_must_divide_are_checked_at_powers_of_two(tmp_path):
  """Distinct primes break `heads | features`: the check runs at distinct powers of two in the
  sample's order, which keep it, and the verdict names that configuration."""
  m = load(tmp_path, "loop_widths_heads", SOURCE)
  x = jax.random.normal(jax.random.key(0), (2, 5))
  draft = lb.port.draft(m.Heads(), x, configs=())
  assert draft.ok, draft.report()
  labels = [label for label in draft.config_labels if label.startswith("every setting distinct")]
  assert labels and all("powers of two" in label for label in labels), draft.config_labels
  assert_equal_at(draft, tmp_path, m.Heads(features=12, heads=3), x)
