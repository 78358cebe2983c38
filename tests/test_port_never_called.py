"""A layer Linen builds in setup and no traced configuration calls: the port builds none."""

import jax
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

pytest.importorskip("libcst")

import never_called_models as models
from symbolic_port_helpers import load


@pytest.mark.parametrize("head", ["TokenHead", "DenseTokenHead"])
def test_a_layer_a_parent_always_turns_off_is_stood_in_for_and_the_port_is_ok(tmp_path, head):
  """A user class (HF's `FlaxBertPooler`) or flax's own Dense (ALBERT's pooler)."""
  x = jax.random.normal(jax.random.key(0), (2, 5, 6))
  head_cls = getattr(models, head)
  draft = lb.port.draft(head_cls(width=8, labels=3), x)
  assert draft.ok, draft.report()
  assert not draft.todos
  assert "NeverCalled(" in draft.source and "class NeverCalled" in draft.source
  assert "NeverCalled" in draft.report()
  port = load(tmp_path, f"never_called_port_{head}", draft.source)
  # Against Linen at the sample and at another configuration (every setting changed; the
  # root input width, a separate matter, kept).
  for width, labels, shape in ((8, 3, (2, 5, 6)), (12, 5, (3, 4, 6))):
    xs = jax.random.normal(jax.random.key(width), shape)
    linen = head_cls(width=width, labels=labels)
    variables = linen.init(jax.random.key(1), xs)
    nnx_model = getattr(port, head)(width=width, labels=labels, rngs=nnx.Rngs(0))
    lb.checkpoint.linen_to_nnx(linen, variables, nnx_model, xs)
    np.testing.assert_allclose(nnx_model(xs), linen.apply(variables, xs), rtol=1e-5, atol=1e-5)


def test_calling_the_stand_in_raises_naming_the_layer_and_the_fix(tmp_path):
  x = jax.random.normal(jax.random.key(0), (2, 5, 6))
  draft = lb.port.draft(models.TokenHead(width=8, labels=3), x)
  port = load(tmp_path, "never_called_port_raises", draft.source)
  # The encoder's input width is its parent's to give (the sample's 6 here).
  encoder = port.Encoder(width=8, add_pooling=True, dense_in_features=6, rngs=nnx.Rngs(0))
  with pytest.raises(NotImplementedError, match=r"Pooler .*called in no configuration.*configs="):
    encoder(x)


def test_a_layer_the_trace_reaches_is_ported_not_stood_in_for():
  x = jax.random.normal(jax.random.key(0), (2, 5, 6))
  draft = lb.port.draft(models.PooledHead(width=8, labels=3), x)
  assert draft.ok, draft.report()
  assert "NeverCalled" not in draft.source
  assert "class Pooler(nnx.Module)" in draft.source


def test_a_layer_applied_with_given_params_is_not_stood_in_for():
  x = jax.random.normal(jax.random.key(0), (2, 6))
  draft = lb.port.draft(models.ReadKernel(width=4), x)
  assert "NeverCalled" not in draft.source


def test_a_layer_a_call_argument_gates_stays_a_todo():
  x = jax.random.normal(jax.random.key(0), (2, 5, 6))
  draft = lb.port.draft(models.ArgumentGated(width=8), x)
  assert "NeverCalled" not in draft.source
  assert not draft.ok and any("Pooler" in t.reason for t in draft.todos)
