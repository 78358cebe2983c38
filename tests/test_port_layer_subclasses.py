"""Drafting user subclasses of flax's own layers: one whose `__call__` replaces the layer's
(a monotone dense layer) and one that overrides `param` to transform the kernel (a
weight-standardized convolution). Each port, built from the drafted source as a user would and
holding Linen's own init, computes Linen's `apply` at the sample's widths and at others."""

import jax
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

pytest.importorskip("libcst")

import layer_subclass_models as models


def _built(draft, name: str, *args, **kwargs):
  """The drafted class `name` built from the source alone (`args`, `kwargs`, `rngs`)."""
  namespace: dict = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  return namespace[name](*args, **kwargs, rngs=nnx.Rngs(0))


def _assert_computes_linen(linen, port, x):
  """`port`, holding a fresh Linen init of `linen` (converted by lb.checkpoint), computes
  Linen's apply on `x`."""
  variables = linen.init(jax.random.key(3), x)
  lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  want = linen.apply(variables, x)
  np.testing.assert_allclose(port(x), want, rtol=1e-5, atol=1e-5)


def _drafted(linen, x):
  draft = lb.port.draft(linen, x)
  assert draft.ok, draft.report()
  assert not draft.todos
  return draft


def _x(*shape):
  return jax.random.normal(jax.random.key(0), shape)


def test_a_dense_subclass_with_its_own_call_is_a_plain_module_taking_the_fields_it_reads():
  draft = _drafted(models.PositiveDense(4), _x(2, 5))
  assert "class PositiveDense(nnx.Module):" in draft.source
  signature = draft.source.split("def __init__(", 1)[1].split("):", 1)[0]
  # The fields it reads, with Linen's defaults; never param_dtype, which it does not read.
  assert "kernel_init=nnx.initializers.lecun_normal()" in signature
  assert "use_bias=True" in signature
  assert "param_dtype" not in signature
  _assert_computes_linen(models.PositiveDense(4), _built(draft, "PositiveDense", 4), _x(2, 5))
  # Every width another: features 7 on inputs 3 wide, without a bias.
  linen = models.PositiveDense(7, use_bias=False)
  port = _built(draft, "PositiveDense", 7, use_bias=False, inputs_features=3)
  _assert_computes_linen(linen, port, _x(3, 3))


def test_a_parent_using_the_own_call_subclass_twice():
  draft = _drafted(models.MonotoneMlp(), _x(2, 5))
  assert "class PositiveDense(nnx.Module):" in draft.source
  _assert_computes_linen(models.MonotoneMlp(), _built(draft, "MonotoneMlp"), _x(2, 5))
  linen = models.MonotoneMlp(hidden=9, out=2)
  port = _built(draft, "MonotoneMlp", 9, 2, x_features=7)
  _assert_computes_linen(linen, port, _x(4, 7))


@pytest.mark.slow  # a draft checked at four configurations and two built ports: ~15 s
def test_a_parent_using_a_conv_subclass_that_overrides_param_twice():
  """The port subclasses nnx.Conv and runs its call on the standardized kernel; the stored
  kernel stays Linen's (a port without the standardization computes another output)."""
  x = _x(2, 6, 6, 3)
  draft = _drafted(models.CenteredBlock(), x)
  assert "class CenteredConv(nnx.Conv):" in draft.source
  assert "CenteredConv(x_features, self.features, (3, 3), use_bias=False, rngs=rngs)" in (
    draft.source
  )
  port = _built(draft, "CenteredBlock")
  _assert_computes_linen(models.CenteredBlock(), port, x)
  # Every width another: 5 features on an input of 4 channels.
  linen, x = models.CenteredBlock(features=6), _x(3, 5, 5, 4)
  port = _built(draft, "CenteredBlock", 6, x_features=4)
  _assert_computes_linen(linen, port, x)
  # The call writes no Variable: it traces under jax.jit closed over the port, and under
  # nnx.jit, and leaves the stored kernel as it was.
  stored = [np.asarray(a) for a in jax.tree.leaves(nnx.state(port, nnx.Param))]
  np.testing.assert_allclose(jax.jit(lambda x: port(x))(x), port(x), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(port, x), port(x), rtol=1e-5, atol=1e-5)
  for after, before in zip(jax.tree.leaves(nnx.state(port, nnx.Param)), stored, strict=True):
    np.testing.assert_array_equal(after, before)


def test_drafting_the_param_override_alone_says_to_draft_a_module_that_builds_it():
  with pytest.raises(lb.port.PortError, match="Draft that module"):
    lb.port.draft(models.CenteredConv(4, (3, 3)), _x(2, 6, 6, 3))


def test_a_param_override_reading_the_layers_fields_is_one_todo_saying_what_to_write():
  draft = lb.port.draft(models.UsesScaledKernelConv(), _x(2, 6, 6, 3))
  assert not draft.ok
  (todo,) = draft.todos
  assert "ScaledKernelConv overrides `param` of flax.linen.linear.Conv" in todo.reason
  assert "reads `self`" in todo.reason
  assert "class ScaledKernelConv(nnx.Conv)" in todo.reason
  assert "nnx.Conv.__call__(view, *args, **kwargs)" in todo.reason


def test_a_parent_using_a_dense_subclass_that_overrides_param():
  draft = _drafted(models.ClippedMlp(), _x(2, 5))
  assert "class ClippedDense(nnx.Linear):" in draft.source
  assert "def param(self, name):" in draft.source
  _assert_computes_linen(models.ClippedMlp(), _built(draft, "ClippedMlp"), _x(2, 5))
  port = _built(draft, "ClippedMlp", 9, x_features=3)
  _assert_computes_linen(models.ClippedMlp(hidden=9), port, _x(4, 3))
