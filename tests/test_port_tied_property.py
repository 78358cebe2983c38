"""Property: a draft is never `ok` and wrong where the input's width is tied to a setting.
Generated Linen blocks add their input to a layer whose width is a random expression of
integer fields, tuple items and a config dataclass's attribute (equal-valued in the sample more
often than not), after a group norm whose group count the source writes: Linen runs only where
the input is as wide as that expression, so a configuration changing the settings alone is one
it refuses. Each is drafted at one configuration and checked against Linen's own `apply` at
another, with an input as wide as the expression is there: `draft.ok` implies equal there."""

from __future__ import annotations

import itertools

import hypothesis
import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import strategies as st
from symbolic_port_helpers import ATOL, RTOL, load

import loopbridge as lb

pytestmark = pytest.mark.slow

# Each even wherever the settings are (the group norm's 2 groups divide it).
WIDTHS = (
  ("self.a", lambda v: v["a"]),
  ("self.a + self.c", lambda v: v["a"] + v["c"]),
  ("2 * self.b", lambda v: 2 * v["b"]),
  ("self.sizes[1]", lambda v: v["s1"]),
  ("self.cfg.mlp", lambda v: v["mlp"]),
)
INNER = ("self.b", "self.sizes[0]", "self.cfg.mlp", "x.shape[-1]", "2 * self.c")

TEMPLATE = """
import dataclasses
import typing as tp
import flax.linen as nn


@dataclasses.dataclass(frozen=True)
class Cfg:
  mlp: int = 4


class Gen(nn.Module):
  a: int = 4
  b: int = 4
  c: int = 4
  sizes: tp.Tuple[int, int] = (4, 4)
  cfg: Cfg = Cfg()

  @nn.compact
  def __call__(self, x):
    h = nn.GroupNorm(num_groups=2)(x)
    h = nn.relu(nn.Dense({inner})(h))
    x = x + nn.Dense({tied})(h)
    return nn.Dense({head})(x)
"""

_count = itertools.count()
NAMES = ("a", "b", "c", "s0", "s1", "mlp")


def _instance(module, v):
  return module.Gen(
    a=v["a"], b=v["b"], c=v["c"], sizes=(v["s0"], v["s1"]), cfg=module.Cfg(mlp=v["mlp"])
  )


@st.composite
def cases(draw):
  tied, width_of = draw(st.sampled_from(WIDTHS))
  inner = draw(st.sampled_from(INNER))
  head = draw(st.sampled_from(INNER[:-1]))
  evens = st.sampled_from((2, 4, 6))  # equal values are likely: the collisions to survive
  sample = dict(zip(NAMES, draw(st.tuples(*(evens,) * 6)), strict=True))
  other = dict(zip(NAMES, draw(st.tuples(*(st.sampled_from((2, 4, 8, 10)),) * 6)), strict=True))
  return TEMPLATE.format(inner=inner, tied=tied, head=head), sample, other, width_of


@hypothesis.settings(
  max_examples=6,
  deadline=None,
  suppress_health_check=list(hypothesis.HealthCheck),
  derandomize=True,
  phases=(hypothesis.Phase.explicit, hypothesis.Phase.generate),  # a failure is shown unshrunk
)
@hypothesis.given(cases())
def test_never_ok_and_wrong_where_the_input_is_tied(tmp_path_factory, case):
  source, sample, other, width_of = case
  module = load(tmp_path_factory.mktemp("tied"), f"generated_tied_{next(_count)}", source)
  x = jax.random.normal(jax.random.key(0), (2, width_of(sample)))
  draft = lb.port.draft(_instance(module, sample), x)
  if not draft.ok:
    return
  linen = _instance(module, other)
  x_other = jax.random.normal(jax.random.key(1), (3, width_of(other)))
  variables = linen.init(jax.random.key(2), x_other)
  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  kwargs = {k: getattr(linen, k, None) for k in draft.init_kwargs}
  kwargs.update(dict.fromkeys(draft.input_sizes, x_other.shape[-1]))
  assert all(v is not None for v in kwargs.values()), (kwargs, draft.source)
  port = namespace[draft.root](**kwargs, rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen, variables, port, x_other)
  np.testing.assert_allclose(
    port(x_other), linen.apply(variables, x_other), rtol=RTOL, atol=ATOL + 1e-4, err_msg=source
  )
