"""What each flax's `nnx.scan`/`nnx.vmap` need from a caller, and whether NNX keeps arrays as
attributes."""

from __future__ import annotations

import functools
import typing as tp

import jax
from flax import nnx


def _stack_call_fails(run: tp.Callable[[tp.Any, jax.Array], object]) -> bool:
  """Whether `run(stack, x)` fails over a two-layer `nnx.vmap`-built stack holding a stream."""

  class _Layer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
      return self.drop(x, deterministic=True)

  @nnx.split_rngs(splits=2)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def make(rngs: nnx.Rngs) -> _Layer:
    return _Layer(rngs)

  try:
    run(make(nnx.Rngs(0)), jax.numpy.ones(2))
  except Exception:  # flax 0.10: the stream counts are not mapped along the stack
    return True
  return False


@functools.cache
def nnx_scan_needs_split_rngs() -> bool:
  """Whether `nnx.scan` over an `nnx.vmap`-built stack needs `nnx.split_rngs` around it.

  flax 0.10 scans a stack's rng stream counts as scalars ("axis 0 is out of bounds"), so a
  scan over a stack of layers holding a stream (a Dropout) needs the streams split around the
  call; flax 0.11 and 0.12 scan them as they are, and there the wrapper splits an already
  split key ("fold_in accepts a single key"). Decided by running one tiny scan, once.
  """

  def step(layer: tp.Any, x: jax.Array) -> tuple[jax.Array, None]:
    return layer(x), None

  scan = nnx.scan(step, in_axes=(0, nnx.Carry), out_axes=(nnx.Carry, 0))
  return _stack_call_fails(scan)


@functools.cache
def nnx_vmap_needs_split_rngs() -> bool:
  """Whether `nnx.vmap` over an `nnx.vmap`-built stack (its axis 0) needs `nnx.split_rngs`
  around it: as for `nnx.scan`, flax 0.10 maps the stack's stream counts, which are scalars
  ("rank should be at least 1"); flax 0.12 maps them as they are. Decided by running once."""
  return _stack_call_fails(nnx.vmap(lambda layer, x: layer(x), in_axes=(0, None), out_axes=0))


@functools.cache
def nnx_keeps_array_attributes() -> bool:
  """Whether an NNX module may keep a plain jax/numpy array as an attribute.

  flax 0.10's graph refuses one when the module is split ("Arrays leaves are not supported");
  flax 0.11 and 0.12 keep it (as a leaf of the module's state). Decided by splitting one tiny
  module that holds a numpy array, once.
  """
  import numpy as np

  class Holder(nnx.Module):
    def __init__(self) -> None:
      self.constant = np.zeros(())

  try:
    nnx.split(Holder())
  except ValueError:
    return False
  return True
