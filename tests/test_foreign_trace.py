"""Recording from a trace that is not the model's raises `lb.StructureChangeError`, never
loses records.

A model closed over by a hand-written `jax.lax` loop body (directly, inside a jit wrapper that
merges a copy, or inside `nnx.jit`) cannot hand what it records back out of the loop's trace.
flax 0.10.2 used to drop the records silently and flax 0.12 raised TraceContextError from inside
the write; both now raise the same loopbridge error, before anything is written. The fixes the
message shows are run here and compared with plain Linen `apply`, step by step.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge._core import trace_check as _trace_check

STEPS = 3
MATCH = r"closed over the model instead of carrying it.*Fix: carry the model through the loop"


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = jnp.tanh(nn.Dense(3)(x))
    self.sow("intermediates", "h", h)
    return h


class Cached(nn.Module):
  """Sows nothing; keeps a running sum in a 'cache' collection (a state write per call)."""

  @nn.compact
  def __call__(self, x):
    total = self.variable("cache", "total", jnp.zeros, x.shape, x.dtype)
    total.value = total.value + x
    return x + 1.0


X = jnp.linspace(-1.0, 1.0, 3).reshape(1, 3)


def new_model():
  return lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), X, capacity=STEPS)


def linen_steps(model, x, steps=STEPS):
  params = lb.linen_variables(model)["params"]
  out = []
  for _ in range(steps):
    x, inter = Net().apply({"params": params}, x, mutable=["intermediates"])
    out.append(inter["intermediates"]["h"][0])
  return np.stack(out)


def closed_over_in_lax_while(model):
  def body(carry):
    i, x = carry
    return i + 1, model(x)

  jax.jit(lambda x: jax.lax.while_loop(lambda c: c[0] < STEPS, body, (0, x)))(X)


def copy_in_a_jit_wrapper(model):
  # The shape of openpi's module_jit: merge a copy inside jax.jit, then a lax loop over it.
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, x):
    copy = nnx.merge(graphdef, state)
    return jax.lax.fori_loop(0, STEPS, lambda i, x: copy(x), x)

  run(state, X)


def closed_over_under_nnx_jit(model):
  @nnx.jit
  def run(model, x):
    return jax.lax.fori_loop(0, STEPS, lambda i, x: model(x), x)

  run(model, X)


@pytest.mark.parametrize(
  "run", [closed_over_in_lax_while, copy_in_a_jit_wrapper, closed_over_under_nnx_jit]
)
def test_a_closed_over_model_raises_and_records_nothing(run):
  model = new_model()
  with pytest.raises(lb.StructureChangeError, match=MATCH):
    run(model)
  assert int(lb.counts(model)["intermediates"]["h"]) == 0  # nothing half-written


def test_the_error_is_a_loopbridge_error():
  assert issubclass(lb.StructureChangeError, lb.LoopbridgeError)


def test_a_state_write_without_sows_is_caught_too():
  model = lb.lazy_init(lb.ToNNX(Cached()), X)  # no rngs: only the cache write is checked
  before = np.asarray(lb.linen_variables(model)["cache"]["total"])

  def body(i, x):
    return model(x, mutable=["cache"])

  with pytest.raises(lb.StructureChangeError, match=MATCH):
    jax.jit(lambda x: jax.lax.fori_loop(0, STEPS, body, x))(X)
  np.testing.assert_array_equal(lb.linen_variables(model)["cache"]["total"], before)


def test_a_closed_over_native_module_raises():
  class Native(nnx.Module):
    def __init__(self, rngs):
      self.lin = nnx.Linear(3, 3, rngs=rngs)

    def __call__(self, x):
      y = self.lin(x)
      self.sow(nnx.Intermediate, "y", y)
      return y

  model = lb.preallocate(Native(nnx.Rngs(0)), X, capacity=STEPS)
  with pytest.raises(lb.StructureChangeError, match=r"Native\.sow was called inside"):
    jax.jit(lambda x: jax.lax.fori_loop(0, STEPS, lambda i, x: model(x), x))(X)


def test_the_split_merge_fix_from_the_message_records_every_step():
  model = new_model()
  graphdef, state = nnx.split(model)

  def body(i, carry):
    state, x = carry
    m = nnx.merge(graphdef, state)
    x = m(x)
    return nnx.state(m), x

  state, _ = jax.jit(lambda s, x: jax.lax.fori_loop(0, STEPS, body, (s, x)))(state, X)
  nnx.update(model, state)
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["h"], linen_steps(model, X), rtol=1e-6, atol=1e-6
  )


@pytest.mark.parametrize("loop", ["nnx", "lb"])
def test_the_nnx_loop_fix_from_the_message_records_every_step(loop):
  model = new_model()
  fori = nnx.fori_loop if loop == "nnx" else lb.fori_loop

  @nnx.jit
  def run(model, x):
    return fori(0, STEPS, lambda i, c: (c[0], c[0](c[1])), (model, x))[1]

  run(model, X)
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["h"], linen_steps(model, X), rtol=1e-6, atol=1e-6
  )


def test_the_check_runs_while_tracing_only(monkeypatch):
  calls = []
  original = _trace_check.check
  monkeypatch.setattr(_trace_check, "check", lambda *a: calls.append(1) or original(*a))
  model = new_model()
  graphdef, state = nnx.split(model)

  @jax.jit
  def step(state, x):
    m = nnx.merge(graphdef, state)
    y = m(x)
    return nnx.state(m), y

  for _ in range(STEPS):
    state, _ = step(state, X)
  traced = len(calls)
  assert traced > 0  # it ran when `step` was traced...
  for _ in range(STEPS):
    state, _ = step(state, X)
  assert len(calls) == traced  # ...and not on the compiled calls
  nnx.update(model, state)
  assert int(lb.counts(model)["intermediates"]["h"]) == 2 * STEPS  # every compiled call recorded
