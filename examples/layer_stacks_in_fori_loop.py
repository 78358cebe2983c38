"""`layers[i]` with a traced `i` in `nnx.fori_loop`, and what `nnx.vmap` builds.

A model that keeps its layers in a list and calls `layers[i](x)` inside
`nnx.fori_loop` fails with TracerIntegerConversionError: a Python list cannot be indexed
by a traced integer. A loop over layers needs the layers as one *stack* (every array with a
leading layer axis); `lb.layers.layer(stack, i)` then gives layer `i` for a traced `i`.
Only layers of
equal shapes can share a stack, so the hidden widths are made equal here; hidden layers of
different widths get a clear error, and a Python loop is the right tool for them.

Run: python examples/layer_stacks_in_fori_loop.py
"""

import jax
import jax.numpy as jnp
from flax import nnx

import loopbridge as lb


class MLP(nnx.Module):
  """An MLP with its equal-width hidden layers kept as one stack."""

  def __init__(
    self,
    rngs: nnx.Rngs,
    in_features: int,
    hidden_features: list,
    out_features: int,
    leaky_relu_negative_slope: float = 0.01,
  ) -> None:
    self.leaky_relu_negative_slope = leaky_relu_negative_slope
    width = hidden_features[0]
    self.first = nnx.Linear(in_features, width, rngs=rngs)
    # Was: a list of Linear layers. Now: the hidden layers stacked (raises if widths differ).
    self.hidden = lb.layers.stack([nnx.Linear(width, n, rngs=rngs) for n in hidden_features[1:]])
    self.last = nnx.Linear(hidden_features[-1], out_features, rngs=rngs)
    self.num_hidden = len(hidden_features) - 1

  def act(self, x):
    return nnx.leaky_relu(x, negative_slope=self.leaky_relu_negative_slope)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Forward pass using a Python for-loop (unrolled under jit)."""
    x = self.act(self.first(x))
    for layer in lb.layers.unstack(self.hidden):
      x = self.act(layer(x))
    return self.last(x)

  def forward_fori_loop(self, x: jax.Array) -> jax.Array:
    """Forward pass using nnx.fori_loop: `lb.layers.layer(layers, i)` instead of `layers[i]`."""

    def forward(i, state):
      layers, x = state
      x = self.act(lb.layers.layer(layers, i)(x))
      return layers, x

    x = self.act(self.first(x))
    self.hidden, x = nnx.fori_loop(0, self.num_hidden, forward, (self.hidden, x))
    return self.last(x)

  def forward_scan(self, x: jax.Array) -> jax.Array:
    """Forward pass using nnx.scan over the stack."""
    x = self.act(self.first(x))
    x = lb.layers.scan(self.hidden, x, call=lambda layer, x: self.act(layer(x)))
    return self.last(x)


class Model(nnx.Module):
  """A stack built with nnx.vmap (one Linear *with a layer axis*), run with nnx.scan."""

  def __init__(self, layer_keys):
    @nnx.vmap(in_axes=0, out_axes=0)
    def create_layer(key):
      return nnx.Linear(32, 32, rngs=nnx.Rngs(key))

    self.model = create_layer(layer_keys)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def forward(x, model):
      return model(x)

    return forward(x, self.model)


if __name__ == "__main__":
  rngs = nnx.Rngs(default=0)
  mlp = MLP(rngs=rngs, in_features=128, hidden_features=[64, 64, 64], out_features=10)
  x = jnp.ones((42, 128))
  y_for_loop = mlp(x)
  y_fori_loop = mlp.forward_fori_loop(x)
  assert (y_for_loop == y_fori_loop).all()
  y_scan = mlp.forward_scan(x)
  assert jnp.allclose(y_for_loop, y_scan, atol=1e-5)
  print("fori_loop forward == Python-loop forward (bit-exact); scan forward matches")

  try:  # hidden layers of different widths cannot share one stack
    MLP(rngs=rngs, in_features=128, hidden_features=[265, 128, 64], out_features=10)
  except lb.layers.StackError as error:
    print("heterogeneous widths:", str(error).splitlines()[0])

  model = Model(jax.random.split(jax.random.key(0), 2))
  print(
    "nnx.vmap built",
    len(lb.layers.unstack(model.model)),
    "layers; kernel stack shape",
    model.model.kernel.shape,
  )
  layers = lb.layers.unstack(model.model)
  x = jnp.ones((42, 32))
  assert jnp.allclose(model(x), layers[1](layers[0](x)), atol=1e-6)
  print("nnx.scan over the vmap-built stack == the two layers applied in turn")
