"""A field holding a partial of a class (`base_cls=partial(MLP, hidden=(8, 8))`): what the partial
binds is a setting of the model that no field of the class holds. The port keeps the field and
reads what the partial binds from it; the draft is checked at a configuration where the partial
binds other values, so a port built from the sample's bound values is never `ok`.

The reference is Linen's own `apply` at the other bound values.
"""

from __future__ import annotations

import functools

import jax
import pytest
from symbolic_port_helpers import load, port_error_at

import loopbridge as lb

pytest.importorskip("libcst")

SOURCE = """
from typing import Any, Sequence

import flax.linen as nn


class MLP(nn.Module):
  hidden: Sequence[int]

  @nn.compact
  def __call__(self, x):
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return x


class Block(nn.Module):
  features: int
  norm: Any

  @nn.compact
  def __call__(self, x):
    x = self.norm(name="bn")(nn.Dense(self.features)(x))
    return nn.relu(self.norm(scale_init=nn.initializers.ones, name="bn2")(x))


class Critic(nn.Module):
  base_cls: Any

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(self.base_cls()(x))
"""


def test_a_partial_field_is_checked_at_other_bound_values(tmp_path):
  m = load(tmp_path, "partial_field_models", SOURCE)
  x = jax.random.normal(jax.random.key(0), (2, 5))
  draft = lb.port.draft(m.Critic(base_cls=functools.partial(m.MLP, hidden=(8, 8))), x)
  assert any("partial in base_cls" in label for label in draft.config_labels)
  assert draft.ok, draft.report()
  # The port keeps the field and reads what the partial binds from it: the MLP's widths, and
  # the head's input width as the last of them (not the first: the check's other bound values
  # tell the two apart).
  assert 'self.base_cls.keywords["hidden"][-1]' in draft.source.replace("'", '"'), draft.source
  for hidden in ((5, 7), (5, 7, 9), (6,)):
    other = m.Critic(base_cls=functools.partial(m.MLP, hidden=hidden))
    assert port_error_at(draft, tmp_path, other, x) <= 1e-4, draft.source


def test_a_flax_layer_partial_field_passes_on_whatever_it_binds(tmp_path):
  """`norm=partial(nn.BatchNorm, use_running_average=True)` in the sample: the port's norms
  run on the running averages there, and take the momentum and epsilon another partial binds
  (no configuration the draft traced binds them)."""
  from flax import linen as nn

  m = load(tmp_path, "partial_field_models", SOURCE)
  x = jax.random.normal(jax.random.key(0), (4, 5))
  norm = functools.partial(nn.BatchNorm, use_running_average=True)
  draft = lb.port.draft(m.Block(features=6, norm=norm), x)
  assert draft.ok, draft.report()
  wide = functools.partial(nn.BatchNorm, use_running_average=True, epsilon=0.5, momentum=0.8)
  other = m.Block(features=7, norm=wide)
  assert port_error_at(draft, tmp_path, other, x) <= 1e-4, draft.source
