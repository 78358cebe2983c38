"""A Pi0-shaped policy: NNX code that bridges a sowing Linen decoder and samples in a loop.

Shaped like openpi's Pi0 (written here, nothing copied): the policy's `__init__` wraps a Linen
decoder with `lb.ToNNX` and calls `llm.lazy_init(rngs=rngs, method="init")` WITHOUT a capacity,
as third-party code does; `with lb.capacity(N):` around the constructor declares it. The
decoder's own `init` method creates every variable from a one-token input. `sample_actions`
embeds an observation prefix once (its KV cache is returned and passed back explicitly), then
runs a denoising loop (`nnx.while_loop` or `nnx.fori_loop`) that calls the decoder on the
action suffix, another signature than init's; ONE root `lb.preallocate(policy, ...,
method=Policy.sample_actions, capacity=N)` declares it. The decoder sows each layer's residual
stream on decoding steps.

Checked: the jitted loop's actions and every recorded residual, step by step, against plain
Linen `apply` with the same parameters (and the same NNX linear layers called eagerly).
Tolerance: rtol = atol = 1e-5 (float32, compiled loop vs eager calls). The openpi way of
looping (a `jax.lax.while_loop` body closing over the model, inside a jit wrapper that merges a
copy) raises `lb.StructureChangeError` instead of losing the records.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

from conftest import matmul_tolerance

# Real-model shapes end to end: each feature they use has its own faster test; CI runs
# these in its `-m slow` pass (tests/conftest.py).
pytestmark = pytest.mark.slow

RTOL, ATOL = matmul_tolerance(1e-5, 1e-5)
WIDTH, DEPTH, PREFIX, SUFFIX, ACTION, BATCH, STEPS = 8, 2, 4, 3, 2, 1, 5


class Layer(nn.Module):
  """Single-head attention over [cached prefix keys/values, new tokens], then an MLP."""

  width: int

  @nn.compact
  def __call__(self, x, cache):
    q = nn.Dense(self.width, name="query")(x)
    k_new = nn.Dense(self.width, name="key")(x)
    v_new = nn.Dense(self.width, name="value")(x)
    k, v = k_new, v_new
    if cache is not None:
      k = jnp.concatenate([cache[0], k_new], axis=1)
      v = jnp.concatenate([cache[1], v_new], axis=1)
    weights = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(self.width), axis=-1)
    h = x + nn.Dense(self.width, name="out")(jnp.einsum("bqk,bkd->bqd", weights, v))
    if cache is not None:  # decoding steps only: the prefix pass runs once, outside the loop
      self.sow("intermediates", "resid", h)
    return h + nn.Dense(self.width, name="mlp")(nn.gelu(h)), (k_new, v_new)


class Decoder(nn.Module):
  width: int = WIDTH
  depth: int = DEPTH

  @nn.compact
  def __call__(self, x, kv_cache=None):
    new_cache = []
    for i in range(self.depth):
      x, kv = Layer(self.width, name=f"layer_{i}")(x, None if kv_cache is None else kv_cache[i])
      new_cache.append(kv)
    return nn.LayerNorm(name="norm")(x), new_cache

  # openpi's bridged parts define an `init` method that lazy_init runs (method="init").
  def init(self):  # pyright: ignore[reportIncompatibleMethodOverride]
    """Creates every variable from a one-token input (prefix pass, then a decoding step)."""
    x = jnp.zeros((1, 1, self.width))
    _, cache = self(x)
    return self(x, kv_cache=cache)


class Policy(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, loop: str = "while"):
    self.loop = loop
    self.llm = lb.ToNNX(Decoder(), rngs=rngs)
    self.llm.lazy_init(rngs=rngs, method="init")  # no capacity: third-party code
    self.action_in = nnx.Linear(ACTION, WIDTH, rngs=rngs)
    self.action_out = nnx.Linear(WIDTH, ACTION, rngs=rngs)

  def velocity(self, x_t, t, kv_cache):
    h, _ = self.llm(self.action_in(x_t) + t, kv_cache=kv_cache)
    return self.action_out(h)

  def sample_actions(self, obs, noise, num_steps: int = STEPS):
    _, kv_cache = self.llm(obs)  # the prefix pass: sows nothing
    dt = -1.0 / num_steps
    if self.loop == "while":

      def body(carry):
        model, x_t, t = carry
        return model, x_t + dt * model.velocity(x_t, t, kv_cache), t + dt

      _, x_0, _ = nnx.while_loop(
        lambda c: c[2] >= -dt / 2, body, (self, noise, jnp.asarray(1.0, jnp.float32))
      )
      return x_0

    def step(i, carry):
      model, x_t = carry
      t = 1.0 + dt * i
      return model, x_t + dt * model.velocity(x_t, t, kv_cache)

    return nnx.fori_loop(0, num_steps, step, (self, noise))[1]

  def sample_actions_closed_over(self, obs, noise, num_steps: int = STEPS):
    """openpi's way: a jax.lax loop body that closes over `self`."""
    _, kv_cache = self.llm(obs)
    dt = -1.0 / num_steps

    def body(carry):
      x_t, t = carry
      return x_t + dt * self.velocity(x_t, t, kv_cache), t + dt

    return jax.lax.while_loop(
      lambda c: c[1] >= -dt / 2, body, (noise, jnp.asarray(1.0, jnp.float32))
    )[0]


def inputs():
  obs = jax.random.normal(jax.random.key(1), (BATCH, PREFIX, WIDTH))
  noise = jax.random.normal(jax.random.key(2), (BATCH, SUFFIX, ACTION))
  return obs, noise


def linen_reference(policy: Policy, obs, noise, num_steps: int = STEPS):
  """Plain Linen apply, one call per step; returns (x_0, {layer: residuals (n, B, S, W)})."""
  variables = {"params": lb.linen_variables(policy.llm)["params"]}
  _, kv_cache = Decoder().apply(variables, obs)
  dt = -1.0 / num_steps
  x, resid = noise, {f"layer_{i}": [] for i in range(DEPTH)}
  for i in range(num_steps):
    t = 1.0 + dt * i
    (h, _), inter = Decoder().apply(
      variables, policy.action_in(x) + t, kv_cache=kv_cache, mutable=["intermediates"]
    )
    for name, steps in resid.items():
      steps.append(inter["intermediates"][name]["resid"][0])
    x = x + dt * policy.action_out(h)
  return x, {name: np.stack(steps) for name, steps in resid.items()}


def test_third_party_init_without_capacity_names_the_scoped_fix():
  with pytest.raises(lb.CapacityError, match=r"no capacity was declared.*with lb\.capacity"):
    Policy(nnx.Rngs(0))


@pytest.mark.parametrize("loop", ["while", "fori"])
def test_one_root_preallocate_then_a_jitted_denoising_loop_matches_linen(loop):
  with lb.capacity(STEPS):
    policy = Policy(nnx.Rngs(0), loop)
  # init declared the one-token signature; the loop decodes SUFFIX tokens.
  assert lb.buffers(policy)["llm"]["intermediates"]["layer_0"]["resid"].shape == (
    STEPS,
    1,
    1,
    WIDTH,
  )
  obs, noise = inputs()
  lb.preallocate(policy, obs, noise, method=Policy.sample_actions, capacity=STEPS)
  assert lb.buffers(policy)["llm"]["intermediates"]["layer_0"]["resid"].shape == (
    STEPS,
    BATCH,
    SUFFIX,
    WIDTH,
  )

  actions = nnx.jit(lambda p, o, n: p.sample_actions(o, n))(policy, obs, noise)

  expected_actions, expected_resid = linen_reference(policy, obs, noise)
  np.testing.assert_allclose(actions, expected_actions, rtol=RTOL, atol=ATOL)
  recorded = lb.recorded(policy)["llm"]["intermediates"]
  for name, steps in expected_resid.items():
    assert recorded[name]["resid"].shape == (STEPS, BATCH, SUFFIX, WIDTH)
    np.testing.assert_allclose(recorded[name]["resid"], steps, rtol=RTOL, atol=ATOL)


def test_openpi_style_closed_over_loop_in_a_jit_wrapper_raises_instead_of_losing_records():
  with lb.capacity(STEPS):
    policy = Policy(nnx.Rngs(0))
  obs, noise = inputs()
  lb.preallocate(policy, obs, noise, method=Policy.sample_actions, capacity=STEPS)
  graphdef, state = nnx.split(policy)

  @jax.jit
  def frozen(state, obs, noise):  # merges a copy, as openpi's module_jit does
    return nnx.merge(graphdef, state).sample_actions_closed_over(obs, noise)

  with pytest.raises(lb.StructureChangeError, match="carry the model through the loop"):
    frozen(state, obs, noise)
