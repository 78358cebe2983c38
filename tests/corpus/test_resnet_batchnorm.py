"""Corpus: a ResNet with BatchNorm trained in a jitted NNX loop, recording every step.

The shape of flax's ResNet example (written here, tiny): conv stem, residual blocks of
conv + BatchNorm (`use_running_average=not train`), global pooling, a classifier head. Each
block sows its output. A training step calls the model with `train=True, mutable=
["batch_stats"]` inside `nnx.value_and_grad`, then applies SGD to the params; `nnx.fori_loop`
runs the steps. So one loop updates params, batch statistics (in place, as Linen's
`mutable=` says) and the sow buffers.

Reference: the plain Linen train step (`jax.value_and_grad` of `apply(..., mutable=
["batch_stats", "intermediates"])`, SGD, new batch_stats), step by step from the same initial
variables. Losses, block outputs per step, final params and batch_stats agree to
atol=rtol=1e-4 (float32; the gradient is computed by a different trace order, and round-off
compounds over the steps).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

# Real-model shapes end to end: each feature they use has its own faster test; CI runs
# these in its `-m slow` pass (tests/conftest.py).
pytestmark = pytest.mark.slow

BATCH, SIZE, CHANNELS, CLASSES, BLOCKS, STEPS, LR = 4, 6, 4, 3, 2, 3, 0.1
TOL = dict(atol=1e-4, rtol=1e-4)


class ResBlock(nn.Module):
  @nn.compact
  def __call__(self, x, train):
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9)
    h = nn.relu(norm()(nn.Conv(CHANNELS, (3, 3), use_bias=False)(x)))
    h = norm()(nn.Conv(CHANNELS, (3, 3), use_bias=False)(h))
    out = nn.relu(x + h)
    self.sow("intermediates", "out", out)
    return out


class ResNet(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = True):
    x = nn.relu(
      nn.BatchNorm(use_running_average=not train, momentum=0.9)(
        nn.Conv(CHANNELS, (3, 3), use_bias=False)(x)
      )
    )
    for _ in range(BLOCKS):
      x = ResBlock()(x, train)
    return nn.Dense(CLASSES)(jnp.mean(x, axis=(1, 2)))


def _data():
  keys = jax.random.split(jax.random.key(7), STEPS)
  xs = jnp.stack([jax.random.normal(k, (BATCH, SIZE, SIZE, 1)) for k in keys])
  ys = jnp.stack([jax.random.randint(k, (BATCH,), 0, CLASSES) for k in keys])
  return xs, ys


def _loss(logits, y):
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@nnx.jit
def train(model, xs, ys):
  def step(i, carry):
    model, losses = carry

    def loss_fn(model):
      return _loss(model(xs[i], train=True, mutable=["batch_stats"]), ys[i])

    loss, grads = nnx.value_and_grad(loss_fn)(model)  # grads of the nnx.Param state
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p, g: p - LR * g, params, grads))
    return model, losses.at[i].set(loss)

  return nnx.fori_loop(0, STEPS, step, (model, jnp.zeros(STEPS)))[1]


def _pure(state):
  return nnx.to_pure_dict(state) if hasattr(nnx, "to_pure_dict") else state.to_pure_dict()


def linen_train(variables, xs, ys):
  module = ResNet()

  @jax.jit  # plain Linen train step; jitted only so the steps share one compilation
  def step(params, batch_stats, x, y):
    def loss_fn(params):
      logits, updates = module.apply(
        {"params": params, "batch_stats": batch_stats},
        x,
        train=True,
        mutable=["batch_stats", "intermediates"],
      )
      return _loss(logits, y), updates

    (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    params = jax.tree.map(lambda p, g: p - LR * g, params, grads)
    return params, updates["batch_stats"], loss, updates["intermediates"]

  params, batch_stats = variables["params"], variables["batch_stats"]
  losses, outs = [], {i: [] for i in range(BLOCKS)}
  for i in range(STEPS):
    params, batch_stats, loss, sown = step(params, batch_stats, xs[i], ys[i])
    losses.append(loss)
    for b in range(BLOCKS):
      outs[b].append(sown[f"ResBlock_{b}"]["out"][0])
  return params, batch_stats, jnp.stack(losses), outs


def test_training_loop_updates_batch_stats_and_records_like_linen_train_steps():
  xs, ys = _data()
  model = lb.ToNNX(ResNet(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, xs[0], capacity=STEPS)
  initial = {
    "params": _pure(nnx.state(model, nnx.Param)),
    "batch_stats": _pure(nnx.state(model, nnx.BatchStat)),
  }
  initial = jax.tree.map(jnp.copy, initial)  # a snapshot: the loop updates the model in place

  losses = train(model, xs, ys)
  rec = lb.recorded(model)["intermediates"]
  ref_params, ref_stats, ref_losses, ref_outs = linen_train(initial, xs, ys)

  np.testing.assert_allclose(losses, ref_losses, **TOL)
  for b in range(BLOCKS):
    out = rec[f"ResBlock_{b}"]["out"]
    assert out.shape == (STEPS, BATCH, SIZE, SIZE, CHANNELS)
    np.testing.assert_allclose(out, jnp.stack(ref_outs[b]), **TOL)
  stats = _pure(nnx.state(model, nnx.BatchStat))
  assert jax.tree.structure(stats) == jax.tree.structure(ref_stats)
  for got, want in zip(jax.tree.leaves(stats), jax.tree.leaves(ref_stats)):
    np.testing.assert_allclose(got, want, **TOL)
  # The running statistics did move (the loop really updated them in place).
  assert not np.allclose(
    stats["BatchNorm_0"]["mean"], initial["batch_stats"]["BatchNorm_0"]["mean"]
  )
  params = _pure(nnx.state(model, nnx.Param))
  assert jax.tree.structure(params) == jax.tree.structure(ref_params)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    np.testing.assert_allclose(got, want, **TOL)
