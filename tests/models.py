"""Small Linen models shared by the tests (each mirrors a shape real users have)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class Block(nn.Module):
  """The seed-000 scan body: Dense + relu, sows its carry."""

  features: int = 8

  @nn.compact
  def __call__(self, carry, unused_inputs):
    carry = nn.relu(nn.Dense(self.features)(carry))
    self.sow("intermediates", "carry", carry)
    return carry, None


def recording_mlp(capacity=8, *, features=4, depth=2, overflow="error"):
  """(an `lb.ToNNX(MLP)` lazily initialized on a (1, features) input, that input)."""
  from flax import nnx

  import loopbridge as lb

  x = jax.random.normal(jax.random.key(1), (1, features))
  model = lb.ToNNX(MLP(depth, features), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=capacity, overflow=overflow)
  return model, x


class MLP(nn.Module):
  """The seed-000 model: a top-level sow and a sow inside an `nn.scan` body."""

  depth: int = 3
  features: int = 8

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    scan_block = nn.scan(
      Block,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      length=self.depth,
    )(self.features)
    carry, _ = scan_block(x, None)
    return carry


def linen_step_reference(module: nn.Module, variables, inputs_per_step):
  """Plain Linen, one `apply(mutable=['intermediates'])` per step: the independent reference.

  Returns (outputs per step, list of intermediates dicts per step).
  """
  outs, inters = [], []
  for x in inputs_per_step:
    y, state = module.apply(variables, x, mutable=["intermediates"])
    outs.append(y)
    inters.append(state["intermediates"])
  return outs, inters


def linen_feedback_steps(module: nn.Module, variables, x, steps: int, capture=False):
  """Plain Linen, each output fed back as the next input: the per-step 'intermediates' trees."""
  inters = []
  for _ in range(steps):
    x, state = module.apply(variables, x, capture_intermediates=capture, mutable=["intermediates"])
    inters.append(state["intermediates"])
  return inters


def stack_reference(inters, path):
  """Stack the tuple entries found at `path` across steps, in call order: Array[n, ...].

  A sown pytree is stacked leaf by leaf (the same pytree, each leaf with a leading axis)."""
  values = []
  for tree in inters:
    node = tree
    for key in path:
      node = node[key]
    values.extend(node)
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *values)
