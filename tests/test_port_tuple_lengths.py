"""`lb.port.draft` of layers built from a tuple of widths, at a tuple of another length.

A tuple's length is a setting too: a user adds a layer. The draft is traced and checked with
each tuple of widths one item longer, so that a width read from a tuple's position
(`self.widths[1]` where the source means the last item, or each loop layer's input width as the
sample's items) is either written as what holds at any length or not `ok`.

The reference is Linen's own `apply` at a configuration the draft never traced, with a tuple
of another length.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from symbolic_port_helpers import ATOL, RTOL, assert_equal_at, load

import loopbridge as lb

pytest.importorskip("libcst")

SOURCE = """
from typing import Callable, Optional, Sequence

import flax.linen as nn


class Head(nn.Module):
  # A loop over the hidden widths, then the output layer after it.
  hidden: Sequence[int]
  out: int

  @nn.compact
  def __call__(self, x):
    for width in self.hidden:
      x = nn.tanh(nn.Dense(width)(x))
    return nn.Dense(self.out)(x)


class Stack(nn.Module):
  # Every layer in the loop; the last one not activated.
  dims: Sequence[int]
  activate_final: bool = False

  @nn.compact
  def __call__(self, x):
    for i, size in enumerate(self.dims):
      x = nn.Dense(size)(x)
      if i + 1 < len(self.dims) or self.activate_final:
        x = nn.relu(x)
    return x


class DropStack(nn.Module):
  # Dropout only where a rate is set (None in the sample); orthogonal kernels, whose
  # initializer needs numbers, not symbols.
  dims: Sequence[int]
  dropout_rate: Optional[float] = None

  @nn.compact
  def __call__(self, x, training: bool = False):
    for i, size in enumerate(self.dims):
      x = nn.Dense(size, kernel_init=nn.initializers.orthogonal(1.4))(x)
      if i + 1 < len(self.dims):
        x = nn.relu(x)
        if self.dropout_rate is not None:
          x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=not training)
    return x


class Convs(nn.Module):
  # Conv widths from a list; the head reads the last one by position.
  channels: Sequence[int]
  classes: int = 3

  @nn.compact
  def __call__(self, x):
    for c in self.channels:
      x = nn.relu(nn.Conv(c, (3, 3))(x))
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.classes)(x)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("tuple_lengths"), "tuple_length_models", SOURCE)


def _x(*shape):
  return jax.random.normal(jax.random.key(0), shape)


@pytest.mark.parametrize(
  "name, first, others, shape",
  [
    (
      "Head",
      dict(hidden=(8, 8), out=3),
      [dict(hidden=(5, 7, 9), out=4), dict(hidden=(6,), out=2)],
      (2, 5),
    ),
    ("Stack", dict(dims=(6, 6)), [dict(dims=(5, 7, 9)), dict(dims=(4,))], (2, 5)),
    pytest.param(
      "Convs",
      dict(channels=[4, 4]),
      [dict(channels=[3, 5, 7], classes=2)],
      (1, 6, 6, 2),
      marks=pytest.mark.slow,  # convolutions at five configurations
    ),
  ],
)
def test_a_width_tuple_of_another_length_builds_and_computes_linen(
  models, tmp_path, name, first, others, shape
):
  cls = getattr(models, name)
  draft = lb.port.draft(cls(**first), _x(*shape))
  assert draft.ok, draft.report()
  assert any("one item longer" in label for label in draft.config_labels), draft.config_labels
  for fields in others:
    assert_equal_at(draft, tmp_path, cls(**fields), _x(*shape))


def test_a_width_read_from_a_fixed_position_holds_at_a_longer_tuple(models, tmp_path):
  """`self.hidden[1]` (the second item, not the last) is right at any length: the check at a
  longer tuple passes and the draft is `ok` and equal to Linen there."""
  source = """
import flax.linen as nn


class Second(nn.Module):
  hidden: tuple = (8, 8)

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(self.hidden[0])(x)
    return nn.Dense(self.hidden[1])(y)
"""
  module = load(tmp_path, "second_item_model", source)
  draft = lb.port.draft(module.Second(), _x(2, 5))
  assert draft.ok, draft.report()
  assert_equal_at(draft, tmp_path, module.Second(hidden=(5, 7, 9)), _x(2, 5))


def test_a_dropout_only_a_set_rate_builds_is_drafted_under_its_test(models, tmp_path):
  """The rate is None in the sample: a configuration with it set traces the dropout layers,
  which the port builds under the source's own tests; the input width is a constructor
  argument though the kernel initializer cannot run on a symbolic shape."""
  draft = lb.port.draft(models.DropStack(dims=(6, 6)), _x(2, 5))
  assert draft.ok, draft.report()
  assert "TODO" not in draft.source
  assert draft.init_kwargs.get("x_features") == 5, draft.init_kwargs
  for fields in (dict(dims=(5, 7, 9)), dict(dims=(4, 3), dropout_rate=0.3)):
    assert_equal_at(draft, tmp_path, models.DropStack(**fields), _x(2, 5))
  # At another input width, passed as the draft's argument.
  from flax import nnx

  other, x = models.DropStack(dims=(5, 7, 9), dropout_rate=0.3), _x(3, 7)
  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  port = namespace["DropStack"](dims=(5, 7, 9), dropout_rate=0.3, x_features=7, rngs=nnx.Rngs(0))
  assert sum(isinstance(m, nnx.Dropout) for _, m in nnx.iter_graph(port)) == 2
  variables = other.init(jax.random.key(1), x)
  lb.checkpoint.linen_to_nnx(other, variables, port, x)
  np.testing.assert_allclose(port(x), other.apply(variables, x), rtol=RTOL, atol=ATOL)
