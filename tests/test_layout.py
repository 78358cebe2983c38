"""Checkpoint layouts: Linen nn.scan params <-> per-layer params <-> NNX stacks or layer lists."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge import _compat
from loopbridge._layers import param_layout

import models

DEPTH, WIDTH = 3, 8


class UnrolledMLP(nn.Module):
  """The same network as models.MLP, unrolled in Python: per-layer params `layers_{i}`."""

  depth: int = DEPTH
  features: int = WIDTH

  @nn.compact
  def __call__(self, x):
    for i in range(self.depth):
      x, _ = models.Block(self.features, name=f"layers_{i}")(x, None)
    return x


class NNXBlock(nnx.Module):
  """NNX port of models.Block; the attribute is named like the Linen submodule."""

  def __init__(self, features: int, rngs: nnx.Rngs):
    self.Dense_0 = nnx.Linear(features, features, rngs=rngs)

  def __call__(self, x):
    return nnx.relu(self.Dense_0(x))


def _linen_scanned():
  model = models.MLP(depth=DEPTH, features=WIDTH)
  x = jax.random.normal(jax.random.key(1), (2, WIDTH))
  variables = model.init(jax.random.key(0), x)
  return model, variables, x


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert jnp.result_type(x) == jnp.result_type(y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_scanned_layers_round_trips_are_exact():
  _, variables, _ = _linen_scanned()
  scanned = variables["params"]["ScanBlock_0"]
  per_layer = lb.layers.unstack_params(scanned)
  assert sorted(per_layer) == [f"layers_{i}" for i in range(DEPTH)]
  for i in range(DEPTH):  # independent reference: index the scanned leaves directly
    np.testing.assert_array_equal(
      per_layer[f"layers_{i}"]["Dense_0"]["kernel"], scanned["Dense_0"]["kernel"][i]
    )
  _assert_trees_equal(lb.layers.stack_params(per_layer), scanned)
  named = lb.layers.unstack_params(scanned, names="block{}")
  _assert_trees_equal(lb.layers.stack_params(named, names="block{}"), scanned)
  as_list = lb.layers.unstack_params(scanned, names=None)
  _assert_trees_equal(lb.layers.stack_params(as_list), scanned)
  by_fn = lb.layers.unstack_params(scanned, names=lambda i: f"h{i:02d}")
  assert sorted(by_fn) == ["h00", "h01", "h02"]
  _assert_trees_equal(lb.layers.stack_params(by_fn, names=lambda i: f"h{i:02d}"), scanned)


def test_mixed_dtypes_round_trip_exactly():
  scanned = {
    "a": jnp.arange(6, dtype=jnp.bfloat16).reshape(3, 2),
    "b": {"c": jnp.arange(3, dtype=jnp.int8)},
  }
  _assert_trees_equal(lb.layers.stack_params(lb.layers.unstack_params(scanned)), scanned)


def test_linen_scanned_checkpoint_in_nnx_port_gives_linen_outputs(graph):
  model, variables, x = _linen_scanned()
  expected = model.apply(variables, x)
  scanned = variables["params"]["ScanBlock_0"]

  stacked = lb.layers.load_params(
    scanned, lb.layers.stack([NNXBlock(WIDTH, nnx.Rngs(i)) for i in range(DEPTH)])
  )
  np.testing.assert_allclose(lb.layers.scan(stacked, x), expected, rtol=1e-6, atol=1e-6)

  def body(i, carry):
    s, y = carry
    return s, lb.layers.layer(s, i)(y)

  kw = {"graph": graph} if _compat.HAS_GRAPH_SWITCH else {}
  _, y = nnx.fori_loop(0, DEPTH, body, (stacked, x), **kw)
  np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)

  layers = lb.layers.load_params(scanned, [NNXBlock(WIDTH, nnx.Rngs(9)) for _ in range(DEPTH)])
  y = x
  for layer in layers:
    y = layer(y)
  np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)

  # Back out: exact round trips to both Linen layouts.
  _assert_trees_equal(lb.layers.export_params(stacked), scanned)
  _assert_trees_equal(lb.layers.export_params(layers), scanned)
  _assert_trees_equal(
    lb.layers.export_params(stacked, scanned=False), lb.layers.unstack_params(scanned)
  )
  _assert_trees_equal(
    lb.layers.export_params(layers, scanned=False, names=None),
    lb.layers.unstack_params(scanned, names=None),
  )


def test_scanned_checkpoint_runs_in_unrolled_linen_model_and_back():
  model, variables, x = _linen_scanned()
  per_layer = lb.layers.unstack_params(variables["params"]["ScanBlock_0"])
  unrolled = UnrolledMLP()
  # The unrolled model's own init has exactly this structure.
  reference_shapes = jax.eval_shape(unrolled.init, jax.random.key(0), x)["params"]
  assert jax.tree.structure(reference_shapes) == jax.tree.structure(per_layer)
  np.testing.assert_array_equal(unrolled.apply({"params": per_layer}, x), model.apply(variables, x))
  # per-layer checkpoint straight into an NNX stack.
  stacked = lb.layers.load_params(
    per_layer, lb.layers.stack([NNXBlock(WIDTH, nnx.Rngs(i)) for i in range(DEPTH)])
  )
  np.testing.assert_allclose(
    lb.layers.scan(stacked, x), model.apply(variables, x), rtol=1e-6, atol=1e-6
  )


def test_boxed_linen_params_are_unboxed():
  scanned = {"kernel": nn.Partitioned(jnp.ones((2, 3)), names=("layers", None))}
  per_layer = lb.layers.unstack_params(scanned)
  np.testing.assert_array_equal(per_layer["layers_1"]["kernel"], jnp.ones(3))


def test_layout_errors():
  scanned = {"Dense_0": {"kernel": jnp.ones((3, 4, 4)), "bias": jnp.zeros((3, 4))}}
  with pytest.raises(lb.layers.StackError, match=r"leading axes disagree"):
    lb.layers.unstack_params({"a": jnp.ones((3, 2)), "b": jnp.ones((2, 2))})
  with pytest.raises(lb.layers.StackError, match=r"`\['a'\]` is a scalar"):
    lb.layers.unstack_params({"a": jnp.ones(())})
  with pytest.raises(lb.layers.StackError, match=r"names='layers' must be a format string"):
    lb.layers.unstack_params(scanned, names="layers")
  with pytest.raises(lb.layers.StackError, match=r"no per-layer entries 'layers_0', 'layers_1'"):
    lb.layers.stack_params({"block_0": {}})
  with pytest.raises(lb.layers.StackError, match=r"stop at 'layers_1' but 'layers_2' exists"):
    lb.layers.stack_params({"layers_0": {"k": jnp.ones(2)}, "layers_2": {"k": jnp.ones(2)}})
  with pytest.raises(
    lb.layers.StackError,
    match=r"layer 1 differs from layer 0 at `\['k'\]`: layer 0 "
    r"has float32\[2\], layer 1 has float32\[3\]",
  ):
    lb.layers.stack_params([{"k": jnp.ones(2)}, {"k": jnp.ones(3)}])

  stacked = lb.layers.stack([NNXBlock(4, nnx.Rngs(i)) for i in range(3)])
  with pytest.raises(
    lb.layers.StackError,
    match=r"has a Param at `Dense_0/(bias|kernel)` that the checkpoint "
    r"lacks(.|\n)*self.Dense_0 = nnx.Linear",
  ):
    lb.layers.load_params({"Dense_1": scanned["Dense_0"]}, stacked)
  with pytest.raises(lb.layers.StackError, match=r"checkpoint has 2 layers, the NNX stack 3"):
    lb.layers.load_params(jax.tree.map(lambda a: a[:2], scanned), stacked)
  with pytest.raises(
    lb.layers.StackError,
    match=r"`Dense_0/kernel` is float32\[3, 4, 5\] in the "
    r"checkpoint but float32\[3, 4, 4\] in the NNX module",
  ):
    lb.layers.load_params(
      {"Dense_0": {"kernel": jnp.ones((3, 4, 5)), "bias": jnp.zeros((3, 4))}}, stacked
    )
  with pytest.raises(
    lb.layers.StackError, match=r"checkpoint has 3 layers, the list of NNX layers 2"
  ):
    lb.layers.load_params(scanned, [NNXBlock(4, nnx.Rngs(0)), NNXBlock(4, nnx.Rngs(1))])


# ----------------------------------------------------------------------------- a whole port
class UnrolledPort(nnx.Module):
  """NNX port of UnrolledMLP: attributes named like the Linen submodules (`layers_{i}`)."""

  def __init__(self, rngs: nnx.Rngs, depth: int = DEPTH, features: int = WIDTH):
    for i in range(depth):
      setattr(self, f"layers_{i}", NNXBlock(features, rngs))

  def __call__(self, x):
    for i in range(DEPTH):
      x = getattr(self, f"layers_{i}")(x)
    return x


def test_linen_key_merges_list_indices():
  assert param_layout.linen_key(("cells", 0, "Dense_0", "kernel")) == (
    "cells_0",
    "Dense_0",
    "kernel",
  )
  assert param_layout.linen_key((0, "kernel")) == ("0", "kernel")  # nothing to merge into


def test_unstack_listed_gives_a_list_port_its_per_layer_entries():
  _, variables, _ = _linen_scanned()
  params = variables["params"]
  listed = [(f"ScanBlock_0_{i}", "Dense_0", k) for i in range(DEPTH) for k in ("kernel", "bias")]
  split = param_layout.unstack_listed(params, listed)
  assert sorted(split) == [f"ScanBlock_0_{i}" for i in range(DEPTH)]
  _assert_trees_equal(
    split, lb.layers.unstack_params(params["ScanBlock_0"], names="ScanBlock_0_{}")
  )
  # Subtrees the port does not hold as a list are kept as they are.
  kept = param_layout.unstack_listed(params, [("ScanBlock_0", "Dense_0", "kernel")])
  _assert_trees_equal(kept, jax.tree.map(lambda a: a, dict(params)))
  with pytest.raises(
    lb.layers.StackError,
    match=r"the Linen param 'ScanBlock_0/Dense_0/\w+' stacks 3 layers \(nn.scan\) but the "
    r"port's list has 2; build the port with as many layers",
  ):
    param_layout.unstack_listed(params, [k for k in listed if not k[0].endswith("_2")])


def test_load_into_port_gives_the_port_the_linen_outputs():
  unrolled = UnrolledMLP()
  x = jax.random.normal(jax.random.key(1), (2, WIDTH))
  variables = unrolled.init(jax.random.key(0), x)
  port = UnrolledPort(nnx.Rngs(5))
  assert param_layout.load_into_port(port, variables) == 2 * DEPTH
  np.testing.assert_allclose(port(x), unrolled.apply(variables, x), rtol=1e-6, atol=1e-6)


def test_load_into_port_errors():
  unrolled = UnrolledMLP()
  variables = unrolled.init(jax.random.key(0), jnp.ones((1, WIDTH)))
  with pytest.raises(
    lb.layers.StackError,
    match=r"'layers_0/Dense_0/\w+' is \[8(, 8)?\] in the Linen model but 'layers_0/Dense_0/\w+' "
    r"is \[4(, 4)?\] in the port; build the port with the same widths",
  ):
    param_layout.load_into_port(UnrolledPort(nnx.Rngs(0), features=4), variables)
  with pytest.raises(
    lb.layers.StackError,
    match=r"the Linen param 'layers_2/Dense_0/\w+' has no Param in the port \(2 such\)\. "
    r"Name the port's attributes like the Linen submodules",
  ):
    param_layout.load_into_port(UnrolledPort(nnx.Rngs(0), depth=2), variables)
  without_bias = UnrolledPort(nnx.Rngs(0))
  without_bias.layers_1.Dense_0 = nnx.Linear(WIDTH, WIDTH, use_bias=False, rngs=nnx.Rngs(0))
  with pytest.raises(
    lb.layers.StackError,
    match=r"the Linen param 'layers_1/Dense_0/bias' has no Param in the port \(1 such\), "
    r"though the port's layer at that path exists\. Why: the port's layer 'layers_1/Dense_0' "
    r"has no 'bias' \(built with use_bias=False\?\).*Fix: build the port's layer "
    r"'layers_1/Dense_0' with use_bias=True",
  ):
    param_layout.load_into_port(without_bias, variables)
  with pytest.raises(
    lb.layers.StackError,
    match=r"the port has a Param at 'layers_0/Dense_0/\w+' that the Linen model lacks "
    r"\(2 such; Linen params: layers_1/.*\)\. my hint",
  ):
    params = {k: v for k, v in variables["params"].items() if k != "layers_0"}
    param_layout.load_into_port(UnrolledPort(nnx.Rngs(0)), {"params": params}, hint="my hint")
