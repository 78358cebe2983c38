"""One root `lb.preallocate(root, ..., method=f)` declares bridged parts that `f` runs in NNX loops.

`f` calls an `lb.ToNNX` child inside `nnx.while_loop` / `nnx.fori_loop` / `nnx.scan` (with the
model in the carry) or `lb.fori_loop` / `lb.while_loop`, on a signature lazy_init never saw. The
loop runs a copy of the child; preallocate finds which child it is and declares its buffers once.
Records are compared step by step with plain Linen `apply`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

STEPS = 3


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = jnp.tanh(nn.Dense(x.shape[-1])(x))
    self.sow("intermediates", "h", h)
    return h


def run_loop(model, x, kind):
  if kind == "nnx.while_loop":

    def body(c):
      m, x, i = c
      return m, m.llm(x), i + 1

    return nnx.while_loop(lambda c: c[2] < STEPS, body, (model, x, 0))[1]
  if kind == "lb.while_loop":

    def body(c):
      m, x, i = c
      return m, m.llm(x), i + 1

    return lb.while_loop(lambda c: c[2] < STEPS, body, (model, x, 0))[1]
  if kind == "nnx.fori_loop":
    return nnx.fori_loop(0, STEPS, lambda i, c: (c[0], c[0].llm(c[1])), (model, x))[1]
  if kind == "lb.fori_loop":
    return lb.fori_loop(0, STEPS, lambda i, c: (c[0], c[0].llm(c[1])), (model, x))[1]
  assert kind == "nnx.scan"

  def step(c, _):
    m, x = c
    return (m, m.llm(x)), None

  return nnx.scan(step, length=STEPS)((model, x), None)[0][1]


class Policy(nnx.Module):
  def __init__(self, rngs):
    self.llm = lb.ToNNX(Net(), rngs=rngs)
    self.llm.lazy_init(jnp.ones((1, 1, 4)), capacity=STEPS)  # a 1-token signature

  def sample(self, x, kind):
    return run_loop(self, x, kind)


KINDS = ["nnx.while_loop", "nnx.fori_loop", "nnx.scan", "lb.fori_loop", "lb.while_loop"]


@pytest.mark.parametrize("kind", KINDS)
def test_one_root_preallocate_declares_what_the_loop_runs(kind):
  policy = Policy(nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (1, 5, 4))  # 5 tokens: another signature
  lb.preallocate(policy, x, kind, method=Policy.sample, capacity=STEPS)
  assert lb.buffers(policy)["llm"]["intermediates"]["h"].shape == (STEPS, 1, 5, 4)
  nnx.jit(lambda p, x: p.sample(x, kind))(policy, x)
  params = lb.linen_variables(policy.llm)["params"]
  expected, h = [], x
  for _ in range(STEPS):
    h, inter = Net().apply({"params": params}, h, mutable=["intermediates"])
    expected.append(inter["intermediates"]["h"][0])
  np.testing.assert_allclose(
    lb.recorded(policy)["llm"]["intermediates"]["h"], np.stack(expected), rtol=1e-5, atol=1e-6
  )


def test_a_bound_method_and_the_scoped_capacity_work_too():
  with lb.capacity(STEPS):
    policy = Policy(nnx.Rngs(0))
    lb.preallocate(policy.sample, jnp.ones((1, 2, 4)), "nnx.fori_loop")
  assert lb.buffers(policy)["llm"]["intermediates"]["h"].shape == (STEPS, 1, 2, 4)


def test_a_stacked_part_under_nnx_vmap_is_still_refused_with_the_fix():
  # A broadcast child inside nnx.vmap sows one value per member: one buffer cannot hold them.
  class Ensemble(nnx.Module):
    def __init__(self):
      self.llm = lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), jnp.ones((1, 4)), capacity=2)

    def __call__(self, xs):
      return nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(self.llm, xs)

  with pytest.raises(
    TypeError, match=r"inside an NNX transform.*lb\.preallocate on that lb\.ToNNX"
  ):
    lb.preallocate(Ensemble(), jnp.ones((3, 1, 4)), capacity=2)
