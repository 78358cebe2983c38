"""`lb.port.draft` reads widths from a symbolic trace: each width is the expression of the
settings (fields, tuple items, config attributes) and input sizes it is computed from, never a
field that only equals it in the sample. What the symbolic trace cannot decide is matched by
value, named in `draft.literals`, and checked where every setting is distinct.

The reference is Linen's own `apply` at a configuration the draft never traced.
"""

from __future__ import annotations

import jax
import pytest
from symbolic_port_helpers import assert_equal_at, load

import loopbridge as lb

SOURCE = """
import dataclasses
import typing as tp
import flax.linen as nn


@dataclasses.dataclass(frozen=True)
class Config:
  mlp: int = 8


class Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm()(nn.Dense(self.features)(x))


class ParentPass(nn.Module):
  emb: int = 8
  hidden: int = 8

  @nn.compact
  def __call__(self, x):
    return Block(self.hidden)(nn.Dense(self.emb)(x))


class Sizes(nn.Module):
  layer_sizes: tp.Sequence[int] = (8, 8, 4)
  config: Config = Config()

  @nn.compact
  def __call__(self, x):
    for size in self.layer_sizes:
      x = nn.relu(nn.Dense(size)(x))
    return nn.Dense(self.config.mlp)(x)


class InputTied(nn.Module):
  in_dim: int = 8
  hidden: int = 8

  @nn.compact
  def __call__(self, x):
    assert x.shape[-1] == self.in_dim
    return x + nn.Dense(self.in_dim)(nn.Dense(self.hidden)(x))


class FloatRatio(nn.Module):
  hidden: int = 8
  mlp_ratio: float = 2.0

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.hidden)(nn.Dense(int(self.hidden * self.mlp_ratio))(x))
"""


@pytest.mark.slow  # a draft and its checks at four configurations
def test_a_child_input_width_is_passed_by_the_parent(tmp_path):
  """emb == hidden in the sample: the block's input width is the parent's `emb`, passed in
  (before: the block's own `features`, wrong wherever emb != hidden)."""
  m = load(tmp_path, "symbolic_parent_pass", SOURCE)
  x = jax.random.normal(jax.random.key(0), (2, 8))
  draft = lb.port.draft(m.ParentPass(), x)
  assert draft.ok, draft.report()
  assert "Block(self.hidden, Dense_0_in_features=self.emb" in draft.source
  assert_equal_at(draft, tmp_path, m.ParentPass(emb=5, hidden=11), x)


@pytest.mark.slow  # a draft and its checks at four configurations
def test_tuple_items_and_config_attributes_are_the_widths(tmp_path):
  """Equal items of a tuple setting and a config attribute: each width is its own read."""
  m = load(tmp_path, "symbolic_sizes", SOURCE)
  x = jax.random.normal(jax.random.key(0), (2, 8))
  draft = lb.port.draft(m.Sizes(), x)
  assert draft.ok, draft.report()
  # Each layer's input width is the previous layer's output width (the loop's list, then
  # its last layer), which holds at any length of the tuple; the output width is the config's.
  assert "Dense[-1].out_features" in draft.source and "self.config.mlp" in draft.source
  for other in (
    m.Sizes(layer_sizes=(5, 7, 3), config=m.Config(mlp=6)),
    m.Sizes(layer_sizes=(5, 7, 3, 9), config=m.Config(mlp=6)),
  ):
    assert_equal_at(draft, tmp_path, other, x)


@pytest.mark.slow  # a draft and its checks at four configurations
def test_an_input_width_a_setting_asserts_is_that_setting(tmp_path):
  m = load(tmp_path, "symbolic_input_tied", SOURCE)
  x = jax.random.normal(jax.random.key(0), (2, 8))
  draft = lb.port.draft(m.InputTied(), x)
  assert draft.ok, draft.report()
  other_x = jax.random.normal(jax.random.key(0), (2, 6))
  assert_equal_at(draft, tmp_path, m.InputTied(in_dim=6, hidden=10), other_x)


@pytest.mark.slow  # a draft and its checks at four configurations
def test_a_width_of_a_float_setting_is_named_and_checked_where_settings_differ(tmp_path):
  """`int(self.hidden * self.mlp_ratio)`: no symbol passes a float product, so the width is
  matched by value and named; it is ok only as the check at the distinct configuration
  (another mlp_ratio, another hidden) passed, and Linen agrees at a third."""
  m = load(tmp_path, "symbolic_float_ratio", SOURCE)
  x = jax.random.normal(jax.random.key(0), (2, 8))
  draft = lb.port.draft(m.FloatRatio(), x)
  assert draft.literals, draft.report()
  assert any("hidden" in b.why for b in draft.literals)
  assert "matched by value" in draft.report()
  assert [b.expression for b in draft.literals] == ["int(self.hidden * self.mlp_ratio)"]
  assert any(label.startswith("every setting distinct") for label in draft.config_labels)
  assert draft.ok, draft.report()
  assert_equal_at(draft, tmp_path, m.FloatRatio(hidden=6, mlp_ratio=2.5), x)


def test_symbolic_trace_writes_each_width_in_the_source_names(tmp_path):
  """The symbolic trace alone (no draft): an MLP from a tuple setting and a config attribute,
  equal-valued in the sample, gives each kernel as its own reads and the input's width."""
  from loopbridge._port.records import Call
  from loopbridge._port.trace.tracing.expressions import reads, written
  from loopbridge._port.trace.tracing.symbolic import symbolic_trace

  m = load(tmp_path, "symbolic_trace_only", SOURCE)
  found = symbolic_trace(m.Sizes(), Call(jax.numpy.ones((2, 8))), (), 0)
  assert found is not None and not found.concrete
  root = found.trace.instances[()]
  env = [*reads(root.module), (found.bound[next(iter(found.bound))], "batch")]
  env += [(v, "x_features") for c, v in found.bound.items() if getattr(c, "axis", None) == 1]
  kernels = [
    written(found.trace.instances[(f"Dense_{i}",)].variables[("params", "kernel")].shape, env)
    for i in range(4)
  ]
  assert kernels == [
    "(x_features, self.layer_sizes[0])",
    "(self.layer_sizes[0], self.layer_sizes[1])",
    "(self.layer_sizes[1], self.layer_sizes[2])",
    "(self.layer_sizes[2], self.config.mlp)",
  ]


def test_a_float_setting_keeps_its_integer_concrete(tmp_path):
  """`int(self.hidden * self.mlp_ratio)`: no symbol passes it, so `hidden` is kept concrete
  and listed; the input's sizes stay symbolic."""
  from loopbridge._port.records import Call
  from loopbridge._port.trace.tracing.symbolic import symbolic_trace

  m = load(tmp_path, "symbolic_trace_float", SOURCE)
  found = symbolic_trace(m.FloatRatio(), Call(jax.numpy.ones((2, 8))), (), 0)
  assert found is not None
  assert [c.source() for c in found.concrete_settings()] == ["self.hidden"]
