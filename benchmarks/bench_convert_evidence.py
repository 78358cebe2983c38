"""What deciding by running costs `lb.checkpoint.linen_to_nnx`, against writing by hand.

A transformer-shaped Linen model (fused gate/up `[2, D, F]`, `DenseGeneral` attention
`(D, H, K)`, grouped-query attention, four unrolled layers) and a hand port (split Linears,
flat `(D, H*K)` kernels, renamed norms) are converted three ways, side by side in interleaved
rounds in one process:

  hand      the arrays split and reshaped by hand and written with `nnx.update` (the floor)
  rules     `linen_to_nnx(..., rules=[...])`: nothing open; discovery (both models run
            abstractly), the Linen model once, the port once with the converted values
  evidence  `linen_to_nnx(...)` without rules: as `rules`, plus each open candidate (gate/up
            order, q/k/v/o placement) applied to its module's recorded inputs

Prints the median seconds per conversion and the ratios to `hand` and to `rules`.

Run:  python benchmarks/bench_convert_evidence.py [--rounds N] [--width D]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

import loopbridge as lb

H, G, LAYERS, V = 4, 2, 4, 1000


def _attend(q, k, v, heads, groups, head_dim):
  k, v = jnp.repeat(k, heads // groups, axis=2), jnp.repeat(v, heads // groups, axis=2)
  logits = jnp.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(head_dim)
  t = q.shape[1]
  logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -1e9)
  return jnp.einsum("bhqt,bthk->bqhk", jax.nn.softmax(logits, axis=-1), v)


class Block(nn.Module):
  d: int

  @nn.compact
  def __call__(self, x):
    k_dim, f = self.d // H, 4 * self.d
    y = nn.RMSNorm(name="pre_attention_norm")(x)
    q = nn.DenseGeneral((H, k_dim), use_bias=False, name="q")(y)
    k = nn.DenseGeneral((G, k_dim), use_bias=False, name="k")(y)
    v = nn.DenseGeneral((G, k_dim), use_bias=False, name="v")(y)
    o = nn.DenseGeneral(self.d, axis=(-2, -1), use_bias=False, name="o")
    x = x + o(_attend(q, k, v, H, G, k_dim))
    y = nn.RMSNorm(name="pre_ffw_norm")(x)
    wi = self.param("gating_einsum", nn.initializers.normal(0.02), (2, self.d, f))
    h = nn.gelu(y @ wi[0]) * (y @ wi[1])
    return x + nn.Dense(self.d, use_bias=False, name="linear")(h)


class LinenLM(nn.Module):
  d: int

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(V, self.d, name="embedder")
    x = embed(tokens)
    for i in range(LAYERS):
      x = Block(self.d, name=f"layers_{i}")(x)
    return embed.attend(nn.RMSNorm(name="final_norm")(x))


class PortBlock(nnx.Module):
  def __init__(self, d, rngs):
    self.d, k_dim, f = d, d // H, 4 * d
    self.input_layernorm = nnx.RMSNorm(d, rngs=rngs)
    self.q_proj = nnx.Linear(d, H * k_dim, use_bias=False, rngs=rngs)
    self.k_proj = nnx.Linear(d, G * k_dim, use_bias=False, rngs=rngs)
    self.v_proj = nnx.Linear(d, G * k_dim, use_bias=False, rngs=rngs)
    self.o_proj = nnx.Linear(H * k_dim, d, use_bias=False, rngs=rngs)
    self.post_attention_layernorm = nnx.RMSNorm(d, rngs=rngs)
    self.gate_proj = nnx.Linear(d, f, use_bias=False, rngs=rngs)
    self.up_proj = nnx.Linear(d, f, use_bias=False, rngs=rngs)
    self.down_proj = nnx.Linear(f, d, use_bias=False, rngs=rngs)

  def __call__(self, x):
    b, t, _ = x.shape
    k_dim = self.d // H
    y = self.input_layernorm(x)
    q = self.q_proj(y).reshape(b, t, H, k_dim)
    k = self.k_proj(y).reshape(b, t, G, k_dim)
    v = self.v_proj(y).reshape(b, t, G, k_dim)
    x = x + self.o_proj(_attend(q, k, v, H, G, k_dim).reshape(b, t, H * k_dim))
    y = self.post_attention_layernorm(x)
    return x + self.down_proj(nnx.gelu(self.gate_proj(y)) * self.up_proj(y))


class PortLM(nnx.Module):
  def __init__(self, d, rngs):
    self.embedder = nnx.Embed(V, d, rngs=rngs)
    blocks = [PortBlock(d, rngs) for _ in range(LAYERS)]
    self.layers = nnx.List(blocks) if hasattr(nnx, "List") else blocks
    self.norm = nnx.RMSNorm(d, rngs=rngs)

  def __call__(self, tokens):
    x = self.embedder(tokens)
    for layer in self.layers:
      x = layer(x)
    return self.embedder.attend(self.norm(x))


RULES = [
  lb.checkpoint.split(
    "layers_*/gating_einsum", ["layers/*/gate_proj/kernel", "layers/*/up_proj/kernel"], axis=0
  ),
  *(
    lb.checkpoint.reshape(f"layers_*/{a}/kernel", f"layers/*/{a}_proj/kernel")
    for a in ("q", "k", "v", "o")
  ),
  lb.checkpoint.rename("layers_*/linear/kernel", "layers/*/down_proj/kernel"),
  lb.checkpoint.rename("layers_*/pre_attention_norm/scale", "layers/*/input_layernorm/scale"),
  lb.checkpoint.rename("layers_*/pre_ffw_norm/scale", "layers/*/post_attention_layernorm/scale"),
  lb.checkpoint.rename("final_norm/scale", "norm/scale"),
]


def by_hand(variables, port):
  """What a per-model converter written by hand does: index, reshape, `nnx.update`."""
  p = variables["params"]
  state = nnx.state(port)
  state["embedder"]["embedding"].value = p["embedder"]["embedding"]  # pyright: ignore
  state["norm"]["scale"].value = p["final_norm"]["scale"]  # pyright: ignore
  for i in range(LAYERS):
    src, dst = p[f"layers_{i}"], state["layers"][i]  # pyright: ignore
    dst["input_layernorm"]["scale"].value = src["pre_attention_norm"]["scale"]
    dst["post_attention_layernorm"]["scale"].value = src["pre_ffw_norm"]["scale"]
    for a in ("q", "k", "v"):
      kernel = src[a]["kernel"]
      dst[f"{a}_proj"]["kernel"].value = kernel.reshape(kernel.shape[0], -1)
    kernel = src["o"]["kernel"]
    dst["o_proj"]["kernel"].value = kernel.reshape(-1, kernel.shape[-1])
    dst["gate_proj"]["kernel"].value = src["gating_einsum"][0]
    dst["up_proj"]["kernel"].value = src["gating_einsum"][1]
    dst["down_proj"]["kernel"].value = src["linear"]["kernel"]
  nnx.update(port, state)


def main() -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--width", type=int, default=256)
  args = parser.parse_args()
  d = args.width
  tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, V)
  linen = LinenLM(d)
  variables = linen.init(jax.random.key(1), tokens)
  reference = np.asarray(linen.apply(variables, tokens))
  count = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(variables))

  def hand(port):
    by_hand(variables, port)

  def rules(port):
    lb.checkpoint.linen_to_nnx(linen, variables, port, tokens, rules=RULES)

  def evidence(port):
    lb.checkpoint.linen_to_nnx(linen, variables, port, tokens)

  cases = {"hand": hand, "rules": rules, "evidence": evidence}
  times: dict[str, list[float]] = {name: [] for name in cases}
  for r in range(args.rounds + 1):  # round 0 warms the caches up and checks every result
    for name in list(cases)[r % 3 :] + list(cases)[: r % 3]:
      port = PortLM(d, nnx.Rngs(r))
      jax.block_until_ready(nnx.state(port))
      start = time.perf_counter()
      cases[name](port)
      jax.block_until_ready(nnx.state(port))
      elapsed = time.perf_counter() - start
      if r == 0:
        np.testing.assert_allclose(port(tokens), reference, rtol=1e-4, atol=1e-4)
      else:
        times[name].append(elapsed)
  med = {name: statistics.median(t) for name, t in times.items()}
  print(
    f"{count / 1e6:.2f}M parameters, width {d}, {LAYERS} layers, {args.rounds} rounds, "
    f"jax {jax.__version__}, backend {jax.default_backend()}"
  )
  print("| conversion | median s | / hand | / rules |")
  print("|---|---:|---:|---:|")
  for name, t in med.items():
    print(f"| {name} | {t:.3f} | {t / med['hand']:.1f} | {t / med['rules']:.2f} |")


if __name__ == "__main__":
  main()
