"""A Linen model that defines its own `init` method (openpi's Gemma does: `init(self,
use_adarms)` runs every branch once so that Linen creates all params). loopbridge's drafting and
conversion initialize and apply through flax's own `nn.Module.init` / `apply`, as the user's
own code does with `nn.Module.init(model, ...)`, never through the model's method of that name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb


class WithOwnInit(nn.Module):
  width: int = 8

  def setup(self):
    self.dense = nn.Dense(self.width)

  def __call__(self, x):
    return jnp.tanh(self.dense(x))

  def init(self, batch: int):  # pyright: ignore[reportIncompatibleMethodOverride]
    """Runs the model once on zeros (a convenience method, as openpi's)."""
    return self(jnp.zeros((batch, 4)))


class Port(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.dense = nnx.Linear(4, 8, rngs=rngs)

  def __call__(self, x):
    return jnp.tanh(self.dense(x))


X = jax.random.normal(jax.random.key(1), (2, 4))


def test_a_model_with_its_own_init_method_drafts_equal():
  pytest.importorskip("libcst")
  model = WithOwnInit()
  draft = lb.port.draft(model, X)
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  want = nn.Module.apply(model, variables, X)  # independent: Linen's own apply
  np.testing.assert_allclose(port(X), want, rtol=1e-6, atol=1e-6)


def test_a_model_with_its_own_init_method_converts():
  model = WithOwnInit()
  variables = nn.Module.init(model, jax.random.key(0), X)
  port = Port(nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(model, variables, port, X)
  np.testing.assert_allclose(port(X), nn.Module.apply(model, variables, X), rtol=1e-6, atol=1e-6)
