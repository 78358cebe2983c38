"""`lb.port.draft` of a Linen class that writes its own call over another user class's fields
(a bottleneck block subclassing a basic block): one NNX class holding the base's fields and the
methods it does not override, no Linen base left.

The reference is Linen's own `apply` at the sample's configuration and at another one.
"""

from __future__ import annotations

import dataclasses
import inspect

import jax
import pytest
from symbolic_port_helpers import assert_equal_at, load

import loopbridge as lb

pytest.importorskip("libcst")

SOURCE = '''
from typing import Any

import flax.linen as nn


class Block(nn.Module):
  """A basic block."""

  filters: int
  norm: Any = nn.LayerNorm
  scale: int = 2

  @nn.compact
  def __call__(self, x):
    return self.norm()(nn.Dense(self.filters)(x))

  def widened(self):
    return self.scale * self.filters


class Bottleneck(Block):
  """Its own call over the block's fields, reading a method it inherits."""

  @nn.compact
  def __call__(self, x):
    y = nn.relu(nn.Dense(self.filters)(x))
    y = nn.Dense(self.widened())(y)
    return self.norm()(y)


class Gated(Block):
  gate: int = 3

  @nn.compact
  def __call__(self, x):
    g = nn.sigmoid(nn.Dense(self.gate)(x)).mean(-1, keepdims=True)
    return g * nn.Dense(self.filters)(x)
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("inherited"), "inherited_models", SOURCE)


def _x():
  return jax.random.normal(jax.random.key(0), (2, 5))


@pytest.mark.parametrize(
  "name, first, other",
  [
    ("Bottleneck", dict(filters=4), dict(filters=7, scale=3)),
    ("Gated", dict(filters=4), dict(filters=6, gate=5)),
  ],
)
def test_a_subclass_with_its_own_call_drafts_as_one_class(models, tmp_path, name, first, other):
  cls = getattr(models, name)
  draft = lb.port.draft(cls(**first), _x())
  assert draft.ok, draft.report()
  assert "nn.Module" not in draft.source and f"class {name}(nnx.Module)" in draft.source
  # The inherited fields are its constructor's, in Linen's order (the base's first; the
  # layer class in `norm` is written where it is built).
  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  params = list(inspect.signature(namespace[name].__init__).parameters)[1:]
  fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("parent", "name")]
  assert {"filters", "scale"} <= set(params), params
  assert [p for p in params if p in fields] == [f for f in fields if f in params], params
  assert_equal_at(draft, tmp_path, cls(**other), _x())


def test_the_inherited_method_is_kept(models):
  draft = lb.port.draft(models.Bottleneck(filters=4), _x())
  assert "def widened(self)" in draft.source
