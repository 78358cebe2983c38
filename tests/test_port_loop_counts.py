"""`lb.port.draft` of classes whose loop runs once in the sample (`range(self.depth)` at
`depth=1`): the loop's later layers read another width than its first (m3ae's MLP: the first
Dense from the input, the rest from `hidden_dim`), and no configuration that only scales
widths builds a second layer. The count is set to 2 for the evidence and the check, so the
port builds the second layer from the first's output.

The reference is Linen's own `init` and `apply` at depths and widths the draft never saw.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest
from symbolic_port_helpers import assert_equal_at, load, port_error_at

import loopbridge as lb
from loopbridge._port.plan.source import read_class
from loopbridge._port.trace.loop_counts import loop_counts

pytest.importorskip("libcst")

SOURCE = """
import dataclasses

import flax.linen as nn


class MLP(nn.Module):
  hidden_dim: int
  output_dim: int
  depth: int
  stride: int = 1

  @nn.compact
  def __call__(self, inputs):
    x = nn.LayerNorm()(inputs)
    for i in range(self.depth):
      y = nn.LayerNorm()(nn.gelu(nn.Dense(self.hidden_dim)(x)))
      x = x + y if i > 0 else y
    return nn.Dense(self.output_dim)(x)


@dataclasses.dataclass(frozen=True)
class Config:
  width: int
  num_layers: int


class Stack(nn.Module):
  config: Config

  def setup(self):
    layers = []
    for _ in range(0, self.config.num_layers):
      layers.append(nn.Dense(self.config.width))
    self.layers = layers

  def __call__(self, x):
    for layer in self.layers:
      x = nn.relu(layer(x))
    return x
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("loop_counts"), "loop_count_models", SOURCE)


def _x(width: int) -> jax.Array:
  return jax.random.normal(jax.random.key(0), (2, width))


def test_a_count_of_one_a_range_reads_is_found(models):
  """`depth` (a field) and `config.num_layers` are counts; `stride=1` no range reads is not."""
  mlp = models.MLP(6, 5, 1)
  found = loop_counts(mlp, [read_class(models.MLP)])
  assert [s.source() for s in found] == ["self.depth"]
  stack = models.Stack(models.Config(width=6, num_layers=1))
  found = loop_counts(stack, [read_class(models.Stack)])
  assert [s.source() for s in found] == ["self.config.num_layers"]


@pytest.mark.parametrize(("depth", "hidden", "width"), [(2, 6, 4), (3, 10, 7)])
def test_the_loop_of_one_layer_ports_at_other_depths(models, tmp_path, depth, hidden, width):
  draft = lb.port.draft(models.MLP(6, 5, 1), _x(4))
  assert draft.ok, draft.report()
  assert draft.check is not None
  assert any("depth=2" in c for c in draft.check.checked), draft.check.checked
  kwargs = {"inputs_features": width}
  other = models.MLP(hidden, 3, depth)
  draft = dataclasses.replace(draft, init_kwargs={**draft.init_kwargs, **kwargs})
  assert_equal_at(draft, tmp_path, other, _x(width))


def test_a_config_objects_count_of_one(models, tmp_path):
  draft = lb.port.draft(models.Stack(models.Config(width=6, num_layers=1)), _x(6))
  assert draft.ok, draft.report()
  other = models.Stack(models.Config(width=9, num_layers=3))
  draft = dataclasses.replace(draft, init_kwargs={**draft.init_kwargs, "x_features": 5})
  assert port_error_at(draft, tmp_path, other, _x(5)) <= 1e-4
