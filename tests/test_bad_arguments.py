"""Wrong arguments to public entries are loopbridge errors that name the argument and the fix,
never a raw Python or JAX error from deep inside: `lb.port.draft(configs=...)`,
`Draft.build(config=..., rngs=...)`, `lb.checkpoint.linen_to_nnx(step=...)`,
`lb.layers.layer(stack, i)`; and a `configs=` instance that cannot run the sample call is
reported as that instance, not as the sample call."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import loopbridge as lb


class Mlp(nn.Module):
  hidden: int = 4

  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(self.hidden)(x))  # Dense_0
    return nn.Dense(2)(h)  # Dense_1


class MlpPort(nnx.Module):
  def __init__(self, rngs):
    self.Dense_0 = nnx.Linear(5, 4, rngs=rngs)
    self.Dense_1 = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.Dense_1(nnx.relu(self.Dense_0(x)))


X = jax.random.normal(jax.random.key(0), (3, 5))


@pytest.fixture(scope="module")
def draft():
  return lb.port.draft(Mlp(), X, configs=[Mlp(hidden=6)], check=False)


def test_configs_of_one_instance_is_refused_naming_configs():
  with pytest.raises(lb.port.PortError, match=r"configs= must be a sequence .* got one Mlp"):
    lb.port.draft(Mlp(), X, configs=Mlp(hidden=6), check=False)  # pyright: ignore


# The index one past the draft's last configuration (the user's `configs=` and those the
# draft derived, as the distinct-valued ones): how many there are is the draft's to say.
PAST_THE_LAST = object()


@pytest.mark.parametrize(
  "config",
  [PAST_THE_LAST, 99, -1, "1", True, 1.0],
  ids=["past-the-last", "99", "-1", "str", "bool", "float"],
)
def test_build_refuses_a_config_that_is_not_one_of_the_drafts(draft, config):
  assert 1 <= len(draft.configs) < 99
  if config is PAST_THE_LAST:
    config = len(draft.configs) + 1
  with pytest.raises(lb.port.PortError, match=r"Draft.build: config="):
    draft.build(config=config)


def test_build_refuses_rngs_that_are_not_an_rngs(draft):
  with pytest.raises(lb.port.PortError, match=r"rngs= must be an nnx.Rngs .* nnx.Rngs\(0\)"):
    draft.build(rngs=0)  # pyright: ignore


def test_build_at_each_config_computes_what_linen_does_there(draft):
  # The valid indices still build: the port at configs[0] holds Linen's init there.
  for k, module in ((0, Mlp()), (1, Mlp(hidden=6))):
    port = draft.build(config=k)
    variables = module.init(jax.random.key(1), X)
    lb.checkpoint.linen_to_nnx(module, variables, port, X)
    np.testing.assert_allclose(port(X), module.apply(variables, X), rtol=1e-6)


@pytest.mark.parametrize("step", [-1, 2.5, "3", True])
def test_linen_to_nnx_refuses_a_step_that_is_no_count(step):
  variables = Mlp().init(jax.random.key(0), X)
  port = MlpPort(nnx.Rngs(0))
  tx = optax.sgd(0.1)
  try:
    optimizer = nnx.Optimizer(port, tx, wrt=nnx.Param)
  except TypeError:  # flax 0.10: no wrt=
    optimizer = nnx.Optimizer(port, tx)
  with pytest.raises(lb.checkpoint.CheckpointError, match=r"step=.* non-negative int"):
    lb.checkpoint.linen_to_nnx(
      Mlp(),
      variables,
      port,
      X,
      opt_state=tx.init(variables["params"]),
      optimizer=optimizer,
      step=step,  # pyright: ignore
    )


@pytest.mark.parametrize("index", ["1", None, 1.0])
def test_layer_refuses_an_index_that_is_no_integer(index):
  stack = lb.layers.stack([nnx.Linear(2, 2, rngs=nnx.Rngs(i)) for i in range(3)])
  with pytest.raises(lb.layers.StackError, match=r"layer index must be an int"):
    lb.layers.layer(stack, index)  # pyright: ignore


class ConstMask(nn.Module):
  """A causal mask built for `n` positions: a configuration with fewer cannot run a longer
  sample."""

  n: int = 6

  def setup(self):
    self.mask = jnp.tril(jnp.ones((self.n, self.n), bool))
    self.proj = nn.Dense(6)

  def __call__(self, x):
    scores = x @ jnp.swapaxes(x, -1, -2)
    t = x.shape[1]
    scores = jnp.where(self.mask[:t, :t], scores, -1e9)
    return self.proj(jax.nn.softmax(scores) @ x)


def test_a_configs_instance_that_cannot_run_the_sample_is_named():
  x = jax.random.normal(jax.random.key(0), (2, 5, 6))
  ConstMask().init(jax.random.key(0), x)  # the sample call runs at the module's own fields
  with pytest.raises(lb.port.PortError) as error:
    lb.port.draft(ConstMask(), x, configs=[ConstMask(n=8), ConstMask(n=2)], check=False)
  message = str(error.value)
  assert message.startswith("lb.port.draft: configs[1] (ConstMask(n=2)) cannot run the sample")
  assert "the drafted module itself runs it" in message and "sample call failed" not in message
