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

from conftest import full_precision_tolerance, matmul_tolerance

D, H, G, K, F, V, LAYERS = 8, 4, 2, 4, 16, 11, 2


def _attend(q, k, v, mask=None):
  """Grouped-query attention on (batch, time, heads, head_dim) arrays; causal by default."""
  k, v = jnp.repeat(k, H // G, axis=2), jnp.repeat(v, H // G, axis=2)
  logits = jnp.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(K)
  if mask is None:
    t = q.shape[1]
    mask = jnp.tril(jnp.ones((t, t), bool))
  logits = jnp.where(mask, logits, -1e9)
  return jnp.einsum("bhqt,bthk->bqhk", jax.nn.softmax(logits, axis=-1), v)


def _step_mask(index, length):
  """The keys one decoded token sees: the cached positions up to and including its own."""
  return (jnp.arange(length) <= index)[None, :]


class Attention(nn.Module):
  decode: bool = False

  @nn.compact
  def __call__(self, x):
    q = nn.DenseGeneral((H, K), use_bias=False, name="q")(x)
    k = nn.DenseGeneral((G, K), use_bias=False, name="k")(x)
    v = nn.DenseGeneral((G, K), use_bias=False, name="v")(x)
    mask = None
    if self.decode:
      # As flax's own attention: `init` on the full length sizes the cache (and attends
      # normally); every later call writes one token at `cache_index` and attends to the cache.
      initialized = self.has_variable("cache", "cached_key")
      cached_key = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
      cached_value = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
      index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
      if initialized:
        if x.shape[1] != 1:
          raise ValueError(f"decode takes one token per call, got {x.shape[1]}")
        i = index.value
        k = jax.lax.dynamic_update_slice(cached_key.value, k, (0, i, 0, 0))
        v = jax.lax.dynamic_update_slice(cached_value.value, v, (0, i, 0, 0))
        cached_key.value, cached_value.value, index.value = k, v, i + 1
        mask = _step_mask(i, k.shape[1])
    return nn.DenseGeneral(D, axis=(-2, -1), use_bias=False, name="o")(_attend(q, k, v, mask))


class Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    wi = self.param("gating_einsum", nn.initializers.normal(0.5), (2, D, F))
    h = nn.gelu(jnp.einsum("btd,df->btf", x, wi[0])) * jnp.einsum("btd,df->btf", x, wi[1])
    return h @ self.param("linear", nn.initializers.normal(0.5), (F, D))


class Block(nn.Module):
  decode: bool = False

  @nn.compact
  def __call__(self, x):
    x = x + Attention(self.decode, name="attn")(nn.RMSNorm(name="pre_attention_norm")(x))
    return x + Mlp(name="mlp")(nn.RMSNorm(name="pre_ffw_norm")(x))


class LinenLM(nn.Module):
  decode: bool = False

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(V, D, name="embedder")
    x = embed(tokens)
    for i in range(LAYERS):
      x = Block(self.decode, name=f"layers_{i}")(x)
    return embed.attend(nn.RMSNorm(name="final_norm")(x))


def _list(items):
  return nnx.List(items) if hasattr(nnx, "List") else items


class PortAttention(nnx.Module):
  def __init__(self, rngs):
    self.q_proj = nnx.Linear(D, H * K, use_bias=False, rngs=rngs)
    self.k_proj = nnx.Linear(D, G * K, use_bias=False, rngs=rngs)
    self.v_proj = nnx.Linear(D, G * K, use_bias=False, rngs=rngs)
    self.o_proj = nnx.Linear(H * K, D, use_bias=False, rngs=rngs)

  def init_cache(self, batch, length, dtype=jnp.float32):
    """A KV cache for `length` tokens, in the port's own (flat) layout."""
    self.cached_key = nnx.Cache(jnp.zeros((batch, length, G * K), dtype))
    self.cached_value = nnx.Cache(jnp.zeros((batch, length, G * K), dtype))
    self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

  def __call__(self, x, decode=False):
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, H, K)
    k, v, mask = self.k_proj(x), self.v_proj(x), None
    if decode:
      i = self.cache_index[...]
      k = jax.lax.dynamic_update_slice(self.cached_key[...], k, (0, i, 0))
      v = jax.lax.dynamic_update_slice(self.cached_value[...], v, (0, i, 0))
      # `variable[...] = x` on flax 0.12 only; the value setter warns there.
      for variable, value in [(self.cached_key, k), (self.cached_value, v)]:
        _compat.set_variable_value(variable, value)
      _compat.set_variable_value(self.cache_index, i + 1)
      mask = _step_mask(i, k.shape[1])
    k, v = k.reshape(b, -1, G, K), v.reshape(b, -1, G, K)
    return self.o_proj(_attend(q, k, v, mask).reshape(b, t, H * K))


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

  def __call__(self, x, decode=False):
    x = x + self.attn(self.input_layernorm(x), decode)
    return x + self.mlp(self.post_attention_layernorm(x))


class PortLM(nnx.Module):
  def __init__(self, rngs):
    self.embedder = nnx.Embed(V, D, rngs=rngs)
    self.layers = _list([PortBlock(rngs) for _ in range(LAYERS)])
    self.norm = nnx.RMSNorm(D, rngs=rngs)

  def init_cache(self, batch, length):
    """Give every attention layer an empty KV cache for `length` tokens."""
    for layer in self.layers:
      layer.attn.init_cache(batch, length)

  def __call__(self, tokens, decode=False):
    x = self.embedder(tokens)
    for layer in self.layers:
      x = layer(x, decode)
    return self.embedder.attend(self.norm(x))


TOKENS = jax.random.randint(jax.random.key(0), (2, 6), 0, V)
PROMPT = jax.random.randint(jax.random.key(3), (2, 7), 0, V)
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


def _linen_decode(params, prompt):
  """Linen's own decoding: a cache from `init` on the full length, one token per `apply`."""
  decoder = LinenLM(decode=True)
  cache = decoder.init(jax.random.key(0), prompt)["cache"]
  steps = []
  for t in range(prompt.shape[1]):
    logits, updated = decoder.apply(
      {"params": params, "cache": cache}, prompt[:, t : t + 1], mutable=["cache"]
    )
    cache = updated["cache"]
    steps.append(logits)
  return steps


# Slow in both variants (~8 s each, decode steps compiled one by one): the plain run converts
# this pair in test_the_transformer_port_converts_both_ways and leaves the decode steps to the
# slow run.
@pytest.mark.slow
@pytest.mark.parametrize("rules", [None, RULES], ids=["evidence", "rules"])
def test_decode_steps_are_equal_with_a_kv_cache_on_both_sides(rules):
  # At full matmul precision, as loopbridge's own checks run: at a TPU's default (one bfloat16
  # pass) stepping and the full-sequence call of this trained-like model already differ by
  # 0.12 in plain Linen, before any conversion.
  with jax.default_matmul_precision("highest"):
    _decode_steps_are_equal(rules)


def _decode_steps_are_equal(rules):
  rtol, atol = full_precision_tolerance(1e-5, 1e-5)
  linen = LinenLM()
  variables = _trained_like(linen.init(jax.random.key(1), TOKENS))
  reference = _linen_decode(variables["params"], PROMPT)
  # The test's own decode path is a real one: stepping reproduces the full-sequence call.
  full = linen.apply(variables, PROMPT)
  np.testing.assert_allclose(jnp.concatenate(reference, axis=1), full, rtol=rtol, atol=atol)

  port = PortLM(nnx.Rngs(0))
  port.init_cache(*PROMPT.shape)  # as ports that size their cache when built
  # Without rules the split gate/up and the flat kernels are found by evidence on the plain
  # (non-decode) call; the port's cache is its own and is not a counterpart of anything.
  lb.checkpoint.linen_to_nnx(linen, variables, port, TOKENS, rules=rules)
  for t, expected in enumerate(reference):
    np.testing.assert_allclose(
      port(PROMPT[:, t : t + 1], decode=True), expected, rtol=rtol, atol=atol, err_msg=f"step {t}"
    )
  assert int(port.layers[0].attn.cache_index[...]) == PROMPT.shape[1]

  # Back, from a port whose cache is full: the params only, bit-exact; Linen decodes with them.
  back = lb.checkpoint.nnx_to_linen(port, linen, TOKENS, rules=rules)
  assert set(back) == {"params"} and _same(back, {"params": variables["params"]})
  again = _linen_decode(back["params"], PROMPT)
  for t, (got, expected) in enumerate(zip(again, reference)):
    np.testing.assert_array_equal(got, expected, err_msg=f"step {t}")


def test_a_cache_given_to_a_decode_model_runs_as_its_decode_state():
  # A decode-mode model creates a cache on the call, so the given one is the state the call
  # reads: run with it, this model refuses the 6-token sample (as Linen's own apply does).
  linen = LinenLM()
  variables = _trained_like(linen.init(jax.random.key(1), TOKENS))
  cache = LinenLM(decode=True).init(jax.random.key(0), PROMPT)["cache"]
  port = PortLM(nnx.Rngs(0))
  port.init_cache(*PROMPT.shape)
  with pytest.raises(
    lb.checkpoint.CheckpointError,
    match=r"(?s)decode takes one token per call.*The given `cache` collection ran as this "
    r"call's decode state.*leave `cache` out of the variables",
  ):
    lb.checkpoint.linen_to_nnx(
      LinenLM(decode=True), {**variables, "cache": cache}, port, TOKENS, rules=RULES
    )


def test_a_linen_cache_the_call_does_not_read_is_neither_refused_nor_converted():
  # The variables of a decode-mode `init` hold a `cache` collection next to the params; a
  # plain-mode call creates no cache, so it never reads one: left out, the port keeps its own.
  linen = LinenLM()
  variables = _trained_like(linen.init(jax.random.key(1), TOKENS))
  cache = LinenLM(decode=True).init(jax.random.key(0), PROMPT)["cache"]
  cache = jax.tree.map(lambda a: a + 1, cache)  # as after some steps: nothing to mistake for zeros
  port = PortLM(nnx.Rngs(0))
  port.init_cache(*PROMPT.shape)

  report = lb.checkpoint.linen_to_nnx(
    linen, {**variables, "cache": cache}, port, TOKENS, rules=RULES
  )
  # The report says the cache was left out, and why.
  assert report.skipped == ("cache",) and report.to_dict()["skipped"] == ["cache"]
  assert "not converted: the Linen 'cache' collection (a decode cache" in str(report)
  plain = lb.checkpoint.linen_to_nnx(linen, variables, PortLM(nnx.Rngs(0)), TOKENS, rules=RULES)
  assert plain.skipped == () and "not converted" not in str(plain)

  rtol, atol = matmul_tolerance(1e-5, 1e-5)
  np.testing.assert_allclose(port(TOKENS), linen.apply(variables, TOKENS), rtol=rtol, atol=atol)
  attn = port.layers[0].attn
  assert int(attn.cache_index[...]) == 0 and not np.asarray(attn.cached_key[...]).any()
