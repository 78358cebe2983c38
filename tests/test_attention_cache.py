"""Flax attention caches too short for the declared loop warn (`lb.CacheLengthWarning`).

`nn.MultiHeadDotProductAttention(decode=True)` sizes its cache from the input given to `init`.
Initialized on one token it holds one position, and decoding past it goes on silently with
wrong tokens; these tests pin that `lazy_init`/`preallocate` say so, with both numbers and the
fix, and stay quiet for a cache that fits (warnings are errors in this suite).
"""

from __future__ import annotations

import re
import warnings

import flax.linen as nn
import jax.numpy as jnp
from flax import nnx

import loopbridge as lb

LENGTH, WIDTH = 6, 8


class DecodeLM(nn.Module):
  """Embedding, flax's own decode attention, a sow, logits."""

  sow_hidden: bool = True

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(16, WIDTH)(tokens)
    x = nn.MultiHeadDotProductAttention(num_heads=2, decode=True)(x)
    if self.sow_hidden:
      self.sow("intermediates", "hidden", x)
    return nn.Dense(16)(x)


class Root(nnx.Module):
  """An NNX model with the decoder as a bridged part."""

  def __init__(self):
    self.lm = lb.ToNNX(DecodeLM(), rngs=nnx.Rngs(0))

  def __call__(self, tokens):
    return self.lm(tokens, mutable=["cache"])


def _cache_warning(fn, *args, **kwargs) -> str:
  """The one CacheLengthWarning `fn` emits. Recorded rather than `pytest.warns`, which would
  re-raise unrelated deprecation warnings of jax internals (flax 0.10 decode attention under
  `eval_shape`) as if they came from this file."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fn(*args, **kwargs)
  found = [str(w.message) for w in caught if issubclass(w.category, lb.CacheLengthWarning)]
  assert len(found) == 1, found
  return found[0]


def _tokens(length):
  return jnp.zeros((1, length), jnp.int32)


def test_one_token_init_with_larger_capacity_warns_with_both_numbers():
  model = lb.ToNNX(DecodeLM(), rngs=nnx.Rngs(0))
  message = _cache_warning(lb.lazy_init, model, _tokens(1), capacity=5)
  assert re.search(
    r"lb\.lazy_init: the attention cache "
    r"'MultiHeadDotProductAttention_0/cached_key' holds 1 position\(s\).*"
    r"capacity 5 is declared.*Fix: initialize on the full length",
    message,
  ), message


def test_one_token_init_warns_even_when_capacity_fits():
  """Capacity 1 fits a length-1 cache, but a length-1 cache is the one-token init trap."""
  model = lb.ToNNX(DecodeLM(), rngs=nnx.Rngs(0))
  message = _cache_warning(lb.lazy_init, model, _tokens(1), capacity=1)
  assert re.search(
    r"has length 1 .*initialized on a single "
    r"token.*lb\.preallocate\(model, tokens\[:, :1\], capacity=N\)",
    message,
  ), message


def test_one_token_init_of_a_model_that_never_sows_warns():
  model = lb.ToNNX(DecodeLM(sow_hidden=False), rngs=nnx.Rngs(0))
  message = _cache_warning(lb.lazy_init, model, _tokens(1))
  assert re.search("has length 1", message), message


def test_full_length_init_and_fitting_capacity_are_quiet():
  model = lb.ToNNX(DecodeLM(), rngs=nnx.Rngs(0))
  with warnings.catch_warnings():
    warnings.simplefilter("error", lb.CacheLengthWarning)
    lb.lazy_init(model, _tokens(LENGTH), capacity=LENGTH)
    lb.preallocate(model, _tokens(1), capacity=LENGTH)
  assert lb.buffers(model)["intermediates"]["hidden"].shape == (LENGTH, 1, 1, WIDTH)


def test_preallocate_past_the_cache_warns():
  model = lb.ToNNX(DecodeLM(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, _tokens(LENGTH), capacity=LENGTH)
  message = _cache_warning(lb.preallocate, model, _tokens(1), capacity=LENGTH + 3)
  assert re.search(
    rf"lb\.preallocate: .* holds {LENGTH} position\(s\) \(cached_key "
    rf"\(1, {LENGTH}, 2, 4\).*capacity {LENGTH + 3} is declared",
    message,
  ), message


def test_cache_of_a_bridged_part_is_named_by_its_path_from_the_root():
  root = Root()
  message = _cache_warning(lb.lazy_init, root, _tokens(1), capacity=4)
  assert re.search(
    r"'lm/MultiHeadDotProductAttention_0/cached_key' holds 1 .*"
    r"declared for 'lm'",
    message,
  ), message


def test_per_path_capacity_uses_the_largest_of_the_part():
  model = lb.ToNNX(DecodeLM(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, _tokens(LENGTH), capacity=LENGTH)
  message = _cache_warning(lb.preallocate, model, _tokens(1), capacity={"hidden": LENGTH + 1})
  assert re.search(f"capacity {LENGTH + 1} is declared", message), message
