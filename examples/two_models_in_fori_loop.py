"""`fori_loop` over a carry holding two different NNX models.

A program calling `nnx.fori_loop(0, 10, f, (model, model2))` fails on flax 0.10
with "nnx.fori_loop requires body function's input and output to have the same
reference and pytree structure". `lb.fori_loop` is a drop-in replacement that works on every
supported flax; only the loop call changes. The second part trains both models in one loop.

Run: python examples/two_models_in_fori_loop.py
"""

import jax
import jax.numpy as jnp
from flax import nnx

import loopbridge as lb


def main() -> None:
  model = nnx.Linear(2, 2, rngs=nnx.Rngs(jax.random.PRNGKey(0)))
  model2 = nnx.Linear(2, 2, rngs=nnx.Rngs(jax.random.PRNGKey(1)))

  def f(i, x):
    return x

  out = lb.fori_loop(0, 10, f, (model, model2))
  print("lb.fori_loop: ran 10 steps over (model, model2)")
  print(f"  returned the caller's models: {out[0] is model and out[1] is model2}")

  # Training both models at the same time: one SGD step per iteration.
  x = jax.random.normal(jax.random.key(2), (8, 2))
  target = x @ jnp.array([[0.0, 1.0], [1.0, 0.0]])

  def loss_fn(m):
    return jnp.mean((m(x) - target) ** 2)

  def sgd_step(m):
    grads = nnx.grad(loss_fn)(m)
    nnx.update(m, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(m, nnx.Param), grads))

  def train(i, carry):
    m1, m2 = carry
    sgd_step(m1)
    sgd_step(m2)
    return m1, m2

  before = (float(loss_fn(model)), float(loss_fn(model2)))
  lb.fori_loop(0, 100, train, (model, model2))
  after = (float(loss_fn(model)), float(loss_fn(model2)))
  print("trained both models for 100 steps inside one lb.fori_loop")
  for name, b, a in zip(("model", "model2"), before, after):
    print(f"  {name}: loss {b:.4f} -> {a:.4f}")


if __name__ == "__main__":
  main()
