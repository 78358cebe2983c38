"""Autoregressive decoding with flax's decode attention in `nnx.while_loop`, recording each step.

A tiny decoder-only Linen transformer uses `nn.MultiHeadDotProductAttention(decode=True)`, whose
`cache` collection is sized by the input given to `init`. Wrapped with `lb.ToNNX`, it is
initialized on the full length (`lb.lazy_init`), its one-token step is declared with
`lb.preallocate`, and it generates tokens inside a jitted `nnx.while_loop`, recording every
block's hidden state and attention weights for each step. The result is checked against the
model's own Linen decode (one `apply` per token, cache threaded by hand).

Run: python examples/decoding_with_cache.py
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import loopbridge as lb

VOCAB, WIDTH, HEADS, LAYERS, MAX_LEN = 16, 16, 2, 2, 12
STEPS = MAX_LEN - 1  # one call per position but the last

# nnx.to_pure_dict is the spelling from flax 0.11 on; 0.10 has only the State method.
to_pure_dict = getattr(nnx, "to_pure_dict", lambda state: state.to_pure_dict())


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    attention = nn.MultiHeadDotProductAttention(num_heads=HEADS, decode=True)
    x = x + attention(nn.LayerNorm()(x), sow_weights=True)  # sows "attention_weights"
    x = x + nn.Dense(WIDTH)(nn.gelu(nn.Dense(2 * WIDTH)(nn.LayerNorm()(x))))
    self.sow("intermediates", "hidden", x)  # (batch, length, width)
    return x


class FlaxLM(nn.Module):
  """Token ids (batch, length) -> logits. Decode-only: the cache tracks the position."""

  @nn.compact
  def __call__(self, tokens):
    position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
    positions = position.value + jnp.arange(tokens.shape[1])
    if not self.is_initializing():
      position.value = position.value + tokens.shape[1]
    x = nn.Embed(VOCAB, WIDTH)(tokens) + nn.Embed(MAX_LEN, WIDTH)(positions)
    for _ in range(LAYERS):
      x = Block()(x)
    return nn.Dense(VOCAB)(nn.LayerNorm()(x))


@nnx.jit
def decode(model, tokens, prompt_len):
  """Greedy decoding: feed the prompt, then the model's own tokens, until MAX_LEN positions."""

  def cond(carry):
    return carry[2] < STEPS

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
  tokens = jnp.zeros((prompt.shape[0], MAX_LEN), jnp.int32).at[:, : prompt.shape[1]].set(prompt)
  return decode(model, tokens, prompt.shape[1])


def linen_reference(params, prompt):
  """The model's own Linen decode: init on the full length, one `apply` per token."""
  module = FlaxLM()
  cache = module.init(jax.random.key(0), jnp.zeros((1, MAX_LEN), jnp.int32))["cache"]
  tokens = [prompt[:, i] for i in range(prompt.shape[1])]
  hidden, weights = [], []
  for t in range(STEPS):
    logits, state = module.apply(
      {"params": params, "cache": cache}, tokens[t][:, None], mutable=["cache", "intermediates"]
    )
    cache = state["cache"]
    hidden.append(state["intermediates"]["Block_0"]["hidden"][0])
    weights.append(
      state["intermediates"]["Block_1"]["MultiHeadDotProductAttention_0"]["attention_weights"][0]
    )
    if t + 1 >= prompt.shape[1]:
      tokens.append(jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32))
  return jnp.stack(tokens, axis=1), jnp.stack(hidden), jnp.stack(weights)


def main() -> None:
  prompt = jnp.array([[1, 5, 3]], jnp.int32)
  full = jnp.zeros((1, MAX_LEN), jnp.int32)
  model = lb.ToNNX(FlaxLM(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, full, capacity=STEPS)  # caches of MAX_LEN positions
  lb.preallocate(model, full[:, :1], capacity=STEPS)  # buffers for the one-token step
  params = to_pure_dict(nnx.state(model, nnx.Param))

  tokens = generate(model, prompt)
  rec = lb.recorded(model)["intermediates"]
  hidden = rec["Block_0"]["hidden"]
  weights = rec["Block_1"]["MultiHeadDotProductAttention_0"]["attention_weights"]

  ref_tokens, ref_hidden, ref_weights = linen_reference(params, prompt)
  same = (
    bool(jnp.array_equal(tokens, ref_tokens))
    and bool(jnp.allclose(hidden, ref_hidden, atol=1e-5))
    and bool(jnp.allclose(weights, ref_weights, atol=1e-5))
  )

  print(f"prompt {prompt[0].tolist()} -> tokens {tokens[0].tolist()}")
  print(
    f"recorded per generated step: hidden {tuple(hidden.shape)}, "
    f"attention weights {tuple(weights.shape)}"
  )
  print(
    f"attention of the last step over positions: "
    f"{' '.join(f'{w:.2f}' for w in np.asarray(weights[-1, 0, 0, 0]))}"
  )
  print(f"matches step-by-step Linen: {same}")
  if not same:
    raise SystemExit(1)


if __name__ == "__main__":
  main()
