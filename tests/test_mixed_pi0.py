"""A mixed model shaped like openpi's Pi0: an NNX module holding a bridged Linen transformer.

- `TinyLM` (Linen): layers are `nn.scan(nn.remat(Block), variable_axes={'params', 'intermediates',
  'cache'})` built in `setup`; each Block keeps a KV cache of the prefix in the 'cache'
  collection and, when decoding the suffix, sows its residual stream.
- `Pi0` (NNX): holds `lb.ToNNX(TinyLM)`, lazily initialized with `method="init"` on 1-token
  inputs (as openpi does), fills the cache with a prefix pass, then runs a denoising
  `nnx.while_loop` inside a method; every step calls the bridged transformer with the cache
  and sows the velocity natively.
- `lb.preallocate(model, ..., method="denoise_step")` declares the buffers of the loop's
  signature (longer suffix than at init).

Reference: plain Linen `apply` step by step (prefix pass with mutable=['cache'], then one suffix
apply per step with mutable=['intermediates']) with the same parameters, and the same NNX
linear layers called eagerly. Compiled + remat vs eager: RTOL/ATOL below (float32 round-off).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

RTOL, ATOL = 1e-5, 1e-5
WIDTH, DEPTH, PREFIX, SUFFIX, ACTION, BATCH = 8, 2, 3, 2, 2, 1


class Block(nn.Module):
  """Single-head attention over [cached prefix, suffix] + an MLP, residual stream sown."""

  width: int
  prefix_len: int

  @nn.compact
  def __call__(self, x, mode):
    q = nn.Dense(self.width, name="q")(x)
    k = nn.Dense(self.width, name="k")(x)
    v = nn.Dense(self.width, name="v")(x)
    shape = (x.shape[0], self.prefix_len, self.width)
    cache_k = self.variable("cache", "cached_k", jnp.zeros, shape, x.dtype)
    cache_v = self.variable("cache", "cached_v", jnp.zeros, shape, x.dtype)
    if mode == "prefix":
      cache_k.value, cache_v.value = k, v
    elif mode == "suffix":
      k = jnp.concatenate([cache_k.value, k], axis=1)
      v = jnp.concatenate([cache_v.value, v], axis=1)
    weights = jax.nn.softmax(q @ k.swapaxes(1, 2) / np.sqrt(self.width), axis=-1)
    h = x + nn.Dense(self.width, name="o")(weights @ v)
    if mode == "suffix":
      # Only decoding steps sow: the prefix pass runs once, outside the loop.
      self.sow("intermediates", "resid", h)
    return h + nn.Dense(self.width, name="mlp")(nn.gelu(h)), None


class TinyLM(nn.Module):
  width: int = WIDTH
  depth: int = DEPTH
  prefix_len: int = PREFIX

  def setup(self):
    self.layers = nn.scan(
      nn.remat(Block, static_argnums=(2,)),
      variable_axes={"params": 0, "intermediates": 0, "cache": 0},
      split_rngs={"params": True},
      in_axes=nn.broadcast,
      length=self.depth,
    )(self.width, self.prefix_len)
    self.norm = nn.LayerNorm()

  def __call__(self, x, mode="suffix"):
    h, _ = self.layers(x, mode)
    return self.norm(h)

  # openpi's own signature, unlike Linen's `init(rngs, *args)`.
  def init(self, x):  # pyright: ignore[reportIncompatibleMethodOverride]
    """openpi's convenience method: creates every variable from a tiny input."""
    return self(x, mode="init")


class Pi0(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.llm = lb.ToNNX(TinyLM(), rngs=rngs)
    self.action_in = nnx.Linear(ACTION, WIDTH, rngs=rngs)
    self.action_out = nnx.Linear(WIDTH, ACTION, rngs=rngs)
    lb.lazy_init(self.llm, jnp.zeros((BATCH, 1, WIDTH)), method="init")

  def embed_prefix(self, obs):
    self.llm(obs, mode="prefix", mutable=["cache"])  # fills the KV cache in place

  def denoise_step(self, x_t, t):
    h = self.llm(self.action_in(x_t) + t, mode="suffix")
    velocity = self.action_out(h)
    self.sow(nnx.Intermediate, "velocity", velocity)
    return velocity

  def sample(self, obs, noise, num_steps: int):
    self.embed_prefix(obs)
    dt = -1.0 / num_steps

    def cond(carry):
      return carry[2] >= -dt / 2

    def body(carry):
      model, x_t, t = carry
      return model, x_t + dt * model.denoise_step(x_t, t), t + dt

    _, x_0, _ = nnx.while_loop(cond, body, (self, noise, jnp.asarray(1.0, jnp.float32)))
    return x_0


@pytest.fixture(scope="module")
def pi0_template():
  """One initialized model per module (Linen init of an eager nn.scan is slow); tests clone it."""
  return Pi0(nnx.Rngs(0))


def inputs():
  obs = jax.random.normal(jax.random.key(1), (BATCH, PREFIX, WIDTH))
  noise = jax.random.normal(jax.random.key(2), (BATCH, SUFFIX, ACTION))
  return obs, noise


def linen_reference(model: Pi0, obs, noise, num_steps):
  """Plain Linen step by step; returns (x_0, resid per step (n, L, B, S, W), velocities)."""
  params = lb.linen_variables(model.llm)["params"]
  # jit only to keep the test fast (an eager nn.scan retraces on every apply).
  apply = jax.jit(TinyLM().apply, static_argnames=("mode", "mutable"))
  _, state = apply({"params": params}, obs, mode="prefix", mutable=("cache",))
  variables = {"params": params, "cache": state["cache"]}
  dt = -1.0 / num_steps
  x, t, resid, vel = noise, jnp.asarray(1.0, jnp.float32), [], []
  for _ in range(num_steps):
    h, inter = apply(variables, model.action_in(x) + t, mode="suffix", mutable=("intermediates",))
    (step_resid,) = inter["intermediates"]["layers"]["resid"]
    resid.append(step_resid)
    v = model.action_out(h)
    vel.append(v)
    x, t = x + dt * v, t + dt
  return x, jnp.stack(resid), jnp.stack(vel)


@pytest.mark.parametrize(
  "capacity", [4, {"velocity": 4, "llm/layers/resid": 4}], ids=["int", "paths-from-root"]
)
def test_pi0_sampling_loop_records_every_step(capacity, pi0_template):
  num_steps = 4
  obs, noise = inputs()
  model = nnx.clone(pi0_template)
  # Initialized on 1-token inputs; the loop decodes SUFFIX tokens: declare that signature.
  lb.preallocate(model, noise, jnp.float32(1.0), method="denoise_step", capacity=capacity)
  want_x, want_resid, want_vel = linen_reference(model, obs, noise, num_steps)

  x_0 = nnx.jit(Pi0.sample, static_argnums=3)(model, obs, noise, num_steps)

  rec = lb.recorded(model)
  resid = rec["llm"]["intermediates"]["layers"]["resid"]
  assert resid.shape == (num_steps, DEPTH, BATCH, SUFFIX, WIDTH)
  np.testing.assert_allclose(resid, want_resid, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(rec["intermediates"]["velocity"], want_vel, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(x_0, want_x, rtol=RTOL, atol=ATOL)
  # The prefix pass filled the cache in place (same Variables, fixed shape) and sowed nothing.
  cache_k = lb.linen_variables(model.llm)["cache"]["layers"]["cached_k"]
  assert cache_k.shape == (DEPTH, BATCH, PREFIX, WIDTH)
  assert float(jnp.abs(cache_k).sum()) > 0


def test_pi0_second_sample_after_reset_matches_again(pi0_template):
  num_steps = 4
  obs, noise = inputs()
  model = nnx.clone(pi0_template)
  lb.preallocate(model, noise, jnp.float32(1.0), method="denoise_step", capacity=num_steps)
  sample = nnx.jit(Pi0.sample, static_argnums=3)
  sample(model, obs, noise, num_steps)
  lb.reset(model)
  sample(model, obs, 2 * noise, num_steps)
  _, want_resid, _ = linen_reference(model, obs, 2 * noise, num_steps)
  np.testing.assert_allclose(
    lb.recorded(model)["llm"]["intermediates"]["layers"]["resid"], want_resid, rtol=RTOL, atol=ATOL
  )


def test_lazy_init_on_the_root_declares_native_and_bridged_sites():
  class Root(nnx.Module):
    def __init__(self, rngs):
      self.llm = lb.ToNNX(TinyLM(), rngs=rngs)
      self.action_in = nnx.Linear(ACTION, WIDTH, rngs=rngs)

    def __call__(self, x_t):
      h = self.llm(self.action_in(x_t), mode="suffix")
      self.sow(nnx.Intermediate, "h", h)
      return h

  _, noise = inputs()
  model = lb.lazy_init(Root(nnx.Rngs(0)), noise, capacity={"intermediates": 3})
  shapes = jax.tree.map(jnp.shape, lb.buffers(model))
  assert shapes == {
    "intermediates": {"h": (3, BATCH, SUFFIX, WIDTH)},
    "llm": {"intermediates": {"layers": {"resid": (3, DEPTH, BATCH, SUFFIX, WIDTH)}}},
  }
  assert not hasattr(model, "h")  # the initializing call's native sow was not kept
  with pytest.raises(lb.CapacityError, match="llm/nope"):
    lb.preallocate(model, noise, capacity={"intermediates": 3, "llm/nope": 1})
