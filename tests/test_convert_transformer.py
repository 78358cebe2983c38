"""A transformer-shaped Linen model and a hand port that restructures its arrays.

Linen keeps a fused gate/up projection `[2, D, F]` and `DenseGeneral` attention kernels
`(D, H, K)`; the port (written as people write them) has split `gate_proj` / `up_proj`
Linears, flat `(D, H*K)` kernels, grouped-query attention, and two norms of equal shapes per
block under other names. References: the Linen model's own `apply`, and a Linen optax step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb
from loopbridge import _compat

D, H, G, K, F, V, LAYERS = 8, 4, 2, 4, 16, 11, 2


def _attend(q, k, v):
  """Causal grouped-query attention on (batch, time, heads, head_dim) arrays."""
  k, v = jnp.repeat(k, H // G, axis=2), jnp.repeat(v, H // G, axis=2)
  logits = jnp.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(K)
  t = q.shape[1]
  logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -1e9)
  return jnp.einsum("bhqt,bthk->bqhk", jax.nn.softmax(logits, axis=-1), v)


class Attention(nn.Module):
  @nn.compact
  def __call__(self, x):
    q = nn.DenseGeneral((H, K), use_bias=False, name="q")(x)
    k = nn.DenseGeneral((G, K), use_bias=False, name="k")(x)
    v = nn.DenseGeneral((G, K), use_bias=False, name="v")(x)
    return nn.DenseGeneral(D, axis=(-2, -1), use_bias=False, name="o")(_attend(q, k, v))


class Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    wi = self.param("gating_einsum", nn.initializers.normal(0.5), (2, D, F))
    h = nn.gelu(jnp.einsum("btd,df->btf", x, wi[0])) * jnp.einsum("btd,df->btf", x, wi[1])
    return h @ self.param("linear", nn.initializers.normal(0.5), (F, D))


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = x + Attention(name="attn")(nn.RMSNorm(name="pre_attention_norm")(x))
    return x + Mlp(name="mlp")(nn.RMSNorm(name="pre_ffw_norm")(x))


class LinenLM(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(V, D, name="embedder")
    x = embed(tokens)
    for i in range(LAYERS):
      x = Block(name=f"layers_{i}")(x)
    return embed.attend(nn.RMSNorm(name="final_norm")(x))


def _list(items):
  return nnx.List(items) if hasattr(nnx, "List") else items


class PortAttention(nnx.Module):
  def __init__(self, rngs):
    self.q_proj = nnx.Linear(D, H * K, use_bias=False, rngs=rngs)
    self.k_proj = nnx.Linear(D, G * K, use_bias=False, rngs=rngs)
    self.v_proj = nnx.Linear(D, G * K, use_bias=False, rngs=rngs)
    self.o_proj = nnx.Linear(H * K, D, use_bias=False, rngs=rngs)

  def __call__(self, x):
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, H, K)
    k = self.k_proj(x).reshape(b, t, G, K)
    v = self.v_proj(x).reshape(b, t, G, K)
    return self.o_proj(_attend(q, k, v).reshape(b, t, H * K))


class PortMlp(nnx.Module):
  def __init__(self, rngs):
    self.gate_proj = nnx.Linear(D, F, use_bias=False, rngs=rngs)
    self.up_proj = nnx.Linear(D, F, use_bias=False, rngs=rngs)
    self.down_proj = nnx.Linear(F, D, use_bias=False, rngs=rngs)

  def __call__(self, x):
    return self.down_proj(nnx.gelu(self.gate_proj(x)) * self.up_proj(x))


class PortBlock(nnx.Module):
  def __init__(self, rngs):
    # Created in the other order than they are called: neither name nor creation pairs them.
    self.post_attention_layernorm = nnx.RMSNorm(D, rngs=rngs)
    self.input_layernorm = nnx.RMSNorm(D, rngs=rngs)
    self.attn = PortAttention(rngs)
    self.mlp = PortMlp(rngs)

  def __call__(self, x):
    x = x + self.attn(self.input_layernorm(x))
    return x + self.mlp(self.post_attention_layernorm(x))


class PortLM(nnx.Module):
  def __init__(self, rngs):
    self.embedder = nnx.Embed(V, D, rngs=rngs)
    self.layers = _list([PortBlock(rngs) for _ in range(LAYERS)])
    self.norm = nnx.RMSNorm(D, rngs=rngs)

  def __call__(self, tokens):
    x = self.embedder(tokens)
    for layer in self.layers:
      x = layer(x)
    return self.embedder.attend(self.norm(x))


TOKENS = jax.random.randint(jax.random.key(0), (2, 6), 0, V)
RULES = [
  lb.checkpoint.split(
    "layers_*/mlp/gating_einsum",
    ["layers/*/mlp/gate_proj/kernel", "layers/*/mlp/up_proj/kernel"],
    axis=0,
  ),
  lb.checkpoint.rename("layers_*/mlp/linear", "layers/*/mlp/down_proj/kernel"),
  lb.checkpoint.reshape("layers_*/attn/q/kernel", "layers/*/attn/q_proj/kernel"),
  lb.checkpoint.reshape("layers_*/attn/k/kernel", "layers/*/attn/k_proj/kernel"),
  lb.checkpoint.reshape("layers_*/attn/v/kernel", "layers/*/attn/v_proj/kernel"),
  lb.checkpoint.reshape("layers_*/attn/o/kernel", "layers/*/attn/o_proj/kernel"),
]


def _trained_like(variables):
  keys = iter(jax.random.split(jax.random.key(7), 100))
  return jax.tree.map(lambda a: a + 0.3 * jax.random.normal(next(keys), a.shape), variables)


def _same(a, b) -> bool:
  return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
    x.dtype == y.dtype and bool((np.asarray(x) == np.asarray(y)).all())
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


CLOSE = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "rules", [pytest.param(None, marks=pytest.mark.slow), RULES], ids=["evidence", "rules"]
)
def test_the_transformer_port_converts_both_ways(rules):
  linen = LinenLM()
  variables = _trained_like(linen.init(jax.random.key(1), TOKENS))
  port = PortLM(nnx.Rngs(0))

  report = lb.checkpoint.linen_to_nnx(linen, variables, port, TOKENS, rules=rules)

  np.testing.assert_allclose(port(TOKENS), linen.apply(variables, TOKENS), **CLOSE)
  # Another call signature (a longer sequence, one decode-like row): still equal.
  other = jax.random.randint(jax.random.key(5), (1, 9), 0, V)
  np.testing.assert_allclose(port(other), linen.apply(variables, other), **CLOSE)
  params = variables["params"]["layers_1"]
  np.testing.assert_array_equal(
    port.layers[1].mlp.up_proj.kernel[...], params["mlp"]["gating_einsum"][1]
  )
  np.testing.assert_array_equal(
    port.layers[1].attn.k_proj.kernel[...], params["attn"]["k"]["kernel"].reshape(D, G * K)
  )
  scale = port.layers[1].post_attention_layernorm.scale
  assert scale is not None
  np.testing.assert_array_equal(scale[...], params["pre_ffw_norm"]["scale"])
  by_linen = {p.linen: p for p in report.placements}
  mlp = by_linen["layers_0/mlp"]
  assert mlp.checked == "module"
  assert mlp.how == ("rule" if rules else "shapes")
  assert (mlp.decided, mlp.candidates) == (("unique", 1) if rules else ("module", 2))

  back = lb.checkpoint.nnx_to_linen(port, linen, TOKENS, rules=rules)
  assert _same(back, variables)


@pytest.mark.slow
def test_one_more_optax_step_is_equal():
  linen, tx = LinenLM(), optax.adam(1e-2)
  variables = _trained_like(linen.init(jax.random.key(1), TOKENS))

  def linen_loss(params):
    return jnp.mean(linen.apply({"params": params}, TOKENS) ** 2)

  params = variables["params"]
  opt_state = tx.init(params)
  updates, opt_state = tx.update(jax.grad(linen_loss)(params), opt_state, params)
  params = optax.apply_updates(params, updates)

  port = PortLM(nnx.Rngs(0))
  optimizer = nnx.Optimizer(port, tx, wrt=nnx.Param)
  lb.checkpoint.linen_to_nnx(
    linen, {"params": params}, port, TOKENS, opt_state=opt_state, optimizer=optimizer
  )
  back, back_opt = lb.checkpoint.nnx_to_linen(port, linen, TOKENS, optimizer=optimizer)
  assert _same(back["params"], params) and _same(back_opt, opt_state)

  updates, opt_state = tx.update(jax.grad(linen_loss)(params), opt_state, params)
  params = optax.apply_updates(params, updates)
  grads = nnx.grad(lambda m: jnp.mean(m(TOKENS) ** 2))(port)
  _compat.optimizer_update(optimizer, port, grads)

  np.testing.assert_allclose(port(TOKENS), linen.apply({"params": params}, TOKENS), **CLOSE)
  np.testing.assert_allclose(
    port.layers[0].mlp.gate_proj.kernel[...],
    params["layers_0"]["mlp"]["gating_einsum"][0],
    **CLOSE,
  )
