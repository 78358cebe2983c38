"""The Transformer LM of `transformer_lm` built for sampling: `decode=True`, one token per call.

As in the lm1b example, the cache is sized by an `init` on the full length; each call then
feeds one token and advances the cache. `init_variables()` is that init (params and cache).
"""

import dataclasses

import jax

from .transformer_lm import TransformerLM
from .transformer_lm import config as train_config

config = dataclasses.replace(train_config, decode=True)
model = TransformerLM(config)


def init_variables(seed: int = 0):
  """Params and a fresh cache: Linen's `init` on the full length, as decoding code does it."""
  tokens = jax.numpy.zeros((2, config.max_len), jax.numpy.int32)
  return model.init(jax.random.key(seed), tokens)


def tokens():
  """A whole sequence, fed one column per step."""
  return jax.random.randint(jax.random.key(8), (2, config.max_len), 0, config.vocab_size)


def sample_args():
  return (tokens()[:, :1],)


SAMPLE_KWARGS = {}
EXTRA_CALLS = ()
