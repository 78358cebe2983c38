"""The symbolic trace keeps concrete only the settings no symbol can stand for, one at a time:
a config object whose one attribute drives Python control flow keeps its other attributes
symbolic, input axes the model adds together share a symbol, and a setting a check asserts
divisible by a concrete one is traced as a multiple of that one's value.

The reference is Linen's own `apply` at a configuration the draft never traced.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from symbolic_port_helpers import RTOL, assert_equal_at, load

import loopbridge as lb

SOURCE = """
import copy

import flax.linen as nn
import jax.numpy as jnp


class Config:
  '''A config object as HuggingFace writes one: no dataclass, rebuilt from its own dict,
  which is a deep copy of its attributes.'''

  def __init__(self, vocab=11, positions=16, hidden=8, mlp=12, layers=2):
    self.vocab = vocab
    self.positions = positions
    self.hidden = hidden
    self.mlp = mlp
    self.layers = layers

  def to_dict(self):
    return copy.deepcopy(self.__dict__)


class Block(nn.Module):
  config: Config

  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(self.config.mlp)(x))
    return x + nn.Dense(self.config.hidden)(h)


class Stack(nn.Module):
  config: Config

  @nn.compact
  def __call__(self, ids, positions):
    c = self.config
    # The two embeddings are added: `ids` and `positions` have the same (batch, length).
    x = nn.Embed(c.vocab, c.hidden)(ids) + nn.Embed(c.positions, c.hidden)(positions)
    for _ in range(c.layers):  # Python control flow: no symbol passes `range`
      x = Block(c)(x)
    return nn.LayerNorm()(x)


class Heads(nn.Module):
  hidden: int = 8
  heads: int = 2

  @nn.compact
  def __call__(self, x):
    if self.hidden % self.heads:
      raise ValueError("hidden must be a multiple of heads")
    h = nn.Dense(self.hidden)(x)
    for _ in range(self.heads):  # Python control flow: `heads` stays concrete
      h = h + nn.Dense(self.hidden)(nn.relu(h))
    return h.reshape(*h.shape[:-1], self.heads, h.shape[-1] // self.heads).mean(-2)
"""

B, T = 2, 5


def _ids(vocab: int, positions: int) -> tuple[jax.Array, jax.Array]:
  ids = jax.random.randint(jax.random.key(0), (B, T), 0, vocab)
  return ids, jax.numpy.broadcast_to(jax.numpy.arange(T) % positions, (B, T))


def _concrete(found) -> list[str]:
  return [c.source() if hasattr(c, "source") else c.label() for c in found.concrete]


def test_one_config_attribute_in_control_flow_leaves_the_others_symbolic(tmp_path):
  """`range(config.layers)`: only `layers` is concrete; `hidden`, `mlp`, `vocab` and
  `positions` are symbols, read through the config object's own dict (before: its attributes
  holding symbols were not read, a deep copy of a symbol not comparing equal to it, so no
  width was written from them)."""
  from loopbridge._port.records import Call
  from loopbridge._port.trace.tracing.expressions import reads, written
  from loopbridge._port.trace.tracing.symbolic import symbolic_trace

  m = load(tmp_path, "symbolic_config_flow", SOURCE)
  found = symbolic_trace(m.Stack(m.Config()), Call(*_ids(11, 16)), (), 0)
  assert found is not None
  assert _concrete(found) == ["self.config.layers"]
  block = found.trace.instances[("Block_1",)]
  kernel = found.trace.instances[("Block_1", "Dense_0")].variables[("params", "kernel")].shape
  assert written(kernel, reads(block.module)) == "(self.config.hidden, self.config.mlp)"


@pytest.mark.slow  # a draft and its checks at several configurations
def test_a_config_object_drafts_equal_to_linen_at_another_configuration(tmp_path):
  m = load(tmp_path, "symbolic_config_draft", SOURCE)
  draft = lb.port.draft(m.Stack(m.Config()), *_ids(11, 16))
  assert draft.ok, draft.report()
  assert not draft.literals, [str(b) for b in draft.literals]
  assert "self.config.mlp" in draft.source
  # Independent reference: Linen's apply of a configuration the draft never traced.
  other = m.Stack(m.Config(vocab=13, positions=7, hidden=6, mlp=10, layers=3))
  ids = _ids(13, 7)
  variables = other.init(jax.random.key(1), *ids)
  module = load(tmp_path, "symbolic_config_port", draft.source)
  port = module.Stack(other.config, rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(other, variables, port, *ids)
  np.testing.assert_allclose(port(*ids), other.apply(variables, *ids), rtol=RTOL, atol=1e-5)


def test_a_setting_asserted_divisible_by_a_concrete_one_is_its_multiple(tmp_path):
  """`hidden % heads` checked, `heads` in `range`: `hidden` is traced as `heads`' value
  times a symbol, which the check passes (before: `hidden` kept concrete too)."""
  from loopbridge._port.records import Call
  from loopbridge._port.trace.tracing.symbolic import symbolic_trace

  m = load(tmp_path, "symbolic_divisible", SOURCE)
  found = symbolic_trace(m.Heads(), Call(jax.numpy.ones((2, 6))), (), 0)
  assert found is not None
  assert [c.source() for c in found.concrete_settings()] == ["self.heads"]
  hidden = next(v for c, v in found.bound.items() if getattr(c, "location", None))
  assert str(hidden).startswith("2*")  # the sample's `heads` times the symbol


@pytest.mark.slow  # a draft and its checks at several configurations
def test_a_divisible_setting_drafts_equal_to_linen_at_another_configuration(tmp_path):
  m = load(tmp_path, "symbolic_divisible_draft", SOURCE)
  x = jax.random.normal(jax.random.key(0), (2, 6))
  draft = lb.port.draft(m.Heads(), x)
  assert draft.ok, draft.report()
  assert not draft.literals, [str(b) for b in draft.literals]
  assert_equal_at(draft, tmp_path, m.Heads(hidden=15, heads=3), x)


def test_an_attention_input_width_is_a_multiple_of_its_size_and_no_concrete_setting():
  """flax's attention asserts its width divisible by a literal `num_heads`, and its
  `DenseGeneral` flattens kernel shapes with `np.prod` and `int`: the input width is traced as
  its own size times a symbol, and every projection's kernel is an expression of it."""
  import flax.linen as nn
  from flax.linen import linear

  from loopbridge._port.records import Call
  from loopbridge._port.trace.tracing.symbolic import InputAxis, symbolic_trace

  class Attend(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.SelfAttention(num_heads=2)(x, deterministic=True)

  globals_before = (vars(linear)["np"], "int" in vars(linear))
  found = symbolic_trace(Attend(), Call(jax.numpy.ones((2, 3, 4))), (), 0)
  assert (vars(linear)["np"], "int" in vars(linear)) == globals_before  # as it was
  assert found is not None and found.concrete == ()
  width = found.bound[InputAxis(0, 2, 4)]
  assert str(width).startswith("4*")
  kernel = found.trace.instances[("SelfAttention_0", "query")].variables[("params", "kernel")]
  assert kernel.shape[0] == width and tuple(kernel.shape[1:]) == (2, 2 * width // 4)


NIN_SOURCE = """
import flax.linen as nn
import jax.numpy as jnp


class NIN(nn.Module):
  '''score_sde's network-in-network layer: its own param, sized by `int(x.shape[-1])`.'''

  num_units: int = 5

  @nn.compact
  def __call__(self, x):
    in_dim = int(x.shape[-1])
    w = self.param("W", nn.initializers.lecun_normal(), (in_dim, self.num_units))
    return jnp.einsum("...c,cd->...d", x, w)
"""


@pytest.mark.slow  # a draft and its checks
def test_a_width_the_model_reads_through_int_is_the_inputs_width(tmp_path):
  """`int(x.shape[-1])` of a symbolic width stays the symbol in the user's module (while the
  symbolic trace runs): the param is `(x_features, self.num_units)`, right at another width."""
  from loopbridge._port.records import Call
  from loopbridge._port.trace.tracing.symbolic import symbolic_trace

  m = load(tmp_path, "symbolic_nin", NIN_SOURCE)
  x = jax.random.normal(jax.random.key(0), (2, 3, 4))
  found = symbolic_trace(m.NIN(), Call(x), (), 0)
  assert found is not None and found.concrete == ()
  assert m.int is int if hasattr(m, "int") else "int" not in vars(m)  # the module as it was
  draft = lb.port.draft(m.NIN(), x)
  assert draft.ok, draft.report()
  assert draft.init_kwargs == {"num_units": 5, "x_features": 4}
  for units, width in ((5, 4), (3, 7)):
    other, wide = m.NIN(num_units=units), jax.random.normal(jax.random.key(1), (2, 3, width))
    namespace: dict = {}
    exec(compile(draft.source, "port.py", "exec"), namespace)
    port = namespace["NIN"](num_units=units, x_features=width, rngs=nnx.Rngs(0))
    variables = other.init(jax.random.key(2), wide)
    lb.checkpoint.linen_to_nnx(other, variables, port, wide)
    np.testing.assert_allclose(port(wide), other.apply(variables, wide), rtol=RTOL, atol=1e-5)
