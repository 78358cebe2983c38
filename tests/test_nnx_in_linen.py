"""NNX parts inside Linen (`nnx.bridge.ToLinen`), inside `lb.ToNNX`: their sows are recorded.

A wrapper like `nnx.bridge.ToLinen` runs an NNX module inside a Linen module and writes the NNX
module's `sow`s into the Linen collection after the call (with `put_variable`), and not at all
during `init`. Every recorded value is compared with plain Linen
`apply(..., mutable=['intermediates'])` run step by step on the same variables.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util
from flax.nnx import bridge

import loopbridge as lb
from loopbridge import _compat

RTOL, ATOL = 1e-5, 1e-6  # float32 round-off between a compiled loop and eager Linen
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)


def value(variable):
  return _compat.variable_value(variable)


def set_value(variable, new):
  _compat.set_variable_value(variable, new)


def assert_close(got, want):
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)


def flat(tree):
  return traverse_util.flatten_dict(tree, is_leaf=lambda _, v: isinstance(v, tuple))


def assert_step_equal(recorded, linen_steps):
  """recorded[site][k] == what plain Linen's k-th apply returned at that site (a 1-tuple)."""
  want_sites = {path for step in linen_steps for path in flat(step)}
  got = flat(recorded["intermediates"])
  assert set(got) == want_sites, (sorted(got), sorted(want_sites))
  for path in want_sites:
    assert got[path].shape[0] == len(linen_steps), path
    for k, step in enumerate(linen_steps):
      (want,) = flat(step)[path]
      assert_close(got[path][k], want)


# ============================================================================ minimal model
class SowingLinear(nnx.Module):
  """An NNX module that sows (default tuple reduce)."""

  def __init__(self, din, dout, *, rngs):
    self.lin = nnx.Linear(din, dout, rngs=rngs)

  def __call__(self, x):
    h = self.lin(x)
    self.sow(nnx.Intermediate, "h", jnp.tanh(h))
    return h


class Wrapped(nn.Module):
  """Linen around the NNX part, with a Linen sow of its own next to it."""

  @nn.compact
  def __call__(self, x):
    y = bridge.ToLinen(SowingLinear, args=(x.shape[-1], 3), name="part")(x)
    self.sow("intermediates", "out", y * 2.0)
    return nn.Dense(4)(y)


def linen_steps(module, variables, xs, method=None):
  """Plain Linen, one apply per input: the intermediates each call returns."""
  steps = []
  for x in xs:
    _, updates = module.apply(variables, x, mutable=["intermediates"], method=method)
    steps.append(updates["intermediates"])
  return steps


def params_only(model):
  """The model's Linen variables for a plain Linen apply (flax 0.10's ToLinen also needs the
  graphdef it keeps in the 'nnx' collection)."""
  return {k: v for k, v in lb.linen_variables(model).items() if k != "intermediates"}


def test_plain_linen_returns_the_nnx_sow_as_a_tuple():
  """The reference this file relies on: Linen's apply returns the NNX sow at its Linen path."""
  variables = Wrapped().init(jax.random.key(0), X)
  _, updates = Wrapped().apply(variables, X, mutable=["intermediates"])
  (h,) = updates["intermediates"]["part"]["h"]
  assert h.shape == (2, 3)


def test_lazy_init_discovers_the_nnx_sow_and_eager_calls_record_it():
  model = lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, X, capacity=4)
  sites = {site.label: site for site in lb.sow_sites(model)}
  assert set(sites) == {"part/h", "out"}
  assert sites["part/h"].shape == (2, 3)
  xs = [X, X * 2.0, X - 1.0]
  for x in xs:
    model(x)
  assert_step_equal(lb.recorded(model), linen_steps(Wrapped(), params_only(model), xs))


def test_the_nnx_sow_is_not_a_variable_after_lazy_init():
  """lazy_init keeps records out of the Linen variables, as for a Linen sow."""
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=4)
  assert "intermediates" not in lb.linen_variables(model)


@pytest.mark.parametrize("loop", ["fori_loop", "while_loop"])
def test_recorded_in_place_in_a_jitted_nnx_loop(loop):
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=5)
  steps = 5

  @nnx.jit
  def run(model, x):
    def body(i, carry):
      model, x = carry
      return model, jnp.tanh(model(x))

    if loop == "fori_loop":
      return nnx.fori_loop(0, steps, body, (model, x))[1]

    def cond(carry):
      return carry[0] < steps

    def wbody(carry):
      i, model, x = carry
      model, x = body(i, (model, x))
      return i + 1, model, x

    return nnx.while_loop(cond, wbody, (jnp.asarray(0), model, x))[2]

  out = run(model, X)
  xs, x = [], X
  variables = params_only(model)
  for _ in range(steps):
    xs.append(x)
    x = jnp.tanh(Wrapped().apply(variables, x))
  assert_step_equal(lb.recorded(model), linen_steps(Wrapped(), variables, xs))
  assert_close(out, x)


def test_preallocate_finds_the_nnx_sow_of_another_signature():
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=4)
  x3 = jnp.ones((3, 4))
  lb.preallocate(model, x3, capacity=4)
  assert {s.label: s.shape for s in lb.sow_sites(model)}["part/h"] == (3, 3)
  model(x3)
  assert_step_equal(lb.recorded(model), linen_steps(Wrapped(), params_only(model), [x3]))
