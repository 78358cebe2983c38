"""`lb.port.draft` of layers built through module-level partials of flax layers
(`Conv3x3 = functools.partial(nn.Conv, kernel_size=(3, 3), use_bias=False)`): the port builds
the partial's class with what the partial binds (a value no literal writes, an initializer, read
from the partial itself).

The reference is Linen's own `apply` at the sample's configuration and at another one.
"""

from __future__ import annotations

import re

import jax
import pytest
from symbolic_port_helpers import assert_equal_at, load

import loopbridge as lb

pytest.importorskip("libcst")

SOURCE = """
import functools

import flax.linen as nn

Conv3x3 = functools.partial(nn.Conv, kernel_size=(3, 3), use_bias=False)
Proj = functools.partial(nn.Dense, kernel_init=nn.initializers.normal(0.5), use_bias=False)


class Block(nn.Module):
  filters: int = 4
  out: int = 3

  @nn.compact
  def __call__(self, x):
    x = nn.relu(Conv3x3(self.filters)(x))
    x = nn.relu(Conv3x3(self.filters, strides=(2, 2), name="down")(x))
    return Proj(self.out)(x.mean(axis=(1, 2)))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("global_partials"), "global_partial_models", SOURCE)


def test_a_module_level_partial_builds_its_class_with_what_it_binds(models, tmp_path):
  x = jax.random.normal(jax.random.key(0), (2, 6, 6, 2))
  draft = lb.port.draft(models.Block(), x)
  assert draft.ok, draft.report()
  assert "TODO" not in draft.source
  assert re.search(r"Proj\.keywords\[[\"']kernel_init[\"']\]", draft.source), draft.source
  assert_equal_at(draft, tmp_path, models.Block(filters=7, out=5), x)
  # The port's initializer is the partial's (scale 0.5, not the default's 1/sqrt(fan_in)).
  from flax import nnx

  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  port = namespace["Block"](filters=64, out=64, rngs=nnx.Rngs(0))
  kernels = [m.kernel[...] for _, m in nnx.iter_graph(port) if isinstance(m, nnx.Linear)]
  assert len(kernels) == 1 and 0.4 < float(kernels[0].std()) < 0.6
