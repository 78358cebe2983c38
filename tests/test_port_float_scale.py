"""`lb.port.draft` of an attention that scales by a float power of a setting
(`(self.dim // self.num_heads) ** -0.5`, m3ae's and many ViTs' attention) in a block that adds
its input to a layer `emb_dim` wide. jax refuses a float power of a symbolic dimension, so the
setting could not be a symbol, and Linen ties it to the input: its widths were the sample's
number. Inside the symbolic trace such a power is a traced float (a value, never a shape).

The reference is Linen's own `init` and `apply` at widths and head counts the draft never saw.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import export
from symbolic_port_helpers import assert_equal_at, load

import loopbridge as lb
from loopbridge._compat.symbolic_initializers import symbolic_safe_initializers

pytest.importorskip("libcst")

SOURCE = """
import flax.linen as nn
import jax.numpy as jnp


class Attention(nn.Module):
  dim: int
  num_heads: int = 8

  @nn.compact
  def __call__(self, inputs):
    batch, n, channels = inputs.shape
    scale = (self.dim // self.num_heads) ** -0.5
    qkv = nn.Dense(self.dim * 3, use_bias=False)(inputs)
    qkv = jnp.reshape(qkv, (batch, n, 3, self.num_heads, channels // self.num_heads))
    q, k, v = jnp.transpose(qkv, (2, 0, 3, 1, 4))
    attention = nn.softmax((q @ jnp.swapaxes(k, -2, -1)) * scale, axis=-1)
    x = (attention @ v).swapaxes(1, 2).reshape(batch, n, channels)
    return nn.Dense(self.dim)(x)


class Block(nn.Module):
  emb_dim: int = 256
  num_heads: int = 8

  @nn.compact
  def __call__(self, inputs):
    inputs = inputs + Attention(self.emb_dim, self.num_heads)(nn.LayerNorm()(inputs))
    return inputs + nn.Dense(self.emb_dim)(nn.LayerNorm()(inputs))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("float_scale"), "float_scale_models", SOURCE)


def _x(width: int) -> jax.Array:
  return jax.random.normal(jax.random.key(0), (1, 5, width))


@pytest.fixture(scope="module")
def draft(models):
  return lb.port.draft(models.Block(8, 2), _x(8))


def test_the_widths_read_the_setting(draft):
  assert draft.ok, draft.report()
  assert not draft.literals
  assert "nnx.LayerNorm(self.emb_dim" in draft.source
  assert "nnx.Linear(self.dim, self.dim * 3" in draft.source


@pytest.mark.parametrize(("emb", "heads"), [(12, 3), (16, 2), (6, 1)])
def test_the_port_computes_linen_elsewhere(models, draft, tmp_path, emb, heads):
  assert_equal_at(draft, tmp_path, models.Block(emb, heads), _x(emb))


def _scaled():
  # A new function each time: jax caches a traced function's result by the function.
  return lambda x: x * (x.shape[-1] // 2) ** -0.5


def _shaped_by_it(x):
  return jnp.zeros((int((x.shape[-1] // 2) ** 0.5),))


def test_a_float_power_of_a_symbol_is_a_value_inside_only():
  (a,) = export.symbolic_shape("a")
  spec = jax.ShapeDtypeStruct((3, a), jnp.float32)
  with pytest.raises(ValueError, match="non-integer powers"):
    jax.eval_shape(_scaled(), spec)
  with symbolic_safe_initializers():
    assert jax.eval_shape(_scaled(), spec).shape == (3, a)
    with pytest.raises(jax.errors.ConcretizationTypeError):  # never a shape
      jax.eval_shape(_shaped_by_it, spec)
  with pytest.raises(ValueError, match="non-integer powers"):  # restored
    jax.eval_shape(_scaled(), spec)
