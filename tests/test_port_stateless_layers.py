"""`lb.port.draft` of a dropout no configuration of the drafted model builds: a child class's
rate the parent never sets. The layer has no variables, so no trace is needed: the port builds
it under the source's own test.

The reference is Linen's own `apply` of the child at a rate the draft never traced.
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
from typing import Optional

import flax.linen as nn


class Inner(nn.Module):
  width: int
  rate: Optional[float] = None

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(self.width)(x)
    if self.rate is not None:
      x = nn.Dropout(self.rate)(x, deterministic=not train)
    return x


class Outer(nn.Module):
  width: int = 6

  @nn.compact
  def __call__(self, x):
    return Inner(self.width)(x)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("stateless"), "stateless_models", SOURCE)


def test_an_untraced_dropout_is_built_under_its_test(models):
  x = jax.random.normal(jax.random.key(0), (2, 5))
  draft = lb.port.draft(models.Outer(), x)
  assert draft.ok, draft.report()
  assert "TODO" not in draft.source
  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  inner = models.Inner(width=6, rate=0.25)
  port = namespace["Inner"](width=6, rate=0.25, Dense_0_in_features=5, rngs=nnx.Rngs(0))
  assert any(isinstance(m, nnx.Dropout) for _, m in nnx.iter_graph(port))
  variables = inner.init(jax.random.key(1), x)
  lb.checkpoint.linen_to_nnx(inner, variables, port, x)
  np.testing.assert_allclose(port(x), inner.apply(variables, x), rtol=RTOL, atol=ATOL)
  # Training: the port drops (some outputs zero, the rest scaled), as Linen's dropout does.
  dropped = np.asarray(port(x, train=True))
  kept = np.asarray(inner.apply(variables, x)) / 0.75
  assert np.all(np.isclose(dropped, 0.0) | np.isclose(dropped, kept, rtol=1e-4, atol=1e-5))
  assert np.isclose(dropped, 0.0).any()
