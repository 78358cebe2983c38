"""Autoregressive decoding with a bridged Linen transformer and its KV cache in `nnx.while_loop`.

A tiny decoder-only Linen transformer keeps a key/value cache in the `cache` collection (the
`decode=True` style: each call appends its keys and values and advances an index). Wrapped with
`lb.ToNNX`, it generates tokens inside a jitted `nnx.while_loop`, recording every block's hidden
state and attention weights for each step. The result is checked against plain Linen applied one
token at a time.

Run: python examples/decoding_with_cache.py
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import loopbridge as lb

VOCAB, WIDTH, HEADS, LAYERS, MAX_LEN = 16, 16, 2, 2, 12

# nnx.to_pure_dict is the spelling from flax 0.11 on; 0.10 has only the State method.
to_pure_dict = getattr(nnx, "to_pure_dict", lambda state: state.to_pure_dict())


class CachedSelfAttention(nn.Module):
  """Causal self-attention with a hand-written KV cache in the `cache` collection."""

  heads: int
  max_len: int

  @nn.compact
  def __call__(self, x):
    batch, length, width = x.shape
    head_dim = width // self.heads
    def dense(name):
      return nn.DenseGeneral((self.heads, head_dim), name=name)
    q, k, v = dense("query")(x), dense("key")(x), dense("value")(x)

    cache_shape = (batch, self.max_len, self.heads, head_dim)
    cached_k = self.variable("cache", "cached_key", jnp.zeros, cache_shape, x.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, cache_shape, x.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))

    start = index.value
    keys = jax.lax.dynamic_update_slice(cached_k.value, k, (0, start, 0, 0))
    values = jax.lax.dynamic_update_slice(cached_v.value, v, (0, start, 0, 0))
    if not self.is_initializing():  # init only creates the (empty) cache
      cached_k.value, cached_v.value, index.value = keys, values, start + length

    # Query i sits at position start + i and may attend to every cached position up to it.
    visible = jnp.arange(self.max_len)[None, :] <= (start + jnp.arange(length))[:, None]
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, keys) / np.sqrt(head_dim)
    weights = jax.nn.softmax(jnp.where(visible, logits, -1e30), axis=-1)
    self.sow("intermediates", "attention", weights)  # (batch, heads, length, max_len)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, values)
    return nn.DenseGeneral(width, axis=(-2, -1), name="out")(out)


class DecoderBlock(nn.Module):
  heads: int
  max_len: int

  @nn.compact
  def __call__(self, x):
    x = x + CachedSelfAttention(self.heads, self.max_len)(nn.LayerNorm()(x))
    width = x.shape[-1]
    x = x + nn.Dense(width)(nn.gelu(nn.Dense(2 * width)(nn.LayerNorm()(x))))
    self.sow("intermediates", "hidden", x)  # (batch, length, width)
    return x


class TinyLM(nn.Module):
  """Token ids (batch, length) -> next-token logits; the cache tracks the position."""

  vocab: int = VOCAB
  width: int = WIDTH
  heads: int = HEADS
  layers: int = LAYERS
  max_len: int = MAX_LEN

  @nn.compact
  def __call__(self, tokens):
    position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
    positions = position.value + jnp.arange(tokens.shape[1])
    if not self.is_initializing():
      position.value = position.value + tokens.shape[1]
    x = nn.Embed(self.vocab, self.width)(tokens) + nn.Embed(self.max_len, self.width)(positions)
    for _ in range(self.layers):
      x = DecoderBlock(self.heads, self.max_len)(x)
    return nn.Dense(self.vocab)(nn.LayerNorm()(x))


@nnx.jit
def decode(model, tokens, prompt_len):
  """Greedy decoding: feed the prompt, then the model's own tokens, until MAX_LEN positions."""

  def cond(carry):
    return carry[2] < MAX_LEN - 1

  def body(carry):
    model, tokens, t = carry
    current = jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)
    logits = model(current, mutable=["cache"])  # Linen meaning: the cache may change
    proposed = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    nxt = jnp.where(t + 1 < prompt_len, tokens[:, t + 1], proposed)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, nxt[:, None], t + 1, axis=1)
    return model, tokens, t + 1

  return nnx.while_loop(cond, body, (model, tokens, jnp.asarray(0)))[1]


def generate(model, prompt):
  tokens = jnp.zeros((prompt.shape[0], MAX_LEN), jnp.int32).at[:, :prompt.shape[1]].set(prompt)
  return decode(model, tokens, prompt.shape[1])


def linen_reference(variables, prompt):
  """Plain Linen, one token per `apply`, cache threaded by hand: the independent reference."""
  module = TinyLM()
  cache = module.init(jax.random.key(0), prompt[:, :1])["cache"]  # an empty cache
  tokens = [prompt[:, i] for i in range(prompt.shape[1])]
  hidden, attention = [], []
  for t in range(MAX_LEN - 1):
    logits, state = module.apply({"params": variables["params"], "cache": cache},
                                 tokens[t][:, None], mutable=["cache", "intermediates"])
    cache = state["cache"]
    hidden.append(state["intermediates"]["DecoderBlock_0"]["hidden"][0])
    attention.append(
        state["intermediates"]["DecoderBlock_1"]["CachedSelfAttention_0"]["attention"][0])
    if t + 1 >= prompt.shape[1]:
      tokens.append(jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32))
  return jnp.stack(tokens, axis=1), jnp.stack(hidden), jnp.stack(attention)


def main() -> None:
  prompt = jnp.array([[1, 5, 3]], jnp.int32)
  model = lb.ToNNX(TinyLM(), rngs=nnx.Rngs(0))
  # One decoding step (one token) is the call signature of the loop; every step records once.
  lb.lazy_init(model, prompt[:, :1], capacity=MAX_LEN - 1)
  variables = {"params": to_pure_dict(nnx.state(model, nnx.Param))}

  tokens = generate(model, prompt)
  rec = lb.recorded(model)["intermediates"]
  hidden = rec["DecoderBlock_0"]["hidden"]
  attention = rec["DecoderBlock_1"]["CachedSelfAttention_0"]["attention"]

  ref_tokens, ref_hidden, ref_attention = linen_reference(variables, prompt)
  same = (bool(jnp.array_equal(tokens, ref_tokens))
          and bool(jnp.allclose(hidden, ref_hidden, atol=1e-5))
          and bool(jnp.allclose(attention, ref_attention, atol=1e-5)))

  print(f"prompt {prompt[0].tolist()} -> tokens {tokens[0].tolist()}")
  print(f"recorded per generated step: hidden {tuple(hidden.shape)}, "
        f"attention {tuple(attention.shape)}")
  print(f"attention of the last step over positions: "
        f"{' '.join(f'{w:.2f}' for w in np.asarray(attention[-1, 0, 0, 0]))}")
  print(f"matches step-by-step Linen: {same}")
  if not same:
    raise SystemExit(1)


if __name__ == "__main__":
  main()
