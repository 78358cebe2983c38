"""Conversion evidence that a degenerate sample cannot fool: probes of our own, every
assignment tried, mutable collections run as the call needs them.

Each reference is independent of the converter: the Linen model's own `apply` on fresh random
inputs (and, for decoding, Linen's own token-by-token `apply` with its cache). Every case
here was converted silently wrong, or refused with advice that did not apply, before the
evidence ran on probes, tried every assignment and ran the cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb
from loopbridge import _compat

from conftest import matmul_tolerance

D, T = 4, 5
RTOL, ATOL = matmul_tolerance(1e-5, 1e-5)
FRESH = jax.random.normal(jax.random.key(42), (2, T, D))


def _trained_like(variables):
  """Variables that are not an init's (so no test passes by two equal inits)."""
  keys = iter(jax.random.split(jax.random.key(7), 100))
  return jax.tree.map(
    lambda a: (a + jax.random.normal(next(keys), a.shape, a.dtype)).astype(a.dtype), variables
  )


# --- (a) an attention port that computes `k` before `q` -------------------------------------


class LinenAttention(nn.Module):
  @nn.compact
  def __call__(self, x):
    q, k, v = nn.Dense(D)(x), nn.Dense(D)(x), nn.Dense(D)(x)
    weights = jax.nn.softmax(q @ k.swapaxes(-1, -2) / D**0.5)
    return nn.Dense(D)(weights @ v)


class KeyFirst(nnx.Module):
  """A valid port: its own names, and `key` computed before `query`."""

  def __init__(self, rngs):
    self.query = nnx.Linear(D, D, rngs=rngs)
    self.key = nnx.Linear(D, D, rngs=rngs)
    self.value = nnx.Linear(D, D, rngs=rngs)
    self.out = nnx.Linear(D, D, rngs=rngs)

  def __call__(self, x):
    k = self.key(x)
    q = self.query(x)
    weights = jax.nn.softmax(q @ k.swapaxes(-1, -2) / D**0.5)
    return self.out(weights @ self.value(x))


def _attention_variables():
  return _trained_like(LinenAttention().init(jax.random.key(1), FRESH))


def test_identical_tokens_pair_query_and_key_by_probes():
  variables = _attention_variables()
  row = jax.random.normal(jax.random.key(3), (1, 1, D))
  sample = jnp.broadcast_to(row, (2, T, D))  # every token the same
  port = KeyFirst(nnx.Rngs(0))
  report = lb.checkpoint.linen_to_nnx(LinenAttention(), variables, port, sample)
  params = variables["params"]
  np.testing.assert_array_equal(port.query.kernel[...], params["Dense_0"]["kernel"])
  np.testing.assert_array_equal(port.key.kernel[...], params["Dense_1"]["kernel"])
  np.testing.assert_allclose(
    port(FRESH), LinenAttention().apply(variables, FRESH), rtol=RTOL, atol=ATOL
  )
  # The sample could not tell query from key: a probe did, and the report says which.
  decided = [p for p in report.placements if p.decided != "unique"]
  assert decided and all("probe" in " ".join(p.probes) for p in decided), report
  assert "probe" in str(report)


def test_one_token_cannot_tell_query_from_key_and_lists_both():
  variables = _attention_variables()
  sample = jax.random.normal(jax.random.key(3), (2, 1, D))  # one token: softmax is 1
  port = KeyFirst(nnx.Rngs(0))
  before = jax.tree.map(np.asarray, nnx.state(port))
  with pytest.raises(
    lb.checkpoint.CheckpointError,
    match=r"(?s)^(?=.*2 different conversions)"
    r"(?=.*mapping=\{'Dense_0': 'query', 'Dense_1': 'key', 'Dense_2': 'value', 'Dense_3': 'out'\})"
    r"(?=.*mapping=\{'Dense_0': 'key', 'Dense_1': 'query', 'Dense_2': 'value', 'Dense_3': 'out'\})",
  ):
    lb.checkpoint.linen_to_nnx(LinenAttention(), variables, port, sample)
  after = jax.tree.map(np.asarray, nnx.state(port))
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


def test_a_pasted_mapping_from_the_error_converts():
  variables = _attention_variables()
  sample = jax.random.normal(jax.random.key(3), (2, 1, D))
  port = KeyFirst(nnx.Rngs(0))
  mapping = {"Dense_0": "query", "Dense_1": "key", "Dense_2": "value", "Dense_3": "out"}
  lb.checkpoint.linen_to_nnx(LinenAttention(), variables, port, sample, mapping=mapping)
  np.testing.assert_allclose(
    port(FRESH), LinenAttention().apply(variables, FRESH), rtol=RTOL, atol=ATOL
  )


# --- (b) a square kernel stored transposed, converted on zeros ------------------------------


class Transposed(nnx.Module):
  """`x @ W.T`: the kernel stored as PyTorch stores it, square."""

  def __init__(self):
    self.weight = nnx.Param(jnp.zeros((D, D)))
    self.bias = nnx.Param(jnp.zeros(D))

  def __call__(self, x):
    return x @ self.weight[...].T + self.bias[...]


def test_a_transposed_square_kernel_is_never_accepted_wrong_on_zeros():
  variables = _trained_like(nn.Dense(D).init(jax.random.key(1), FRESH))
  port = Transposed()
  report = lb.checkpoint.linen_to_nnx(nn.Dense(D), variables, port, jnp.zeros((2, T, D)))
  np.testing.assert_array_equal(port.weight[...], variables["params"]["kernel"].T)
  np.testing.assert_allclose(port(FRESH), nn.Dense(D).apply(variables, FRESH), rtol=RTOL, atol=ATOL)
  (placement,) = report.placements
  assert placement.transforms == ("lb.checkpoint.transpose('kernel', 'weight', axes=(1, 0))",)
  assert "sample" not in placement.probes


class Plain(nnx.Module):
  def __init__(self):
    self.weight = nnx.Param(jnp.zeros((D, D)))
    self.bias = nnx.Param(jnp.zeros(D))

  def __call__(self, x):
    return x @ self.weight[...] + self.bias[...]


def test_an_untransposed_square_kernel_still_converts_on_zeros():
  variables = _trained_like(nn.Dense(D).init(jax.random.key(1), FRESH))
  port = Plain()
  lb.checkpoint.linen_to_nnx(nn.Dense(D), variables, port, jnp.zeros((2, T, D)))
  np.testing.assert_array_equal(port.weight[...], variables["params"]["kernel"])


# --- (c) a model with its own decode cache, converted mid-sequence --------------------------

L = 6  # the cache's length (init on the full length, as decoding code does)


def _step_mask(index, length):
  return (jnp.arange(length) <= index)[None, :]


class CachedAttention(nn.Module):
  """flax's decode idiom: `init` on the full length sizes the cache; every later call writes
  one token at `cache_index` and attends to the cache."""

  decode: bool = False

  @nn.compact
  def __call__(self, x):
    q, k, v = (nn.Dense(D, name=n)(x) for n in ("query", "key", "value"))
    t = x.shape[1]
    mask = jnp.tril(jnp.ones((t, t), bool))
    if self.decode:
      initialized = self.has_variable("cache", "cached_key")
      cached_key = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
      cached_value = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
      index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
      if initialized:
        i = index.value
        k = jax.lax.dynamic_update_slice(cached_key.value, k, (0, i, 0))
        v = jax.lax.dynamic_update_slice(cached_value.value, v, (0, i, 0))
        cached_key.value, cached_value.value, index.value = k, v, i + 1
        mask = _step_mask(i, k.shape[1])
    logits = jnp.where(mask, q @ k.swapaxes(-1, -2) / D**0.5, -1e9)
    return nn.Dense(D, name="out")(jax.nn.softmax(logits) @ v)


class PortCached(nnx.Module):
  """A decoding port: its own names, `k` computed first, a cache sized when built."""

  def __init__(self, batch, length, rngs):
    self.q = nnx.Linear(D, D, rngs=rngs)
    self.k = nnx.Linear(D, D, rngs=rngs)
    self.v = nnx.Linear(D, D, rngs=rngs)
    self.o = nnx.Linear(D, D, rngs=rngs)
    self.cached_key = nnx.Cache(jnp.zeros((batch, length, D)))
    self.cached_value = nnx.Cache(jnp.zeros((batch, length, D)))
    self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

  def __call__(self, x):
    i = self.cache_index[...]
    k = jax.lax.dynamic_update_slice(self.cached_key[...], self.k(x), (0, i, 0))
    q = self.q(x)
    v = jax.lax.dynamic_update_slice(self.cached_value[...], self.v(x), (0, i, 0))
    for variable, value in [(self.cached_key, k), (self.cached_value, v)]:
      _compat.set_variable_value(variable, value)
    _compat.set_variable_value(self.cache_index, i + 1)
    logits = jnp.where(_step_mask(i, k.shape[1]), q @ k.swapaxes(-1, -2) / D**0.5, -1e9)
    return self.o(jax.nn.softmax(logits) @ v)


def test_a_model_with_its_own_cache_converts_mid_sequence_and_decodes_equal():
  tokens = jax.random.normal(jax.random.key(5), (2, L, D))
  decoder = CachedAttention(decode=True)
  init = decoder.init(jax.random.key(1), tokens)
  params, cache = _trained_like(init["params"]), init["cache"]
  # Linen decodes the first three tokens; the conversion happens there, mid-sequence.
  steps = []
  for t in range(L):
    out, updated = decoder.apply(
      {"params": params, "cache": cache}, tokens[:, t : t + 1], mutable=["cache"]
    )
    steps.append((cache, out))
    cache = updated["cache"]
  # Linen's own decode path is a real one: stepping reproduces the full causal call.
  full = CachedAttention().apply({"params": params}, tokens)
  np.testing.assert_allclose(
    jnp.concatenate([o for _, o in steps], axis=1), full, rtol=RTOL, atol=ATOL
  )

  mid, _ = steps[3]
  port = PortCached(2, L, nnx.Rngs(0))
  report = lb.checkpoint.linen_to_nnx(
    decoder, {"params": params, "cache": mid}, port, tokens[:, 3:4]
  )
  assert "cache" not in report.skipped
  assert int(port.cache_index[...]) == 3
  np.testing.assert_array_equal(port.cached_key[...], mid["cached_key"])
  for t in range(3, L):
    np.testing.assert_allclose(
      port(tokens[:, t : t + 1]), steps[t][1], rtol=RTOL, atol=ATOL, err_msg=f"step {t}"
    )
  np.testing.assert_array_equal(port.q.kernel[...], params["query"]["kernel"])


# --- a port holding a value that cannot be a jit static argument -----------------------------


class ListHolder(nnx.Module):
  """A port keeping a list in an attribute (a drafted `default_factory` field, an HF config):
  its graph definition cannot be hashed, so the evidence's compiled run is not possible."""

  def __init__(self, rngs):
    self.widths = [D, D]  # a list: unhashable
    self.dense = nnx.Linear(D, D, rngs=rngs)

  def __call__(self, x):
    return self.dense(x)


def test_a_port_holding_an_unhashable_attribute_converts():
  class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(D)(x)

  x = jax.random.normal(jax.random.key(0), (2, D))
  variables = _trained_like(Linen().init(jax.random.key(1), x))
  port = ListHolder(nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(Linen(), variables, port, (x,))
  fresh = jax.random.normal(jax.random.key(3), (2, D))
  np.testing.assert_allclose(port(fresh), Linen().apply(variables, fresh), rtol=RTOL, atol=ATOL)
