"""Property: degenerate samples cannot fool conversion's evidence.

Samples users really pass (zeros, one token, a batch of identical rows, all-positive inputs
to a ReLU net) against ports that permute their attribute names, call equal-shape modules in
another order (`k` before `q`), create them in another order, and store square kernels
transposed (`x @ W.T`). A conversion that returns gives Linen's outputs on fresh random
inputs (the reference is the Linen model's own `apply`); every other raises CheckpointError.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from hypothesis import event, given
from hypothesis import strategies as st

import loopbridge as lb

from conftest import matmul_tolerance

pytestmark = pytest.mark.slow

D = 3
ACTS = {"relu": jax.nn.relu, "tanh": jnp.tanh}
RTOL, ATOL = matmul_tolerance(1e-4, 1e-4)


class LinenChain(nn.Module):
  depth: int
  act: str

  @nn.compact
  def __call__(self, x):
    for i in range(self.depth):
      x = nn.Dense(D)(x)
      x = ACTS[self.act](x) if i < self.depth - 1 else x
    return x


class LinenAttention(nn.Module):
  @nn.compact
  def __call__(self, x):
    q, k, v = nn.Dense(D)(x), nn.Dense(D)(x), nn.Dense(D)(x)
    return nn.Dense(D)(jax.nn.softmax(q @ k.swapaxes(-1, -2) / D**0.5) @ v)


class TorchLinear(nnx.Module):
  """A Linear stored as PyTorch stores it: `x @ weight.T`, square."""

  def __init__(self, rngs):
    self.weight = nnx.Param(jax.random.normal(rngs.params(), (D, D)))
    self.bias = nnx.Param(jnp.zeros(D))

  def __call__(self, x):
    return x @ self.weight[...].T + self.bias[...]


class PortChain(nnx.Module):
  def __init__(self, names, torch, act, rngs):
    self.order, self.act = tuple(names), act
    for name, t in sorted(zip(names, torch)):  # created in another order than called
      setattr(self, name, TorchLinear(rngs) if t else nnx.Linear(D, D, rngs=rngs))

  def __call__(self, x):
    for i, name in enumerate(self.order):
      x = getattr(self, name)(x)
      x = ACTS[self.act](x) if i < len(self.order) - 1 else x
    return x


class PortAttention(nnx.Module):
  def __init__(self, names, order, rngs):
    # names: the attributes of q, k, v, o; order: the order q, k, v are computed in.
    self.names, self.order = tuple(names), tuple(order)
    for name in sorted(names):
      setattr(self, name, nnx.Linear(D, D, rngs=rngs))

  def __call__(self, x):
    got = {role: getattr(self, self.names[role])(x) for role in self.order}
    weights = jax.nn.softmax(got[0] @ got[1].swapaxes(-1, -2) / D**0.5)
    return getattr(self, self.names[3])(weights @ got[2])


def _sample(kind, key):
  if kind == "zeros":
    return jnp.zeros((2, 3, D))
  if kind == "one token":
    return jax.random.normal(key, (2, 1, D))
  if kind == "repeated rows":
    return jnp.broadcast_to(jax.random.normal(key, (1, 1, D)), (2, 3, D))
  if kind == "positive":
    return jax.random.uniform(key, (2, 3, D))
  return jax.random.normal(key, (2, 3, D))


NAMES = ["a", "proj", "q", "k", "zz", "w1", "out"]


@given(
  model=st.sampled_from(["chain", "attention"]),
  sample=st.sampled_from(["zeros", "one token", "repeated rows", "positive", "normal"]),
  depth=st.integers(1, 3),
  act=st.sampled_from(["relu", "tanh"]),
  names=st.permutations(NAMES),
  torch=st.lists(st.booleans(), min_size=3, max_size=3),
  order=st.permutations([0, 1, 2]),
  seed=st.integers(0, 2**16),
)
def test_a_degenerate_sample_never_converts_wrong(
  model, sample, depth, act, names, torch, order, seed
):
  if model == "chain":
    linen = LinenChain(depth, act)
    port = PortChain(names[:depth], torch[:depth], act, nnx.Rngs(seed))
  else:
    linen, port = LinenAttention(), PortAttention(names[:4], order, nnx.Rngs(seed))
  x = _sample(sample, jax.random.key(seed))
  variables = linen.init(jax.random.key(seed + 1), jnp.ones((2, 3, D)))
  keys = iter(jax.random.split(jax.random.key(seed + 2), 20))
  variables = jax.tree.map(lambda a: a + jax.random.normal(next(keys), a.shape), variables)
  try:
    lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  except lb.checkpoint.CheckpointError as e:
    event(f"refused on {sample}: {str(e)[:30]}")
    return  # refused, with a message (anything else fails the test)
  event(f"converted on {sample}")
  fresh = jax.random.normal(jax.random.key(seed + 3), (2, 4, D))
  np.testing.assert_allclose(port(fresh), linen.apply(variables, fresh), rtol=RTOL, atol=ATOL)
