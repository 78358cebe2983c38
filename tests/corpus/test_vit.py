"""Corpus: a ViT-shaped Linen classifier recorded through `capture_intermediates`.

The shape of big_vision's ViT with `scan=True` (written here from that description, no code
copied): a patch embedding (strided `nn.Conv`), a class token and learned position embeddings,
then encoder blocks under `nn.remat` + `nn.scan` over the layers, each block returning a tuple
`(x, {"attn": weights, "mlp": hidden})`, and a classifier head. The model never calls `sow`:
it is recorded with `lb.ToNNX(..., capture_intermediates=<filter>)` (the blocks' outputs only)
and `capture_intermediates=True` (every submodule), run in a jitted NNX loop that feeds one
batch of images per step.

Reference: plain Linen `vit.apply(variables, images[t], capture_intermediates=...,
mutable=['intermediates'])` for each step t, with the same variables. Tolerance: float32,
RTOL = ATOL = 1e-5 (a compiled loop against eager applies: XLA may fuse and reorder sums).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

from conftest import graph_kw

# Real-model shapes end to end: each feature they use has its own faster test; CI runs
# these in its `-m slow` pass (tests/conftest.py).
pytestmark = pytest.mark.slow

RTOL, ATOL = 1e-5, 1e-5
STEPS, BATCH, IMAGE, PATCH, WIDTH, DEPTH, HEADS, CLASSES = 3, 2, 8, 4, 16, 3, 2, 5


class SelfAttention(nn.Module):
  """Multi-head self-attention that also returns its attention weights."""

  heads: int

  @nn.compact
  def __call__(self, x):
    dim = x.shape[-1] // self.heads
    q, k, v = (nn.DenseGeneral((self.heads, dim), name=n)(x) for n in ("query", "key", "value"))
    weights = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dim), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), name="out")(out), weights


class EncoderBlock(nn.Module):
  """Pre-norm block in the `nn.scan` body form: `(x, _) -> (x, aux)`, aux a dict."""

  heads: int
  mlp_dim: int

  @nn.compact
  def __call__(self, x, _):
    y, weights = SelfAttention(self.heads)(nn.LayerNorm()(x))
    x = x + y
    h = nn.gelu(nn.Dense(self.mlp_dim)(nn.LayerNorm()(x)))
    x = x + nn.Dense(x.shape[-1])(h)
    return x, {"attn": weights, "mlp": h}


class Encoder(nn.Module):
  depth: int
  heads: int
  mlp_dim: int

  @nn.compact
  def __call__(self, x):
    # 'intermediates': 0 carries the captures out of the scan, stacked per layer (without it
    # Linen drops them, and loopbridge warns).
    layers = nn.scan(
      nn.remat(EncoderBlock),
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      in_axes=nn.broadcast,
      length=self.depth,
    )
    x, aux = layers(self.heads, self.mlp_dim, name="layers")(x, None)
    return nn.LayerNorm(name="norm")(x), aux


class ViT(nn.Module):
  @nn.compact
  def __call__(self, images):
    x = nn.Conv(WIDTH, (PATCH, PATCH), strides=(PATCH, PATCH), padding="VALID", name="embedding")(
      images
    )
    x = x.reshape(x.shape[0], -1, WIDTH)
    cls = self.param("cls", nn.initializers.normal(0.02), (1, 1, WIDTH))
    x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, WIDTH)), x], axis=1)
    x = x + self.param("pos_embedding", nn.initializers.normal(0.02), x.shape[1:])
    x, _ = Encoder(DEPTH, HEADS, 2 * WIDTH, name="encoder")(x)
    return nn.Dense(CLASSES, name="head")(x[:, 0])


def only_blocks(module, method_name):
  return isinstance(module, EncoderBlock) and method_name == "__call__"


IMAGES = jax.random.normal(jax.random.key(1), (STEPS, BATCH, IMAGE, IMAGE, 3))
TOKENS = (IMAGE // PATCH) ** 2 + 1


def run_jitted(model, images, graph):
  """A jitted nnx.fori_loop feeding the batch images[t] at step t; returns all logits."""

  @nnx.jit
  def run(model, images):
    def body(t, carry):
      m, logits = carry
      return m, logits.at[t].set(m(images[t]))

    return nnx.fori_loop(
      0, STEPS, body, (model, jnp.zeros((STEPS, BATCH, CLASSES))), **graph_kw(graph)
    )[1]

  return run(model, images)


def linen_reference(variables, capture):
  """Logits and 'intermediates' of plain Linen, one apply per step."""
  # Plain Linen, jitted per step only to keep the test fast (eager nn.scan is slow).
  apply = jax.jit(
    lambda v, x: ViT().apply(v, x, capture_intermediates=capture, mutable=["intermediates"])
  )
  logits, inters = [], []
  for t in range(STEPS):
    y, state = apply(variables, IMAGES[t])
    logits.append(y)
    inters.append(state["intermediates"])
  return jnp.stack(logits), inters


def stacked(inters, path):
  values = []
  for tree in inters:
    for key in path:
      tree = tree[key]
    values.extend(tree)
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *values)


def leaf_paths(tree, prefix=()):
  """Every path of the Linen intermediates tree that ends in a sow tuple."""
  if isinstance(tree, tuple):
    return [prefix]
  return [p for k, v in tree.items() for p in leaf_paths(v, (*prefix, k))]


def assert_close(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert g.shape == w.shape
    np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_vit_blocks_recorded_through_a_capture_filter(graph):
  model = lb.ToNNX(ViT(), rngs=nnx.Rngs(0), capture_intermediates=only_blocks)
  lb.lazy_init(model, IMAGES[0], capacity=STEPS)
  logits = run_jitted(model, IMAGES, graph)
  want_logits, inters = linen_reference(lb.linen_variables(model), only_blocks)
  np.testing.assert_allclose(logits, want_logits, rtol=RTOL, atol=ATOL)

  rec = lb.recorded(model)["intermediates"]
  assert leaf_paths(inters[0]) == [("encoder", "layers", "__call__")]
  block = rec["encoder"]["layers"]["__call__"]
  # The block's tuple (x, {"attn", "mlp"}), each leaf stacked over the layers by nn.scan,
  # with the loop step first.
  x, aux = block
  assert x.shape == (STEPS, DEPTH, BATCH, TOKENS, WIDTH)
  assert aux["attn"].shape == (STEPS, DEPTH, BATCH, HEADS, TOKENS, TOKENS)
  assert aux["mlp"].shape == (STEPS, DEPTH, BATCH, TOKENS, 2 * WIDTH)
  assert_close(block, stacked(inters, ("encoder", "layers", "__call__")))
  np.testing.assert_allclose(aux["attn"].sum(-1), 1.0, rtol=1e-5)  # softmax rows

  labels = [s.label for s in lb.sow_sites(model)]
  assert labels == [
    "encoder/layers/__call__[0]",
    "encoder/layers/__call__[1][attn]",
    "encoder/layers/__call__[1][mlp]",
  ]
  assert all(
    s.transforms[0].kind == "scan" and s.transforms[0].length == DEPTH for s in lb.sow_sites(model)
  )


def test_vit_everything_recorded_with_capture_true(graph):
  model = lb.ToNNX(ViT(), rngs=nnx.Rngs(0), capture_intermediates=True)
  lb.lazy_init(model, IMAGES[0], capacity=STEPS)
  logits = run_jitted(model, IMAGES, graph)
  want_logits, inters = linen_reference(lb.linen_variables(model), True)
  np.testing.assert_allclose(logits, want_logits, rtol=RTOL, atol=ATOL)

  rec = lb.recorded(model)["intermediates"]
  paths = leaf_paths(inters[0])
  # Tuple-returning modules among them: the attention, the block and the encoder.
  assert {
    ("encoder", "layers", "SelfAttention_0", "__call__"),
    ("encoder", "layers", "__call__"),
    ("encoder", "__call__"),
    ("embedding", "__call__"),
    ("__call__",),
  } <= set(paths)
  for path in paths:
    got = rec
    for key in path:
      got = got[key]
    assert_close(got, stacked(inters, path))
