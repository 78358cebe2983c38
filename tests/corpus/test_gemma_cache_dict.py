"""Corpus: a Gemma-style decoder whose KV cache is an explicit dict passed in and returned.

The shape of Gemma's Linen port (written here, tiny): `__call__(tokens, positions, cache,
attn_mask) -> (logits, new_cache)`, the cache a dict per layer `{"k", "v", "end_index"}` that
the caller owns and threads through the loop; nothing lives in a `cache` collection. Each
layer sows its output. The model is initialized on the one-token step (the cache size is the
argument's, so that is right here) and decodes in a jitted `nnx.fori_loop` with the cache dict
in the carry.

Reference: plain Linen `apply` per token with the same params, the same cache dict threaded
by hand. Tokens equal; recorded floats and final caches agree to atol=1e-5 (float32, jit vs
op-by-op round-off).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

# Real-model shapes end to end: each feature they use has its own faster test; CI runs
# these in its `-m slow` pass (tests/conftest.py).
pytestmark = pytest.mark.slow

VOCAB, WIDTH, HEADS, LAYERS, CACHE_LEN = 16, 16, 2, 2, 8
HEAD_DIM = WIDTH // HEADS
STEPS = CACHE_LEN - 1
PROMPT = jnp.array([[3, 1, 4], [1, 5, 9]], jnp.int32)
ATOL = 1e-5


def empty_cache(batch):
  def layer():
    return {
      "k": jnp.zeros((batch, CACHE_LEN, HEADS, HEAD_DIM)),
      "v": jnp.zeros((batch, CACHE_LEN, HEADS, HEAD_DIM)),
      "end_index": jnp.zeros((batch,), jnp.int32),
    }

  return {f"layer_{i}": layer() for i in range(LAYERS)}


class Attention(nn.Module):
  @nn.compact
  def __call__(self, x, cache, attn_mask):
    q, k, v = (nn.DenseGeneral((HEADS, HEAD_DIM), name=n)(x) for n in ("q", "k", "v"))
    index = cache["end_index"][0]
    keys = jax.lax.dynamic_update_slice(cache["k"], k, (0, index, 0, 0))
    values = jax.lax.dynamic_update_slice(cache["v"], v, (0, index, 0, 0))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, keys) / np.sqrt(HEAD_DIM)
    weights = jax.nn.softmax(jnp.where(attn_mask[:, None], logits, -1e30), axis=-1)
    out = nn.DenseGeneral(WIDTH, axis=(-2, -1), name="o")(
      jnp.einsum("bhqk,bkhd->bqhd", weights, values)
    )
    new_cache = {"k": keys, "v": values, "end_index": cache["end_index"] + x.shape[1]}
    return out, new_cache


class Layer(nn.Module):
  @nn.compact
  def __call__(self, x, cache, attn_mask):
    h, cache = Attention()(nn.RMSNorm()(x), cache, attn_mask)
    x = x + h
    x = x + nn.Dense(WIDTH)(nn.gelu(nn.Dense(2 * WIDTH)(nn.RMSNorm()(x))))
    self.sow("intermediates", "out", x)
    return x, cache


class GemmaLike(nn.Module):
  @nn.compact
  def __call__(self, tokens, positions, cache, attn_mask):
    embed = nn.Embed(VOCAB, WIDTH)
    x = embed(tokens) * np.sqrt(WIDTH) + nn.Embed(CACHE_LEN, WIDTH)(positions)
    new_cache = {}
    for i in range(LAYERS):
      x, new_cache[f"layer_{i}"] = Layer(name=f"layer_{i}")(x, cache[f"layer_{i}"], attn_mask)
    return embed.attend(nn.RMSNorm()(x)), new_cache


def _step_inputs(tokens, t):
  """The one-token call at position t: token, position, and the mask over cache slots."""
  batch = tokens.shape[0]
  token = jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)
  positions = jnp.full((batch, 1), t, jnp.int32)
  attn_mask = (jnp.arange(CACHE_LEN) <= t)[None, None, :].repeat(batch, 0)  # (b, 1, len)
  return token, positions, attn_mask


def _next(t, tokens, logits):
  proposed = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
  return jnp.where(t + 1 < PROMPT.shape[1], tokens[:, t + 1], proposed)


def _start_tokens():
  return jnp.zeros((PROMPT.shape[0], CACHE_LEN), jnp.int32).at[:, : PROMPT.shape[1]].set(PROMPT)


@nnx.jit
def generate(model, tokens, cache):
  def body(t, carry):
    model, tokens, cache = carry
    token, positions, attn_mask = _step_inputs(tokens, t)
    logits, cache = model(token, positions, cache, attn_mask)
    tokens = jax.lax.dynamic_update_slice_in_dim(
      tokens, _next(t, tokens, logits)[:, None], t + 1, axis=1
    )
    return model, tokens, cache

  _, tokens, cache = nnx.fori_loop(0, STEPS, body, (model, tokens, cache))
  return tokens, cache


def test_cache_dict_threaded_through_the_loop_matches_linen():
  batch = PROMPT.shape[0]
  model = lb.ToNNX(GemmaLike(), rngs=nnx.Rngs(0))
  lb.lazy_init(
    model,
    *_step_inputs(_start_tokens(), 0)[:2],
    empty_cache(batch),
    _step_inputs(_start_tokens(), 0)[2],
    capacity=STEPS,
  )
  tokens, cache = generate(model, _start_tokens(), empty_cache(batch))
  rec = lb.recorded(model)["intermediates"]

  state = nnx.state(model, nnx.Param)
  params = nnx.to_pure_dict(state) if hasattr(nnx, "to_pure_dict") else state.to_pure_dict()
  module = GemmaLike()
  step = jax.jit(functools.partial(module.apply, mutable=["intermediates"]))  # one compile
  ref_tokens, ref_cache = _start_tokens(), empty_cache(batch)
  ref_out = {i: [] for i in range(LAYERS)}
  for t in range(STEPS):
    (logits, ref_cache), sown = step(
      {"params": params},
      *_step_inputs(ref_tokens, t)[:2],
      ref_cache,
      _step_inputs(ref_tokens, t)[2],
    )
    for i in range(LAYERS):
      ref_out[i].append(sown["intermediates"][f"layer_{i}"]["out"][0])
    ref_tokens = ref_tokens.at[:, t + 1].set(_next(t, ref_tokens, logits))

  np.testing.assert_array_equal(tokens, ref_tokens)
  assert tokens[:, : PROMPT.shape[1]].tolist() == PROMPT.tolist()
  for i in range(LAYERS):
    out = rec[f"layer_{i}"]["out"]
    assert out.shape == (STEPS, batch, 1, WIDTH)
    np.testing.assert_allclose(out, jnp.stack(ref_out[i]), atol=ATOL, rtol=0)
  np.testing.assert_array_equal(cache["layer_0"]["end_index"], [STEPS] * batch)
  for got, want in zip(jax.tree.leaves(cache), jax.tree.leaves(ref_cache)):
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
