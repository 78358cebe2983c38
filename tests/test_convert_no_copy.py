"""The conversion's write path keeps no needless copy of a model's weights: with `copy=False` a
Linen `nn.scan` stack stored along the axis the port's `nnx.vmap` stack uses is handed over as
the same device buffer (as `nnx.update` would), not sliced into layers and stacked again. By
default the port gets its own arrays, so a donated step on the port leaves the caller's Linen
variables (and optax state) usable. Values are checked against the Linen arrays read by hand;
`benchmarks/bench_convert.py` measures the memory."""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb
from loopbridge import _compat

DEPTH = 3


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return nn.Dense(4)(x), None


class Scanned(nn.Module):
  axis: int

  @nn.compact
  def __call__(self, x):
    stack = nn.scan(
      Block, variable_axes={"params": self.axis}, split_rngs={"params": True}, length=DEPTH
    )
    return stack(name="stack")(x, None)[0]


class Port(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    @nnx.split_rngs(splits=DEPTH)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return nnx.Linear(4, 4, rngs=rngs)

    self.blocks = make(rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, block):
      return block(x)

    return run(x, self.blocks)


def _buffer(array) -> int:
  return jnp.asarray(array).unsafe_buffer_pointer()


@pytest.mark.parametrize("axis", [0, 1])
def test_a_stack_in_the_ports_layout_is_handed_over_not_copied(axis):
  x = jax.random.normal(jax.random.key(0), (2, 4))
  variables = Scanned(axis).init(jax.random.key(1), x)
  kernel = variables["params"]["stack"]["Dense_0"]["kernel"]
  port = Port(nnx.Rngs(0))

  lb.checkpoint.linen_to_nnx(Scanned(axis), variables, port, x, copy=False)
  converted = port.blocks.kernel[...]
  np.testing.assert_array_equal(converted, np.moveaxis(np.asarray(kernel), axis, 0))
  # Axis 0 on both sides: the very buffer; another axis needs one transposed copy.
  assert (_buffer(converted) == _buffer(kernel)) == (axis == 0)

  back = lb.checkpoint.nnx_to_linen(port, Scanned(axis), x, copy=False)
  back_kernel = back["params"]["stack"]["Dense_0"]["kernel"]  # type: ignore[index]
  np.testing.assert_array_equal(back_kernel, kernel)
  assert (_buffer(back_kernel) == _buffer(converted)) == (axis == 0)
  # (Last: on flax 0.10 calling the port stores the arrays its nnx.scan returns.)
  np.testing.assert_allclose(port(x), Scanned(axis).apply(variables, x), rtol=1e-6)


class Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(4)(x))  # Dense_0
    return nn.Dense(2)(h)  # Dense_1


class MlpPort(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.Dense_0 = nnx.Linear(3, 4, rngs=rngs)
    self.Dense_1 = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.Dense_1(nnx.relu(self.Dense_0(x)))


@nnx.jit(donate_argnums=0)
def _halve(model):
  for layer in (model.Dense_0, model.Dense_1):
    _compat.set_variable_value(layer.kernel, _compat.variable_value(layer.kernel) * 0.5)
  return model


def _readable(tree) -> list[np.ndarray]:
  return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def test_a_donated_step_on_the_port_leaves_the_callers_variables_usable():
  import optax

  x = jax.random.normal(jax.random.key(0), (2, 3))
  variables = Mlp().init(jax.random.key(1), x)
  want = np.asarray(Mlp().apply(variables, x))
  tx = optax.adam(1e-3)
  opt_state = tx.init(variables["params"])
  port = MlpPort(nnx.Rngs(0))
  try:
    optimizer = nnx.Optimizer(port, tx, wrt=nnx.Param)
  except TypeError:  # flax 0.10: no wrt=
    optimizer = nnx.Optimizer(port, tx)
  lb.checkpoint.linen_to_nnx(Mlp(), variables, port, x, opt_state=opt_state, optimizer=optimizer)
  np.testing.assert_array_equal(port(x), want)
  _halve(port)
  _readable(variables)  # the caller's arrays were not deleted by the donation
  _readable(opt_state)
  np.testing.assert_array_equal(Mlp().apply(variables, x), want)


def test_copy_false_moves_the_arrays_and_copy_must_be_a_bool():
  x = jax.random.normal(jax.random.key(0), (2, 3))
  variables = Mlp().init(jax.random.key(1), x)
  port = MlpPort(nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(Mlp(), variables, port, x, copy=False)
  kernel = variables["params"]["Dense_0"]["kernel"]
  assert _buffer(port.Dense_0.kernel[...]) == _buffer(kernel)
  with pytest.raises(TypeError, match="copy= must be True or False"):
    lb.checkpoint.linen_to_nnx(Mlp(), variables, port, x, copy="yes")  # pyright: ignore


def test_a_drafts_port_and_variables_leave_the_callers_arrays_usable():
  x = jax.random.normal(jax.random.key(0), (2, 3))
  variables = Mlp().init(jax.random.key(1), x)
  draft = lb.port.draft(Mlp(), x, variables=variables, check=False)
  port, given = draft.port_and_variables()
  assert given is variables
  _halve(port)
  _readable(variables)
  np.testing.assert_allclose(port(x), Mlp().apply(_halved(variables), x), rtol=1e-6)


def _halved(variables):
  params = jax.tree.map(lambda v: v, dict(variables["params"]))
  for name in ("Dense_0", "Dense_1"):
    params[name] = {**params[name], "kernel": params[name]["kernel"] * 0.5}
  return {"params": params}


def test_linen_variables_from_a_port_stay_usable_after_a_donated_step_on_the_port():
  """`nnx_to_linen` hands back arrays of its own by default: a later donated step on the port
  (as the README's loop runs it) must not delete the Linen variables it returned."""
  x = jax.random.normal(jax.random.key(0), (2, 3))
  port = MlpPort(nnx.Rngs(0))
  want = np.asarray(port(x))
  variables = lb.checkpoint.nnx_to_linen(port, Mlp(), x)
  _halve(port)
  _readable(variables)  # not deleted by the donation
  np.testing.assert_array_equal(Mlp().apply(variables, x), want)


def test_nnx_to_linen_copy_false_hands_back_the_ports_arrays():
  x = jax.random.normal(jax.random.key(0), (2, 3))
  port = MlpPort(nnx.Rngs(0))
  variables = lb.checkpoint.nnx_to_linen(port, Mlp(), x, copy=False)
  kernel = tp.cast(jax.Array, variables["params"]["Dense_0"]["kernel"])  # pyright: ignore
  assert _buffer(port.Dense_0.kernel[...]) == _buffer(kernel)
  with pytest.raises(TypeError, match="copy= must be True or False"):
    lb.checkpoint.nnx_to_linen(port, Mlp(), x, copy="yes")  # pyright: ignore
