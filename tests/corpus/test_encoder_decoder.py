"""Corpus: an encoder-decoder (wmt style) with cross-attention and a decode cache.

The shape of flax's wmt example (written here, tiny): `setup`-built encoder and decoder, an
`encode(src)` method, a `decode(encoded, src_mask, tgt)` method whose blocks hold a causal
self-attention with `decode=True` (cache in the `cache` collection, sized by init) and a
cross-attention to the encoder output; `__call__` runs both (what `init` sees). The decoder
blocks sow their output and the cross-attention weights (`sow_weights=True`).

Recipe: `lb.lazy_init(model, src, full_tgt)` (caches of the full target length),
`lb.preallocate(model, encoded, mask, tgt[:, :1], method="decode")` for the one-token step,
encode once, then a jitted `nnx.fori_loop` of greedy decode steps. Reference: plain Linen
`init` on the same shapes, `apply(method="encode")`, then one `apply(method="decode")` per
token with the cache threaded by hand, same params. Tokens equal; recorded floats agree to
atol=1e-5 (float32, jit vs op-by-op round-off).
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

VOCAB, WIDTH, HEADS, SRC_LEN, TGT_LEN = 12, 16, 2, 5, 6
STEPS = TGT_LEN - 1
BOS = 1
ATOL = 1e-5


class EncoderBlock(nn.Module):
  @nn.compact
  def __call__(self, x, mask):
    x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS)(nn.LayerNorm()(x), mask=mask)
    return x + nn.Dense(WIDTH)(nn.relu(nn.Dense(2 * WIDTH)(nn.LayerNorm()(x))))


class DecoderBlock(nn.Module):
  @nn.compact
  def __call__(self, y, encoded, cross_mask):
    y = y + nn.MultiHeadDotProductAttention(num_heads=HEADS, decode=True, name="self_attn")(
      nn.LayerNorm()(y)
    )
    y = y + nn.MultiHeadDotProductAttention(num_heads=HEADS, name="cross_attn")(
      nn.LayerNorm()(y), encoded, mask=cross_mask, sow_weights=True
    )
    y = y + nn.Dense(WIDTH)(nn.relu(nn.Dense(2 * WIDTH)(nn.LayerNorm()(y))))
    self.sow("intermediates", "out", y)
    return y


class EncoderDecoder(nn.Module):
  def setup(self):
    self.src_embed = nn.Embed(VOCAB, WIDTH)
    self.tgt_embed = nn.Embed(VOCAB, WIDTH)
    self.encoder = EncoderBlock()
    self.decoder = DecoderBlock()
    self.head = nn.Dense(VOCAB)

  def encode(self, src):
    mask = nn.make_attention_mask(src > 0, src > 0)
    return self.encoder(self.src_embed(src), mask)

  def decode(self, encoded, src, tgt):
    # The decode cache supplies the causal mask; cross-attention masks source padding.
    cross_mask = nn.make_attention_mask(jnp.ones_like(tgt) > 0, src > 0)
    return self.head(self.decoder(self.tgt_embed(tgt), encoded, cross_mask))

  def __call__(self, src, tgt):
    return self.decode(self.encode(src), src, tgt)


SRC = jnp.array([[4, 7, 2, 9, 0], [3, 3, 8, 0, 0]], jnp.int32)  # 0 is padding


def _start_tokens():
  return jnp.zeros((SRC.shape[0], TGT_LEN), jnp.int32).at[:, 0].set(BOS)


@nnx.jit
def translate(model, src, tokens):
  encoded = model(src, method="encode")

  def body(t, carry):
    model, tokens = carry
    current = jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)
    logits = model(encoded, src, current, method="decode", mutable=["cache"])
    nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    return model, jax.lax.dynamic_update_slice_in_dim(tokens, nxt[:, None], t + 1, axis=1)

  return nnx.fori_loop(0, STEPS, body, (model, tokens))[1]


def test_greedy_translation_with_cross_attention_and_decode_cache_matches_linen():
  model = lb.ToNNX(EncoderDecoder(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, SRC, _start_tokens(), capacity=STEPS)  # caches of TGT_LEN positions
  encoded_shape = jnp.zeros((SRC.shape[0], SRC_LEN, WIDTH))
  lb.preallocate(model, encoded_shape, SRC, _start_tokens()[:, :1], method="decode", capacity=STEPS)
  tokens = translate(model, SRC, _start_tokens())
  rec = lb.recorded(model)["intermediates"]["decoder"]

  state = nnx.state(model, nnx.Param)
  params = nnx.to_pure_dict(state) if hasattr(nnx, "to_pure_dict") else state.to_pure_dict()
  module = EncoderDecoder()
  cache = module.init(jax.random.key(1), SRC, _start_tokens())["cache"]  # empty, TGT_LEN
  encoded = module.apply({"params": params}, SRC, method="encode")
  step = jax.jit(
    functools.partial(
      module.apply,
      method="decode",  # one compile for all steps
      mutable=["cache", "intermediates"],
    )
  )
  ref_tokens, ref_out, ref_cross = _start_tokens(), [], []
  for t in range(STEPS):
    logits, state = step({"params": params, "cache": cache}, encoded, SRC, ref_tokens[:, t : t + 1])
    cache = state["cache"]
    sown = state["intermediates"]["decoder"]
    ref_out.append(sown["out"][0])
    ref_cross.append(sown["cross_attn"]["attention_weights"][0])
    ref_tokens = ref_tokens.at[:, t + 1].set(jnp.argmax(logits[:, -1], -1).astype(jnp.int32))

  np.testing.assert_array_equal(tokens, ref_tokens)
  assert rec["out"].shape == (STEPS, SRC.shape[0], 1, WIDTH)
  np.testing.assert_allclose(rec["out"], jnp.stack(ref_out), atol=ATOL, rtol=0)
  cross = rec["cross_attn"]["attention_weights"]  # (steps, batch, heads, 1, src_len)
  np.testing.assert_allclose(cross, jnp.stack(ref_cross), atol=ATOL, rtol=0)
  assert float(cross[:, 1, :, :, 3:].max()) == 0.0  # padding of the second source is masked
