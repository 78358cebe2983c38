"""Drafting the idioms of flax's own `examples/` (nlp_seq, seq2seq, sst2), each on a small Linen
model written the way the example writes it, checked against Linen's own apply."""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import loopbridge as lb

pytest.importorskip("libcst")


def _equal_to_linen(draft, *args, **kwargs):
  """The drafted port, holding the Linen variables, computes Linen's own apply."""
  port, variables = draft.port_and_variables()
  want = draft.linen_module.apply(variables, *args, **kwargs)
  got = port(*args, **kwargs)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got, want)


class Block(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(self.features)(x)


class StackOfBlocks(nn.Module):
  """nlp_seq's tagger: `for _ in range(n): x = Encoder1DBlock(config)(x)` in a compact method,
  so the layers are `Block_0`, `Block_1`, ... and their list is named after the class."""

  features: int = 4
  num_layers: int = 2

  @nn.compact
  def __call__(self, x):
    for _ in range(self.num_layers):
      x = Block(self.features)(x)
    return nn.Dense(3)(x)


def test_a_loop_of_user_blocks_in_a_compact_method_nlp_seq():
  """The list `__init__` fills is not a local named after the class it builds (that hid the
  class: `'list' object is not callable`)."""
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(StackOfBlocks(), x)
  assert draft.ok, draft.report()
  _equal_to_linen(draft, x)


class ScannedLSTM(nn.Module):
  """sst2's SimpleLSTM: the method is scanned by a decorator; `initialize_carry` builds a
  detached cell (parent=None) only for its carry."""

  hidden_size: int

  @functools.partial(
    nn.transforms.scan,
    variable_broadcast="params",
    in_axes=1,
    out_axes=1,
    split_rngs={"params": False},
  )
  @nn.compact
  def __call__(self, carry, x):
    return nn.OptimizedLSTMCell(self.hidden_size)(carry, x)

  def initialize_carry(self, input_shape):
    return nn.OptimizedLSTMCell(self.hidden_size, parent=None).initialize_carry(
      jax.random.key(0), input_shape
    )


class BiLSTM(nn.Module):
  hidden_size: int = 5

  def setup(self):
    self.forward_lstm = ScannedLSTM(self.hidden_size)
    self.backward_lstm = ScannedLSTM(self.hidden_size)

  def __call__(self, x):
    carry = self.forward_lstm.initialize_carry(x[:, 0].shape)
    _, forward = self.forward_lstm(carry, x)
    carry = self.backward_lstm.initialize_carry(x[:, 0].shape)
    _, backward = self.backward_lstm(carry, x[:, ::-1])
    return jnp.concatenate([forward, backward], -1)


def test_a_method_scanned_by_a_decorator_and_a_detached_cell_s_carry_sst2():
  """`@partial(nn.transforms.scan, variable_broadcast='params', ...)` over a method becomes
  `nnx.scan` over its body; `Cell(..., parent=None).initialize_carry(rng, shape)` NNX's
  `initialize_carry(shape, rngs)` of an NNX cell given its input width."""
  x = jax.random.normal(jax.random.key(0), (2, 6, 3))
  # Drafted without the draft's own check, compared here with Linen's apply (compiling the
  # scans dominates the check); the slow test below runs the draft's full check.
  draft = lb.port.draft(BiLSTM(), x, check=False)
  assert not draft.todos, draft.report()
  assert "nn.transforms.scan" not in draft.source and "nn.Optimized" not in draft.source
  assert "nnx.scan(" in draft.source
  _equal_to_linen(draft, x)


@pytest.mark.slow
def test_a_method_scanned_by_a_decorator_is_a_port_of_the_class_sst2():
  x = jax.random.normal(jax.random.key(0), (2, 6, 3))
  draft = lb.port.draft(BiLSTM(), x)
  assert draft.ok, draft.report()
  assert draft.configs, "no derived configuration was traced"
  _equal_to_linen(draft, x)


class StackedPerStep(nn.Module):
  @functools.partial(
    nn.scan, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=0, length=3
  )
  @nn.compact
  def __call__(self, carry, x):
    return nn.Dense(carry.shape[-1])(carry), x


class UsesStackedPerStep(nn.Module):
  @nn.compact
  def __call__(self, x):
    return StackedPerStep()(x, jnp.ones((3, 1)))


def test_a_scanned_method_the_draft_does_not_translate_is_a_todo_naming_the_option():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(UsesStackedPerStep(), x)
  assert not draft.ok
  (todo,) = draft.todos
  assert "length=" in todo.reason or "variable_axes" in todo.reason, todo.reason
  assert "nn.scan" not in draft.source.split("TODO(port)")[0]  # no Linen transform left


class HeldCell(nn.Module):
  """A cell the module holds, its first carry from Linen's `initialize_carry(rng, shape)`."""

  features: int = 4

  def setup(self):
    self.cell = nn.LSTMCell(self.features)

  def __call__(self, x):
    carry = self.cell.initialize_carry(jax.random.key(0), x[:, 0].shape)
    ys = []
    for t in range(x.shape[1]):
      carry, y = self.cell(carry, x[:, t])
      ys.append(y)
    return jnp.stack(ys, 1)


def test_initialize_carry_of_a_held_cell_takes_nnx_s_signature():
  x = jax.random.normal(jax.random.key(0), (2, 3, 5))
  draft = lb.port.draft(HeldCell(), x, check=False)
  assert not draft.todos, draft.report()
  assert "self.cell.initialize_carry(x[:, 0].shape, nnx.Rngs(jax.random.key(0)))" in draft.source
  _equal_to_linen(draft, x)


class RNNThroughALocal(nn.Module):
  """seq2seq's encoder: `encoder = nn.RNN(nn.LSTMCell(h), return_carry=True, name=...)` built
  on one line and called on another."""

  hidden_size: int = 5

  @nn.compact
  def __call__(self, x):
    encoder = nn.RNN(nn.LSTMCell(self.hidden_size), return_carry=True, name="encoder")
    (c, h), ys = encoder(x)
    return c, h, ys


def test_a_cell_built_inside_an_rnn_held_by_a_local_carries_its_input_width_seq2seq():
  x = jax.random.normal(jax.random.key(0), (2, 4, 3))
  draft = lb.port.draft(RNNThroughALocal(), x, check=False)
  assert not draft.todos, draft.report()
  assert "nnx.LSTMCell(x_features, self.hidden_size" in draft.source
  _equal_to_linen(draft, x)


class WidthFromTheCarryCell(nn.RNNCellBase):
  """seq2seq's DecoderLSTMCell: a cell of the user's own whose LSTMCell is given `features`
  (the decoder's input width) but runs on the encoder's carry, which Linen's LSTMCell takes
  its hidden width from."""

  features: int
  vocab_size: int

  @nn.compact
  def __call__(self, carry, x):
    carry, y = nn.LSTMCell(self.features)(carry, x)
    return carry, nn.Dense(self.vocab_size)(y)

  @property
  def num_feature_axes(self) -> int:
    return 1


class EncoderDecoderRNN(nn.Module):
  hidden_size: int = 5
  vocab_size: int = 7

  @nn.compact
  def __call__(self, encoder_inputs, decoder_inputs):
    encoder = nn.RNN(nn.LSTMCell(self.hidden_size), return_carry=True, name="encoder")
    decoder = nn.RNN(
      WidthFromTheCarryCell(decoder_inputs.shape[-1], self.vocab_size),
      split_rngs={"params": False, "lstm": True},
      name="decoder",
    )
    state, _ = encoder(encoder_inputs)
    return decoder(decoder_inputs, initial_carry=state)


def _encoder_decoder_inputs():
  keys = jax.random.split(jax.random.key(0))
  return jax.random.normal(keys[0], (2, 4, 3)), jax.random.normal(keys[1], (2, 3, 6))


def test_an_rnn_of_a_user_cell_over_another_s_carry_seq2seq():
  """The cell's port subclasses nnx.RNNCellBase (no Linen base left); its LSTMCell's hidden
  width is the carry's (the encoder's hidden_size, passed in by the parent), not `features`;
  `split_rngs={'params': False, 'lstm': True}` is what nnx.RNN does (a new key each step)."""
  args = _encoder_decoder_inputs()
  draft = lb.port.draft(EncoderDecoderRNN(), *args, check=False)
  assert not draft.todos, draft.report()
  assert "class WidthFromTheCarryCell(nnx.RNNCellBase):" in draft.source
  assert "nn.RNN" not in draft.source and "nn.RNNCellBase" not in draft.source
  assert "split_rngs" not in draft.source
  _equal_to_linen(draft, *args)


class AlwaysSamples(nn.Module):
  """seq2seq's decoder samples its prediction from a stream on every call (no flag turns it
  off): Linen and the port cannot draw the same numbers."""

  @nn.compact
  def __call__(self, x):
    logits = nn.Dense(4)(x)
    return logits, jax.random.categorical(self.make_rng("sample"), logits)


def test_a_sample_call_that_draws_random_numbers_is_reported_as_such_seq2seq():
  x = jax.random.normal(jax.random.key(0), (3, 5))
  draft = lb.port.draft(AlwaysSamples(), x)
  assert not draft.ok and not draft.todos
  assert "self.rngs.sample()" in draft.source
  assert draft.check is not None
  why = draft.check.error or ""
  assert "draws random numbers" in why and "'sample'" in why, draft.report()
  assert "a call that draws nothing" in why


class NoisyCell(nn.RNNCellBase):
  @nn.compact
  def __call__(self, carry, x):
    return carry, x + jax.random.normal(self.make_rng("noise"), x.shape)

  @property
  def num_feature_axes(self) -> int:
    return 1


class SameNoiseEachStep(nn.Module):
  @nn.compact
  def __call__(self, x):
    rnn = nn.RNN(NoisyCell(), split_rngs={"params": False, "noise": False})
    return rnn(x, initial_carry=jnp.zeros(x.shape[:1]))


def test_an_rnn_stream_kept_the_same_at_every_step_is_broadcast_or_a_todo():
  """`split_rngs={'noise': False}`: Linen draws the same noise at every step; the port does
  too (nnx.RNN's broadcast_rngs=) where this flax has it, else the construction is a TODO
  saying what to write."""
  from flax import nnx

  x = jnp.zeros((2, 3, 4))
  linen = SameNoiseEachStep().apply({}, x, rngs={"noise": jax.random.key(1)})
  np.testing.assert_array_equal(linen[:, 0], linen[:, 1])
  draft = lb.port.draft(SameNoiseEachStep(), x, check=False)
  if "broadcast_rngs" not in inspect.signature(nnx.RNN.__init__).parameters:
    (todo,) = draft.todos
    assert "broadcast_rngs" in todo.reason and "by hand" in todo.reason
    return
  assert not draft.todos, draft.report()
  assert 'broadcast_rngs=("noise",)' in draft.source.replace("'", '"')
  out = draft.build(rngs=nnx.Rngs(0, noise=1))(x)
  np.testing.assert_array_equal(out[:, 0], out[:, 1])
  assert not np.allclose(out[:, 0], 0)
