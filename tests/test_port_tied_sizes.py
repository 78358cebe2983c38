"""`lb.port.draft` of a block whose input width is tied to a setting: it adds its input to a
layer of `config.ch` channels, so Linen runs only where the input has `config.ch` channels.
Changing the setting alone, or the input alone, is refused by Linen; the width is read from a
symbolic trace where the input axis and the setting share one symbol, and the check runs the
port where both change together.

The reference is Linen's own `init` and `apply` at a configuration and input the draft never saw.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from symbolic_port_helpers import assert_equal_at, load

import loopbridge as lb
from loopbridge._port.check.tied_sizes import at_tied_sizes
from loopbridge._port.records import Check

pytest.importorskip("libcst")

SOURCE = """
import dataclasses

import flax.linen as nn


@dataclasses.dataclass(frozen=True)
class Cfg:
  ch: int = 8
  mult: int = 2
  groups: int = 4


class Block(nn.Module):
  config: Cfg

  @nn.compact
  def __call__(self, x):
    h = nn.GroupNorm(self.config.groups)(x)
    h = nn.Conv(self.config.ch, (3, 3))(h)
    h = x + h
    return nn.Conv(self.config.ch * self.config.mult, (1, 1))(h)


class Twice(nn.Module):
  b: int
  head: int

  @nn.compact
  def __call__(self, x):
    h = nn.GroupNorm(num_groups=2)(x)
    h = nn.relu(nn.Dense(self.b)(h))
    x = x + nn.Dense(2 * self.b)(h)
    return nn.Dense(self.head)(x)
"""

TIED = "a setting changed with the input axes that follow it (config.ch=16, argument 0.shape[3]=16)"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("tied_sizes"), "tied_size_models", SOURCE)


@pytest.fixture(scope="module")
def draft(models):
  x = jax.random.normal(jax.random.key(0), (2, 6, 6, 8))
  return lb.port.draft(models.Block(models.Cfg()), x)


def test_linen_refuses_the_setting_or_the_input_changed_alone(models):
  with pytest.raises(TypeError):
    models.Block(models.Cfg(ch=16)).init(jax.random.key(0), np.ones((1, 6, 6, 8), np.float32))
  with pytest.raises(TypeError):
    models.Block(models.Cfg()).init(jax.random.key(0), np.ones((1, 6, 6, 16), np.float32))


def test_the_tied_width_is_the_setting(models, draft, tmp_path):
  assert draft.ok, draft.report()
  assert "nnx.Conv(self.config.ch, self.config.ch, (3, 3)" in draft.source
  assert "nnx.GroupNorm(self.config.ch, self.config.groups" in draft.source
  assert not draft.literals
  assert draft.check is not None and TIED in draft.check.checked
  for ch, groups in ((16, 4), (24, 8)):
    other = models.Block(models.Cfg(ch=ch, groups=groups))
    x = jax.random.normal(jax.random.key(1), (2, 5, 5, ch))
    assert_equal_at(draft, tmp_path, other, x)


def test_the_check_refuses_the_samples_width(draft):
  passed = Check(True, (), None, None)
  right = at_tied_sizes(draft, passed)
  assert right.equal and TIED in right.checked
  wrong_source = draft.source.replace(
    "nnx.Conv(self.config.ch, self.config.ch, (3, 3)", "nnx.Conv(8, self.config.ch, (3, 3)"
  )
  assert wrong_source != draft.source
  wrong = at_tied_sizes(dataclasses.replace(draft, source=wrong_source), passed)
  assert not wrong.equal
  assert TIED in (wrong.error or wrong.first_divergence or "")


def test_an_input_twice_a_setting(models, tmp_path):
  draft = lb.port.draft(models.Twice(4, 6), jax.random.normal(jax.random.key(0), (2, 8)))
  assert draft.ok, draft.report()
  assert "nnx.Linear(self.b, 2 * self.b" in draft.source
  assert "nnx.GroupNorm(2 * self.b, 2" in draft.source
  assert_equal_at(
    draft, tmp_path, models.Twice(10, 3), jax.random.normal(jax.random.key(1), (2, 20))
  )
  wrong_source = draft.source.replace("nnx.Linear(self.b, 2 * self.b", "nnx.Linear(4, 2 * self.b")
  wrong = at_tied_sizes(
    dataclasses.replace(draft, source=wrong_source), Check(True, (), None, None)
  )
  assert not wrong.equal
  assert "(b=12, argument 0.shape[1]=24)" in (wrong.error or wrong.first_divergence or "")
