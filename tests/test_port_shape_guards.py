"""`lb.port.draft` of a layer built under a test of the call's shapes (`if x.shape != y.shape`)
that every trace took: the port builds it in `__init__` always. The check runs the port at an
input width equal to a setting, where the test fails; a port wrong there is not `ok`, and the
layer is a TODO at its line. A layer the test keeps at every size still drafts `ok`.

The reference is Linen's own `init` and `apply` at the input width the sample did not have.
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


class Shortcut(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(self.features)(nn.LayerNorm()(x))
    if x.shape != y.shape:
      x = nn.Dense(self.features, name="proj")(x)
    return x + y


class AlwaysTaken(nn.Module):
  features: int = 6

  @nn.compact
  def __call__(self, x):
    if x.ndim >= 2:
      x = nn.Dense(self.features, name="head")(x)
    return x
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("shape_guards"), "shape_guard_models", SOURCE)


def test_a_projection_only_unequal_widths_build_is_not_ok(models):
  x = jax.random.normal(jax.random.key(0), (3, 5))
  # Linen itself: at an input as wide as `features` there is no projection.
  equal_width = models.Shortcut(8).init(jax.random.key(0), np.ones((3, 8), np.float32))
  assert "proj" not in equal_width["params"]
  draft = lb.port.draft(models.Shortcut(8), x)
  assert not draft.ok and draft.check is not None and not draft.check.equal
  assert "x_features=8" in (draft.check.error or "")
  (todo,) = draft.todos
  assert 'name="proj"' in todo.original and "`x.shape != y.shape`" in todo.reason
  proj_line = next(k for k, line in enumerate(SOURCE.splitlines(), 1) if 'name="proj"' in line)
  assert todo.line == proj_line


def test_a_layer_every_input_size_builds_stays_ok(models):
  x = jax.random.normal(jax.random.key(1), (2, 5))
  draft = lb.port.draft(models.AlwaysTaken(), x)
  assert draft.ok, draft.report()
  assert "an input of a setting's size (x_features=6)" in draft.report()
  wide = jax.random.normal(jax.random.key(2), (2, 6))
  variables = models.AlwaysTaken().init(jax.random.key(3), wide)
  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  port = namespace["AlwaysTaken"](x_features=6, rngs=nnx.Rngs(0))
  port.head.kernel.value = variables["params"]["head"]["kernel"]
  port.head.bias.value = variables["params"]["head"]["bias"]
  want = models.AlwaysTaken().apply(variables, wide)
  np.testing.assert_allclose(port(wide), want, rtol=RTOL, atol=ATOL)
