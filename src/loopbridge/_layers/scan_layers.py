"""Scan over layers: run an input through every layer of a stack with one compiled layer body."""

from __future__ import annotations

import typing as tp

from flax import nnx

from .stack import _num_layers

Carry = tp.TypeVar("Carry")


def scan(
  stacked: nnx.Module,
  x: Carry,
  *args: object,
  call: tp.Callable[..., Carry] | None = None,
  remat: bool = False,
  unroll: int | bool = 1,
  reverse: bool = False,
) -> Carry:
  """Run `x` through every layer of a stack in order, with `nnx.scan` (optionally `nnx.remat`).

  Equivalent to `for layer in lb.layers.unstack(stacked): x = layer(x, *args)`, but the layer
  body is
  traced and compiled once whatever the depth. Writes the layers make (statistics, recorded
  sows into preallocated buffers, any Variable update) land in the stack at their layer's index.

  Args:
    stacked: a stack (from `lb.layers.stack` or `nnx.vmap`).
    x: the carry: the input of the first layer; each layer's output (same structure, shapes and
      dtypes) is the next layer's input.
    *args: extra arguments passed unchanged to every layer (e.g. a mask); arrays or modules.
    call: how to call one layer, `call(layer, x, *args) -> x`; default `layer(x, *args)`.
    remat: wrap the layer body in `nnx.remat`, so a backward pass recomputes each layer's
      activations instead of storing them (less memory, about one more forward of compute).
    unroll: passed to `nnx.scan`: how many layers to unroll per loop iteration.
    reverse: run the layers last to first.

  Returns:
    The last layer's output.

  Raises:
    StackError: `stacked` is not a stack (see `lb.layers.unstack`).

  Examples:
    >>> import jax.numpy as jnp
    >>> import loopbridge as lb
    >>> from flax import nnx
    >>> stacked = lb.layers.stack([nnx.Linear(4, 4, rngs=nnx.Rngs(i)) for i in range(3)])
    >>> lb.layers.scan(stacked, jnp.ones((2, 4)), remat=True).shape
    (2, 4)
  """
  _num_layers(stacked, "lb.layers.scan")
  apply = call if call is not None else (lambda layer, carry, *rest: layer(carry, *rest))

  def body(layer, carry, rest) -> Carry:
    return apply(layer, carry, *rest)

  if remat:
    body = nnx.remat(body)
  scan = nnx.scan(
    body, in_axes=(0, nnx.Carry, None), out_axes=nnx.Carry, unroll=unroll, reverse=reverse
  )
  return scan(stacked, x, args)
