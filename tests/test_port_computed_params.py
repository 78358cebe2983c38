"""HF Dinov2's two constructs the draft translates from the source: a setup attribute computed
from a param (the Param kept under its Linen name, the arithmetic a property:
`_port/transforms/computed_params.py`), and a width that is a setup local computed in two lines
(`_port/plan/setup_local_values.py`). Each port is compared with Linen's own apply, at the drafted
configuration and, built from the source alone, at another."""

import typing as tp

import jax
import numpy as np
import pytest

import loopbridge as lb

pytest.importorskip("libcst")

import ast

import branch_models as models
from flax import nnx

from loopbridge._port.plan import setup_local_values


def _x(width: int = 8) -> jax.Array:
  return jax.random.normal(jax.random.key(0), (2, 5, width))


def _port_at(draft, linen, x, **settings) -> tuple[tp.Any, tp.Any]:
  namespace: dict[str, tp.Any] = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  port = namespace[type(linen).__name__](**settings, rngs=nnx.Rngs(0))
  variables = linen.init(jax.random.key(2), x)
  # Trained values, not the init's ones: a Param the port lost would show.
  variables = jax.tree.map(lambda v: v + jax.random.normal(jax.random.key(3), v.shape), variables)
  lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  return port, variables


def test_a_param_setup_computes_an_attribute_from_is_kept_and_the_arithmetic_is_a_property():
  draft = lb.port.draft(models.LayerScale(), _x())
  assert draft.ok, draft.report()  # was a TODO: the port's attribute held the array
  assert "self.lambda1 = nnx.Param(" in draft.source
  assert "def lambda1_value(self)" in draft.source
  assert "self.lambda1_value * x" in draft.source  # the read of the computed value
  linen = models.LayerScale(hidden=8, value=0.25)
  port, variables = _port_at(draft, linen, _x(), hidden=8, value=0.25)
  np.testing.assert_allclose(port(_x()), linen.apply(variables, _x()), rtol=1e-6)


def test_an_attribute_named_apart_from_its_param_is_the_property():
  draft = lb.port.draft(models.ScaleUnderAnotherName(), _x())
  assert draft.ok, draft.report()
  assert "self.gamma = nnx.Param(" in draft.source and "def scale(self)" in draft.source
  port, variables = _port_at(draft, models.ScaleUnderAnotherName(), _x())
  np.testing.assert_allclose(
    port(_x()), models.ScaleUnderAnotherName().apply(variables, _x()), rtol=1e-6
  )


def test_arithmetic_a_property_cannot_read_again_stays_a_todo():
  draft = lb.port.draft(models.ScaleFromALocal(), _x())  # never a raw exception
  assert not draft.ok
  (todo,) = draft.todos
  assert "inside an expression in setup" in todo.reason
  assert "reads c" in todo.reason and "self.lambda1 = nnx.Param(...)" in todo.reason
  assert todo.original == 'self.lambda1 = c * self.param("lambda1", nn.initializers.ones, (8,))'


def test_a_width_that_is_a_setup_local_computed_in_two_lines_is_that_local_hf_dinov2():
  x = _x(10)
  draft = lb.port.draft(models.SwiGLUHidden(), x)
  assert draft.ok, draft.report()
  assert "nnx.Linear(hidden_features, self.hidden" in draft.source, draft.source
  # At widths the sample never had, the port built from the source alone is Linen's apply.
  for hidden in (12, 36):
    linen = models.SwiGLUHidden(hidden=hidden)
    port, variables = _port_at(draft, linen, x, hidden=hidden)
    np.testing.assert_allclose(port(x), linen.apply(variables, x), rtol=1e-5, atol=1e-5)


def test_a_local_is_evaluated_only_from_plain_lines_that_call_nothing_on_self():
  source = """
class M:
  def setup(self):
    a = self.n * 2
    b = self.param("p", None, (a,))
    c = a + 1
    if self.n:
      c = 7
    d = undefined_name + 1
    e = a
"""
  stmts = setup_local_values.setup_statements(source.strip("\n"), before_line=100)

  class Module:
    n = 3

  values = setup_local_values.local_values(stmts, {}, Module())
  # `b` calls self.param; `c` is bound under an `if`; `d` fails to evaluate: unknown.
  assert values == {"a": 6, "e": 6}
  # Two locals equal in every sample: no one of them is chosen.
  assert setup_local_values.matching_local(stmts, {}, [(Module(), 6)]) is None
  assert isinstance(stmts[0], ast.Assign)
