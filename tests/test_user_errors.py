"""Errors raised by the user's own model during lazy_init/preallocate keep their type and get notes.

The notes say which module was running (Linen path inside the bridge, NNX path in the graph) and
whether plain Linen, called the way a user would, fails the same way.
"""

from __future__ import annotations

import dataclasses
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge._core import user_errors as _user_errors

X = jnp.ones((1, 2))


def notes(error):
  return "\n".join(n for n in getattr(error, "__notes__", ()) if n.startswith("loopbridge:"))


@dataclasses.dataclass(frozen=True)
class SowConfig:
  """A config object, as some Linen ports keep in a field named `sow`."""

  layers: tuple = ()


class ShadowedSow(nn.Module):
  # Shadows Module.sow on purpose (as Gemma's Linen port does), which capture_intermediates calls.
  sow: SowConfig = SowConfig()  # pyright: ignore[reportIncompatibleMethodOverride]

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


class Top(nn.Module):
  @nn.compact
  def __call__(self, x):
    return ShadowedSow()(x)


class Holder(nnx.Module):
  def __init__(self, module, **kw):
    self.llm = lb.ToNNX(module, rngs=nnx.Rngs(0), **kw)

  def __call__(self, x):
    return self.llm(x)


def test_a_field_named_sow_keeps_its_type_and_says_plain_linen_fails_too():
  with pytest.raises(TypeError, match="not callable") as info:
    lb.lazy_init(Holder(Top(), capture_intermediates=True), X, capacity=2)
  text = notes(info.value)
  assert "raised inside lb.ToNNX(Top) while it ran the Linen init" in text
  assert "Linen module 'ShadowedSow_0' (ShadowedSow) was running" in text
  assert (
    "plain Linen `Top.init(rngs, *args, capture_intermediates=True)` fails the same way" in text
  )
  assert "while lb.lazy_init ran Holder; NNX module 'llm' (ToNNX) was running" in text
  # The independent check: plain Linen does fail the same way.
  with pytest.raises(TypeError, match="not callable"):
    Top().init(__import__("jax").random.key(0), X, capture_intermediates=True)


class PicksWidth(nn.Module):
  @nn.compact
  def __call__(self, x):
    if x.shape[-1] == 5:
      raise ValueError("this model does not take 5 features")
    h = nn.Dense(2)(x[..., :2])
    self.sow("intermediates", "h", h)
    return h


def test_an_error_in_preallocate_names_the_linen_apply():
  model = lb.lazy_init(lb.ToNNX(PicksWidth(), rngs=nnx.Rngs(0)), X, capacity=2)
  with pytest.raises(ValueError, match="5 features") as info:
    lb.preallocate(model, jnp.ones((1, 5)), capacity=2)
  text = notes(info.value)
  assert "while it ran the Linen apply; Linen module '<top>' (PicksWidth) was running" in text
  assert "plain Linen `PicksWidth.apply(variables, *args)` fails the same way" in text


class OnlyUnderLoopbridge(nn.Module):
  """Fails when 'intermediates' is mutable at init, which plain `init` never makes it."""

  @nn.compact
  def __call__(self, x):
    if self.is_initializing() and self.is_mutable_collection("intermediates"):
      raise RuntimeError("intermediates are mutable")
    return nn.Dense(2)(x)


def test_when_plain_linen_succeeds_the_note_says_loopbridge_is_involved():
  with pytest.raises(RuntimeError, match="intermediates are mutable") as info:
    lb.lazy_init(lb.ToNNX(OnlyUnderLoopbridge(), rngs=nnx.Rngs(0)), X, capacity=2)
  assert "plain Linen `OnlyUnderLoopbridge.init(rngs, *args)` succeeds" in notes(info.value)


def test_an_error_in_native_code_names_the_nnx_module():
  class Broken(nnx.Module):
    def __call__(self, x):
      raise KeyError("missing")

  class Root(nnx.Module):
    def __init__(self):
      self.part = lb.ToNNX(PicksWidth(), rngs=nnx.Rngs(0))
      self.head = Broken()

    def __call__(self, x):
      return self.head(self.part(x))

  with pytest.raises(KeyError) as info:
    lb.lazy_init(Root(), X, capacity=2)
  text = notes(info.value)
  assert "while lb.lazy_init ran Root; NNX module 'head' (Broken) was running" in text
  assert "inside lb.ToNNX" not in text


def test_loopbridge_errors_get_no_note():
  with pytest.raises(lb.CapacityError) as info:
    lb.lazy_init(lb.ToNNX(PicksWidth(), rngs=nnx.Rngs(0)), X)
  assert notes(info.value) == ""


def test_on_python_3_10_the_notes_list_is_filled_alike(monkeypatch):
  monkeypatch.setattr(_user_errors, "sys", types.SimpleNamespace(version_info=(3, 10)))
  error = ValueError("x")
  _user_errors.add_note(error, "first")
  _user_errors.add_note(error, "first")  # once only
  assert error.__notes__ == ["loopbridge: first"]


class DecodeLM(nn.Module):
  """flax's decode attention: its cache is sized from the input given to `init`."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(11, 8)(tokens)
    x = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8, decode=True)(x, x)
    self.sow("intermediates", "h", x)
    return nn.Dense(11)(x)


def _decoder(batch):
  model = lb.ToNNX(DecodeLM(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, jnp.zeros((batch, 6), jnp.int32), capacity=3)
  lb.preallocate(model, jnp.zeros((batch, 1), jnp.int32), capacity=3)
  return model


@pytest.mark.parametrize("entry", ["call", "jit", "preallocate"])
def test_another_batch_on_a_decode_cache_names_the_cache_its_shape_and_the_fix(entry):
  model = _decoder(1)
  step = jnp.ones((2, 1), jnp.int32)
  # The reference: plain Linen sizes the cache from init's input.
  plain = DecodeLM().init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32))
  sized = plain["cache"]["MultiHeadDotProductAttention_0"]["cached_key"].shape
  with pytest.raises(ValueError, match="Autoregressive cache shape error") as info:
    if entry == "call":
      model(step, mutable=True)
    elif entry == "jit":
      nnx.jit(lambda m, t: m(t, mutable=True))(model, step)
    else:
      lb.preallocate(model, step, capacity=3)
  text = notes(info.value)
  assert (
    "the state 'cache' was sized for batch 1 "
    f"(cache/MultiHeadDotProductAttention_0/cached_key: {sized}, " in text
  )
  assert "this call has batch 2; the same call runs with that state sized for batch 2" in text
  assert "Fix: lb.lazy_init(model, *inputs, capacity=...) again with inputs of batch 2" in text
  if entry == "preallocate":  # plain Linen called as a decoding user calls it
    assert (
      "plain Linen `DecodeLM.apply(variables, *args, mutable=['cache'])` fails the same way" in text
    )


def test_the_note_is_left_out_when_resizing_the_state_would_not_help():
  model = _decoder(1)
  with pytest.raises(ValueError) as info:  # wrong length and batch: a resized cache fails too
    model(jnp.ones((2, 7), jnp.int32), mutable=True)
  assert "sized for batch" not in notes(info.value)


def test_the_fix_in_the_note_decodes_as_plain_linen_does():
  model = _decoder(2)
  step = jnp.array([[3], [4]], jnp.int32)
  variables = lb.linen_variables(model)
  expected, _ = DecodeLM().apply(
    {"params": variables["params"], "cache": variables["cache"]}, step, mutable=["cache"]
  )
  np.testing.assert_allclose(model(step, mutable=True), expected, rtol=1e-6, atol=1e-6)
