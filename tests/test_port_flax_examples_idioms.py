"""Drafting the idioms of flax's own `examples/` (nlp_seq, seq2seq, sst2), each on a small Linen
model written the way the example writes it, checked against Linen's own apply."""

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
