"""Property: a draft is never `ok` and wrong. Generated Linen modules whose widths are random
expressions of integer fields (equal-valued in the sample more often than not), tuple items, a
config dataclass's attribute and the input's width, each layer a `Dense` or a child block
given its width by the parent, are drafted at one configuration and checked against Linen's
own `apply` at another: `draft.ok` implies equal there."""

from __future__ import annotations

import itertools

import hypothesis
import jax
import pytest
from hypothesis import strategies as st
from symbolic_port_helpers import ATOL, load, port_error_at

import loopbridge as lb

pytestmark = pytest.mark.slow

WIDTHS = (
  "self.a",
  "self.b",
  "self.a + self.c",
  "2 * self.b",
  "self.sizes[0]",
  "self.sizes[1]",
  "self.cfg.mlp",
  "x.shape[-1]",
  "self.a * self.c",
)

TEMPLATE = """
import dataclasses
import typing as tp
import flax.linen as nn


@dataclasses.dataclass(frozen=True)
class Cfg:
  mlp: int = 4


class Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm()(nn.Dense(self.features)(x))


class Gen(nn.Module):
  a: int = 4
  b: int = 4
  c: int = 4
  sizes: tp.Tuple[int, int] = (4, 4)
  cfg: Cfg = Cfg()

  @nn.compact
  def __call__(self, x):
{body}
    return x
"""

_count = itertools.count()


def _instance(module, values):
  a, b, c, s0, s1, mlp = values
  return module.Gen(a=a, b=b, c=c, sizes=(s0, s1), cfg=module.Cfg(mlp=mlp))


@st.composite
def models(draw):
  layers = draw(st.lists(st.tuples(st.sampled_from(WIDTHS), st.booleans()), min_size=1, max_size=3))
  lines = []
  for width, child in layers:
    layer = f"Block({width})" if child else f"nn.Dense({width})"
    lines.append(f"    x = nn.relu({layer}(x))")
  small = st.sampled_from((2, 3, 4))  # equal values are likely: the collisions to survive
  sample = draw(st.tuples(*(small,) * 6))
  other = draw(st.tuples(*(st.sampled_from((2, 3, 5, 7)),) * 6))
  width = draw(small)
  return "\n".join(lines), sample, other, width


@hypothesis.settings(
  max_examples=8,
  deadline=None,
  suppress_health_check=list(hypothesis.HealthCheck),
  derandomize=True,
)
@hypothesis.given(models())
def test_never_ok_and_wrong(tmp_path_factory, case):
  body, sample, other, width = case
  directory = tmp_path_factory.mktemp("gen")
  module = load(directory, f"generated_{next(_count)}", TEMPLATE.format(body=body))
  x = jax.random.normal(jax.random.key(0), (2, width))
  draft = lb.port.draft(_instance(module, sample), x)
  if not draft.ok:
    return
  err = port_error_at(draft, directory, _instance(module, other), x)
  assert err <= ATOL + 1e-4, (body, sample, other, err, draft.source)
