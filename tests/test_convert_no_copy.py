"""The conversion's write path keeps no second copy of a model's weights: a Linen `nn.scan`
stack stored along the axis the port's `nnx.vmap` stack uses is handed over as the same device
buffer (as `nnx.update` would), not sliced into layers and stacked again. Values are checked
against the Linen arrays read by hand; `benchmarks/bench_convert.py` measures the memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb

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

  lb.checkpoint.linen_to_nnx(Scanned(axis), variables, port, x)
  converted = port.blocks.kernel[...]
  np.testing.assert_array_equal(converted, np.moveaxis(np.asarray(kernel), axis, 0))
  # Axis 0 on both sides: the very buffer; another axis needs one transposed copy.
  assert (_buffer(converted) == _buffer(kernel)) == (axis == 0)

  back = lb.checkpoint.nnx_to_linen(port, Scanned(axis), x)
  back_kernel = back["params"]["stack"]["Dense_0"]["kernel"]  # type: ignore[index]
  np.testing.assert_array_equal(back_kernel, kernel)
  assert (_buffer(back_kernel) == _buffer(converted)) == (axis == 0)
  # (Last: on flax 0.10 calling the port stores the arrays its nnx.scan returns.)
  np.testing.assert_allclose(port(x), Scanned(axis).apply(variables, x), rtol=1e-6)
