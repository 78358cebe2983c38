"""lb.layers.stack / unstack / layer / scan against plain NNX references."""

from __future__ import annotations

import itertools

import flax.linen as nn
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings

import loopbridge as lb
from loopbridge import _compat
from loopbridge._core import recorder as _recorder
from loopbridge._layers import stack as stack_module

from conftest import graph_kw
from models import MLP

get = _compat.variable_value
put = _compat.set_variable_value
SLOPE = 0.01


def _linears(depth: int, width: int = 8, seed: int = 0) -> list[nnx.Linear]:
  rngs = nnx.Rngs(seed)
  return [nnx.Linear(width, width, rngs=rngs) for _ in range(depth)]


def _python_forward(layers, x):
  """The seed's working forward: a Python loop over the list, leaky_relu between layers."""
  for layer in layers[:-1]:
    x = nnx.leaky_relu(layer(x), negative_slope=SLOPE)
  return layers[-1](x)


class Tagged(nnx.Variable):
  """A custom Variable type carrying metadata, to check types and metadata survive."""


class Block(nnx.Module):
  """A layer with a Param, a batch statistic written on every call, and tagged metadata."""

  def __init__(self, width: int, rngs: nnx.Rngs):
    self.linear = nnx.Linear(width, width, rngs=rngs)
    self.calls = nnx.BatchStat(jnp.zeros((), jnp.int32))
    self.last = nnx.BatchStat(jnp.zeros((width,)))
    self.tag = Tagged(jnp.arange(3.0), note="kept", axes=("a",))

  def __call__(self, x, scale=1.0):
    put(self.calls, get(self.calls) + 1)
    y = jnp.tanh(self.linear(x)) * scale
    put(self.last, y.sum(0))
    return y


def _assert_same_module(a, b, rtol=0.0, atol=0.0):
  """Same class, same Variable paths, types, metadata and values (exact unless a tolerance)."""
  assert type(a) is type(b)
  va, vb = stack_module.variables_by_path(a), stack_module.variables_by_path(b)
  assert list(va) == list(vb)
  for path in va:
    assert type(va[path]) is type(vb[path]), path
    assert va[path].get_metadata() == vb[path].get_metadata(), path
    xa, xb = get(va[path]), get(vb[path])
    assert jnp.result_type(xa) == jnp.result_type(xb), path
    if jnp.issubdtype(jnp.result_type(xa), jax.dtypes.prng_key):
      xa, xb = jax.random.key_data(xa), jax.random.key_data(xb)
    if rtol or atol:
      np.testing.assert_allclose(np.asarray(xa), np.asarray(xb), rtol, atol, err_msg=str(path))
    else:
      np.testing.assert_array_equal(np.asarray(xa), np.asarray(xb), err_msg=str(path))


# --- the seed's intent ---------------------------------------------------------------------------


class SeedMLP(nnx.Module):
  """The seed's MLP with equal-width hidden layers kept as a stack, plus the output layer."""

  def __init__(self, layers: list[nnx.Linear]):
    self.hidden = lb.layers.stack(layers[:-1])
    self.out = layers[-1]

  def forward_fori_loop(self, x, **kw):
    def body(i, carry):
      hidden, x = carry
      x = nnx.leaky_relu(lb.layers.layer(hidden, i)(x), negative_slope=SLOPE)
      return hidden, x

    _, x = nnx.fori_loop(0, 3, body, (self.hidden, x), **kw)
    return self.out(x)


def test_seed_forward_fori_loop_equals_python_loop_bit_exact(graph):
  layers = _linears(4)
  x = jax.random.normal(jax.random.key(1), (5, 8))
  expected = _python_forward(layers, x)
  model = SeedMLP(layers)
  np.testing.assert_array_equal(model.forward_fori_loop(x, **graph_kw(graph)), expected)
  jitted = nnx.jit(lambda m, x: m.forward_fori_loop(x, **graph_kw(graph)))
  np.testing.assert_array_equal(jitted(model, x), expected)


def test_seed_heterogeneous_mlp_gets_clear_error():
  rngs = nnx.Rngs(0)
  widths = [12, 26, 12, 6, 3]  # the seed's [in, 265, 128, 64, out], scaled down
  layers = [nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(widths)]
  with pytest.raises(
    lb.layers.StackError,
    match=r"layer 1 differs from layer 0 at `(bias|kernel)`: "
    r"layer 0 has Param float32\[\d+(,\d+)?\], layer 1 has Param float32"
    r"(.|\n)*Python(.|\n)*nnx.switch(.|\n)*group",
  ):
    lb.layers.stack(layers)


def test_seed_vmap_stack_is_a_stack_of_two():
  """The seed's nnx.vmap-built 'single Linear' is a stack: unstack shows both layers."""

  @nnx.vmap(in_axes=0, out_axes=0)
  def create_layer(key):
    return nnx.Linear(8, 8, rngs=nnx.Rngs(key))

  stacked = create_layer(jax.random.split(jax.random.key(0), 2))
  layers = lb.layers.unstack(stacked)
  assert len(layers) == 2
  x = jnp.ones((3, 8))
  np.testing.assert_array_equal(lb.layers.scan(stacked, x), layers[1](layers[0](x)))
  _assert_same_module(lb.layers.stack(layers), stacked)


# --- stack / unstack -----------------------------------------------------------------------------


def test_stack_layout_matches_manual_stack_and_round_trips():
  blocks = [Block(4, nnx.Rngs(i)) for i in range(3)]
  stacked = lb.layers.stack(blocks)
  assert type(stacked) is Block and type(stacked.tag) is Tagged
  assert stacked.tag.get_metadata() == blocks[0].tag.get_metadata()
  np.testing.assert_array_equal(
    get(stacked.linear.kernel), np.stack([np.asarray(get(b.linear.kernel)) for b in blocks])
  )
  assert get(stacked.calls).shape == (3,)
  for original, back in zip(blocks, lb.layers.unstack(stacked), strict=True):
    _assert_same_module(original, back)


def test_stack_copies_values():
  layers = _linears(2)
  stacked = lb.layers.stack(layers)
  put(layers[0].kernel, jnp.zeros((8, 8)))
  assert float(jnp.abs(get(stacked.kernel)[0]).sum()) > 0


_DTYPES = [np.float32, np.float16, jnp.bfloat16, np.int32, np.uint8, np.bool_]


class Leaves(nnx.Module):
  """A layer whose Variables have arbitrary shapes and dtypes (for the property tests)."""

  def __init__(self, specs, seed):
    rng = np.random.default_rng(seed)  # numpy data: no compilation per random shape
    params = [nnx.Param(jnp.asarray((rng.normal(size=s) * 3).astype(d))) for s, d in specs]
    self.params = nnx.List(params) if hasattr(nnx, "List") else params
    self.stat = nnx.BatchStat(jnp.full((), seed, jnp.int32))


_specs = st.lists(
  st.tuples(st.lists(st.integers(0, 3), max_size=3).map(tuple), st.sampled_from(_DTYPES)),
  min_size=1,
  max_size=3,
)


@pytest.mark.slow  # hypothesis; run by `-m slow` (.ci/run)
@settings(max_examples=25, deadline=None)
@given(specs=_specs, depth=st.integers(1, 5))
def test_property_unstack_inverts_stack(specs, depth):
  layers = [Leaves(specs, seed) for seed in range(depth)]
  stacked = lb.layers.stack(layers)
  for j, (shape, dtype) in enumerate(specs):
    value = get(stacked.params[j])
    assert value.shape == (depth, *shape) and value.dtype == dtype
  back = lb.layers.unstack(stacked)
  assert len(back) == depth
  for original, restored in zip(layers, back):
    _assert_same_module(original, restored)
  _assert_same_module(lb.layers.stack(back), stacked)


@pytest.mark.slow  # hypothesis; run by `-m slow` (.ci/run)
@settings(max_examples=25, deadline=None)
@given(specs=_specs, which=st.integers(0, 2), change=st.sampled_from(["shape", "dtype"]))
def test_property_differing_member_names_path_and_both_shapes(specs, which, change):
  which = which % len(specs)
  shape, dtype = specs[which]
  other = list(specs)
  if change == "shape":
    other[which] = ((*shape, 2), dtype)
  else:
    other[which] = (shape, np.int8)
  new_shape, new_dtype = other[which]
  fmt = lambda s, d: rf"{jnp.dtype(d).name}\[{','.join(map(str, s))}\]"  # noqa: E731
  with pytest.raises(
    lb.layers.StackError,
    match=rf"layer 1 differs from layer 0 at `params/{which}`: "
    rf"layer 0 has Param {fmt(shape, dtype)}, layer 1 has Param "
    rf"{fmt(new_shape, new_dtype)}",
  ):
    lb.layers.stack([Leaves(specs, 0), Leaves(other, 1)])


def test_stack_errors():
  with pytest.raises(lb.layers.StackError, match="no modules"):
    lb.layers.stack([])
  with pytest.raises(lb.layers.StackError, match="item 1 is a dict, not an NNX module"):
    lb.layers.stack([nnx.Linear(2, 2, rngs=nnx.Rngs(0)), {"kernel": jnp.ones((2, 2))}])
  with pytest.raises(lb.layers.StackError, match=r"at `in_features`(.|\n)*static 2(.|\n)*static 3"):
    # Same Variables, different static attribute: would silently keep layer 0's.
    a, b = nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    put(b.kernel, jnp.ones((2, 2)))
    lb.layers.stack([a, b])
  with pytest.raises(
    lb.layers.StackError,
    match="layer 1 differs from layer 0 at `bias`: layer 0 has "
    r"Param float32\[2\], layer 1 has (Param )?None",
  ):
    lb.layers.stack(
      [nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Linear(2, 2, use_bias=False, rngs=nnx.Rngs(0))]
    )


def test_unstack_errors():
  with pytest.raises(
    lb.layers.StackError, match="`calls` is a scalar, so this module is not a layer"
  ):
    lb.layers.unstack(Block(4, nnx.Rngs(0)))
  with pytest.raises(
    lb.layers.StackError,
    match=r"leading axes disagree \(`bias` has 2 layers, "
    r"`kernel` has 3\)",
  ):
    lb.layers.unstack(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
  with pytest.raises(lb.layers.StackError, match="expects a stacked NNX module"):
    lb.layers.unstack([nnx.Linear(2, 2, rngs=nnx.Rngs(0))])


# --- lb.layers.layer ------------------------------------------------------------------------------


def test_layer_concrete_index_reads_like_the_layer():
  layers = _linears(3)
  stacked = lb.layers.stack(layers)
  x = jnp.ones((2, 8))
  for i in (0, 2, -1):
    view = lb.layers.layer(stacked, i)
    assert isinstance(view, nnx.Linear) and isinstance(view.kernel, nnx.Param)
    np.testing.assert_array_equal(view(x), layers[i](x))
  with pytest.raises(IndexError, match="layer index 3 is out of range for a stack of 3"):
    lb.layers.layer(stacked, 3)
  with pytest.raises(lb.layers.StackError, match=r"must be an integer scalar, got float32\[\]"):
    lb.layers.layer(stacked, jnp.float32(1))


def test_layer_write_updates_only_that_layer():
  layers = _linears(3)
  stacked = lb.layers.stack(layers)
  put(lb.layers.layer(stacked, 1).kernel, jnp.full((8, 8), 7.0))
  expected = np.stack([np.asarray(get(layer.kernel)) for layer in layers])
  expected[1] = 7.0
  np.testing.assert_array_equal(get(stacked.kernel), expected)


def test_layer_writes_in_fori_loop_land_in_the_stack(graph):
  blocks = [Block(4, nnx.Rngs(i)) for i in range(3)]
  x = jax.random.normal(jax.random.key(0), (2, 4))
  ref = x
  for b in blocks:  # plain NNX reference: each block updates its own statistics
    ref = b(ref, 0.5)
  stacked = lb.layers.stack([Block(4, nnx.Rngs(i)) for i in range(3)])

  def body(i, carry):
    s, x = carry
    return s, lb.layers.layer(s, i)(x, 0.5)

  _, y = nnx.fori_loop(0, 3, body, (stacked, x), **graph_kw(graph))
  # Eager reference vs one compiled loop: equal up to float rounding (XLA may fuse differently).
  np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(get(stacked.calls), [1, 1, 1])
  np.testing.assert_allclose(
    get(stacked.last), np.stack([get(b.last) for b in blocks]), rtol=1e-6, atol=1e-6
  )


class Noisy(nnx.Module):
  """A layer holding its own rng stream (Dropout) and batch statistics (BatchNorm)."""

  def __init__(self, seed: int):
    self.lin = nnx.Linear(4, 4, rngs=nnx.Rngs(seed))
    self.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=seed))
    self.norm = nnx.BatchNorm(4, rngs=nnx.Rngs(seed))

  def __call__(self, x):
    return self.norm(self.drop(self.lin(x)))


def test_layers_with_rng_streams_and_batch_stats(graph):
  x = jax.random.normal(jax.random.key(0), (5, 4))
  reference = [Noisy(i) for i in range(3)]
  expected = x
  for layer in reference:  # plain NNX: each layer draws from its own stream, updates its stats
    expected = layer(expected)
  stacked = lb.layers.stack([Noisy(i) for i in range(3)])
  _, y = nnx.fori_loop(
    0, 3, lambda i, c: (c[0], lb.layers.layer(c[0], i)(c[1])), (stacked, x), **graph_kw(graph)
  )
  # Same dropout masks (each layer's own key and count); BatchNorm may differ by an ulp between
  # the compiled loop and eager ops.
  np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
  for got, want in zip(lb.layers.unstack(stacked), reference):
    _assert_same_module(got, want, rtol=1e-6, atol=1e-6)


def test_layer_with_lb_fori_loop_if_available():
  fori_loop = getattr(lb, "fori_loop", None)
  if fori_loop is None:
    pytest.skip("lb.fori_loop is not in this build")
  layers = _linears(3)
  stacked = lb.layers.stack(layers)
  x = jnp.ones((2, 8))
  _, y = fori_loop(0, 3, lambda i, c: (c[0], lb.layers.layer(c[0], i)(c[1])), (stacked, x))
  np.testing.assert_array_equal(y, layers[2](layers[1](layers[0](x))))


# --- lb.layers.scan ------------------------------------------------------------------------------


@pytest.mark.parametrize("remat", [False, True])
def test_scan_layers_equals_python_loop_and_writes_land(remat):
  blocks = [Block(4, nnx.Rngs(i)) for i in range(3)]
  x = jax.random.normal(jax.random.key(0), (2, 4))
  ref = x
  for b in blocks:
    ref = b(ref, 0.5)
  stacked = lb.layers.stack([Block(4, nnx.Rngs(i)) for i in range(3)])
  y = nnx.jit(lambda s, x: lb.layers.scan(s, x, 0.5, remat=remat))(stacked, x)
  np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(get(stacked.calls), [1, 1, 1])
  np.testing.assert_allclose(
    get(stacked.last), np.stack([get(b.last) for b in blocks]), rtol=1e-6, atol=1e-6
  )


def test_scan_layers_grad_with_and_without_remat_equals_python_loop():
  layers = _linears(3, width=4)
  x = jax.random.normal(jax.random.key(0), (2, 4))

  def loss_list(layers):
    y = x
    for layer in layers:
      y = jnp.tanh(layer(y))
    return (y**2).sum()

  call = lambda layer, y: jnp.tanh(layer(y))  # noqa: E731
  ref = nnx.grad(loss_list)(layers)
  ref_kernel = np.stack([np.asarray(get(ref[i]["kernel"])) for i in range(3)])
  for remat in (False, True):
    grads = nnx.grad(
      lambda s, remat=remat: (lb.layers.scan(s, x, call=call, remat=remat) ** 2).sum()
    )(lb.layers.stack(layers))
    np.testing.assert_allclose(get(grads["kernel"]), ref_kernel, rtol=1e-5, atol=1e-6)


def test_scan_layers_reverse_and_errors():
  layers = _linears(3, width=4)
  x = jnp.ones((1, 4))
  np.testing.assert_allclose(
    lb.layers.scan(lb.layers.stack(layers), x, reverse=True),
    layers[0](layers[1](layers[2](x))),
    rtol=1e-6,
  )
  with pytest.raises(lb.layers.StackError, match=r"lb\.layers\.scan: `calls` is a scalar"):
    lb.layers.scan(Block(4, nnx.Rngs(0)), x)


# --- sowing layers (buffers declared with lb.preallocate) ----------------------------------------


class Sowing(nnx.Module):
  """A layer that sows its activation natively (no loopbridge code in the layer)."""

  def __init__(self, rngs: nnx.Rngs):
    self.lin = nnx.Linear(4, 4, rngs=rngs)

  def __call__(self, x):
    h = jnp.tanh(self.lin(x))
    self.sow(nnx.Intermediate, "h", h)
    return h


class SowingNet(nnx.Module):
  def __init__(self, depth: int):
    self.layers = lb.layers.stack([Sowing(nnx.Rngs(i)) for i in range(depth)])

  def scan(self, x):
    return lb.layers.scan(self.layers, x)

  def fori(self, x):
    _, y = nnx.fori_loop(
      0, 3, lambda i, c: (c[0], lb.layers.layer(c[0], i)(c[1])), (self.layers, x)
    )
    return y


@pytest.mark.parametrize("how", ["scan", "fori"])
def test_sowing_layers_record_every_layer_of_every_call(how):
  xs = [jax.random.normal(jax.random.key(k), (2, 4)) for k in range(2)]
  # Independent reference: the same layers, activations computed step by step.
  ref_layers = [Sowing(nnx.Rngs(i)) for i in range(3)]
  expected = []
  for x in xs:
    row = []
    for layer in ref_layers:
      x = jnp.tanh(layer.lin(x))
      row.append(x)
    expected.append(np.stack(row))
  net = SowingNet(3)
  # Buffers are declared through the scan path; lb.layers.layer views then write into them too.
  lb.preallocate(net, xs[0], capacity=4, method="scan")
  step = nnx.jit(lambda net, x: getattr(net, how)(x))
  for x in xs:
    step(net, x)
  recorded = lb.recorded(net)["layers"]["intermediates"]["h"]  # [calls, layers, ...]
  np.testing.assert_allclose(recorded, np.stack(expected), rtol=1e-6, atol=1e-6)


def test_unstack_recording_layers_keeps_each_layers_records():
  """Each unstacked layer reads its own records `(calls, *value)` and records further calls."""
  xs = [jax.random.normal(jax.random.key(k), (2, 4)) for k in range(2)]
  ref_layers = [Sowing(nnx.Rngs(i)) for i in range(3)]
  expected, x = [], xs[0]
  for layer in ref_layers:  # plain NNX, step by step
    x = jnp.tanh(layer.lin(x))
    expected.append(x)
  net = SowingNet(3)
  lb.preallocate(net, xs[0], capacity=4, method="scan")
  net.scan(xs[0])
  layers = lb.layers.unstack(net.layers)
  for layer, want in zip(layers, expected, strict=True):
    got = lb.recorded(layer)["intermediates"]["h"]
    assert got.shape == (1, 2, 4)
    np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=1e-6)
  layers[0](xs[1])  # a later call appends, without a spurious overflow
  got = lb.recorded(layers[0])["intermediates"]["h"]
  assert got.shape == (2, 2, 4)
  np.testing.assert_allclose(got[1], jnp.tanh(ref_layers[0].lin(xs[1])), rtol=1e-6, atol=1e-6)
  assert [s.shape for s in _recorder.sites_of(layers[0]) or ()] == [
    (2, 4)
  ]  # re-declarations see it


def test_stack_of_recording_layers_reads_calls_first_and_unstacks_back():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  layers = [lb.preallocate(Sowing(nnx.Rngs(i)), x, capacity=3) for i in range(2)]
  for layer in layers:
    layer(x)
  stacked = lb.layers.stack(layers)
  got = lb.recorded(stacked)["intermediates"]["h"]  # [calls, layers, ...], as a vmap stack
  assert got.shape == (1, 2, 2, 4)
  for i in range(2):
    np.testing.assert_allclose(
      got[0, i], jnp.tanh(Sowing(nnx.Rngs(i)).lin(x)), rtol=1e-6, atol=1e-6
    )
  assert lb.recorded(layers[0])["intermediates"]["h"].shape == (1, 2, 4)  # originals untouched
  back = lb.layers.unstack(stacked)
  np.testing.assert_allclose(
    lb.recorded(back[1])["intermediates"]["h"], lb.recorded(layers[1])["intermediates"]["h"]
  )


def test_stacked_count_vectors_get_the_layer_axis_and_layer_views_write_their_entry():
  """One count vector per recorder: stacking gives it the layer axis, `lb.layers.layer`
  advances only its layer's entry, and unstacking gives each layer its own vector back."""
  x = jax.random.normal(jax.random.key(0), (2, 4))
  layers = [lb.preallocate(Sowing(nnx.Rngs(i)), x, capacity=3) for i in range(2)]
  layers[1](x)  # layer 1 has one record, layer 0 none
  stacked = lb.layers.stack(layers)
  (vector,) = jax.tree.leaves(nnx.state(stacked, lb.Count))
  assert vector.tolist() == [[0], [1]]
  lb.layers.layer(stacked, 0)(x)
  lb.layers.layer(stacked, 1)(x)
  lb.layers.layer(stacked, 1)(x)
  (vector,) = jax.tree.leaves(nnx.state(stacked, lb.Count))
  assert vector.tolist() == [[1], [3]]
  first, second = lb.layers.unstack(stacked)
  assert int(lb.counts(first)["intermediates"]["h"]) == 1
  assert int(lb.counts(second)["intermediates"]["h"]) == 3
  np.testing.assert_allclose(
    lb.recorded(second)["intermediates"]["h"],
    np.stack([jnp.tanh(Sowing(nnx.Rngs(1)).lin(x))] * 3),
    rtol=1e-6,
    atol=1e-6,
  )
  lb.reset(stacked)
  assert jax.tree.leaves(nnx.state(stacked, lb.Count))[0].tolist() == [[0], [0]]


@pytest.mark.slow
def test_unstacked_recording_layers_stack_again():
  """Found by the stateful test: unstacking left a `stack_axes=0` metadata entry that a
  never-stacked buffer does not have, so the unstacked layers could not be stacked again."""

  def declared():
    model = lb.ToNNX(MLP(2, 3), rngs=nnx.Rngs(0))
    return lb.lazy_init(model, jnp.ones((1, 3)), capacity=2)

  first, second = lb.layers.unstack(lb.layers.stack([declared(), declared()]))
  restacked = lb.layers.stack([first, second])
  lb.layers.stack([first, declared()])  # and beside a layer that was never stacked
  x = jnp.arange(3.0)[None]
  first(x)
  np.testing.assert_array_equal(lb.recorded(first)["intermediates"]["x"], x[None])
  assert lb.recorded(restacked)["intermediates"]["x"].shape == (0, 2, 1, 3)


class LinenLayer(nn.Module):
  """A Linen layer that sows its activation (the seeds' bridged layer)."""

  @nn.compact
  def __call__(self, x):
    h = jnp.tanh(nn.Dense(4)(x))
    self.sow("intermediates", "h", h)
    return h


def _bridged_layers(x, depth=3):
  return [
    lb.lazy_init(lb.ToNNX(LinenLayer(), rngs=nnx.Rngs(i)), x, capacity=4) for i in range(depth)
  ]


@pytest.mark.parametrize("how", ["eager", "fori"])
def test_layer_of_a_stack_of_bridged_linen_layers_runs_and_equals_linen(how, graph):
  # The third seed's pattern with lb.ToNNX layers: layers[i] with a loop counter. Reference:
  # plain Linen apply of each layer's own variables, layer after layer, call after call.
  x = jax.random.normal(jax.random.key(0), (2, 4))
  layers = _bridged_layers(x)
  variables = [lb.linen_variables(layer) for layer in layers]
  stacked = lb.layers.stack(layers)

  def forward(stacked, x):
    if how == "eager":
      for i in range(3):
        x = lb.layers.layer(stacked, i)(x)
      return x
    body = lambda i, c: (c[0], lb.layers.layer(c[0], i)(c[1]))  # noqa: E731
    return nnx.fori_loop(0, 3, body, (stacked, x), **graph_kw(graph))[1]

  run = forward if how == "eager" else nnx.jit(forward, **graph_kw(graph))
  want_records = []
  for call in range(2):
    h, row = x + call, []
    for v in variables:
      h, state = LinenLayer().apply(v, h, mutable=["intermediates"])
      row.append(state["intermediates"]["h"][0])
    want_records.append(np.stack(row))
    np.testing.assert_allclose(run(stacked, x + call), h, rtol=1e-6, atol=1e-6)
  got = lb.recorded(stacked)["intermediates"]["h"]  # [calls, layers, ...]
  np.testing.assert_allclose(got, np.stack(want_records), rtol=1e-6, atol=1e-6)
  assert jax.tree.leaves(nnx.state(stacked, lb.Count))[0].tolist() == [[2], [2], [2]]
  np.testing.assert_allclose(  # the params were read, not changed
    lb.linen_variables(lb.layers.unstack(stacked)[2])["params"]["Dense_0"]["kernel"],
    variables[2]["params"]["Dense_0"]["kernel"],
  )


def test_layers_of_a_bridged_stack_count_apart_and_read_back_honestly():
  # lb.layers.layer(stack, 1) runs layer 1 alone: only its count advances. Reading the stack
  # back refuses while its layers hold different numbers of records (two never ran; their
  # slots hold nothing sown), and names the per-layer read; lb.counts gives each layer's.
  # Reference: plain Linen apply of each layer's own variables.
  x = jax.random.normal(jax.random.key(0), (2, 4))
  layers = _bridged_layers(x)
  variables = [lb.linen_variables(layer) for layer in layers]
  stacked = lb.layers.stack(layers)
  y = lb.layers.layer(stacked, 1)(x)
  h, state = LinenLayer().apply(variables[1], x, mutable=["intermediates"])
  np.testing.assert_allclose(y, h, rtol=1e-6, atol=1e-6)
  assert lb.counts(stacked)["intermediates"]["h"].tolist() == [0, 1, 0]
  with pytest.raises(
    lb.layers.StackError, match=r"layers recorded 0, 1, 0 values.*layer\(stack, i\)"
  ):
    lb.recorded(stacked)
  got = lb.recorded(lb.layers.layer(stacked, 1))["intermediates"]["h"]
  np.testing.assert_allclose(got, state["intermediates"]["h"][0][None], rtol=1e-6, atol=1e-6)
  assert lb.recorded(lb.layers.layer(stacked, 0))["intermediates"]["h"].shape == (0, 2, 4)
  second = lb.layers.unstack(stacked)[1]
  np.testing.assert_allclose(lb.recorded(second)["intermediates"]["h"], got)
  for i in (0, 2):  # every layer has run once: the stack reads back, [calls, layers, ...]
    lb.layers.layer(stacked, i)(x)
  want = np.stack(
    [
      LinenLayer().apply(v, x, mutable=["intermediates"])[1]["intermediates"]["h"][0]
      for v in variables
    ]
  )
  np.testing.assert_allclose(
    lb.recorded(stacked)["intermediates"]["h"], want[None], rtol=1e-6, atol=1e-6
  )


@pytest.mark.parametrize("overflow", ["error", "wrap"])
def test_a_stack_read_inside_a_trace_orders_each_layer_by_its_own_count(overflow):
  # Inside a trace the whole buffer comes back; under "wrap" each layer's ring is turned by
  # its own count (layer 1 ran four times into three slots, layer 0 once).
  x = jax.random.normal(jax.random.key(0), (2, 4))
  layers = [
    lb.lazy_init(lb.ToNNX(LinenLayer(), rngs=nnx.Rngs(i)), x, capacity=3, overflow=overflow)
    for i in range(2)
  ]
  variables = [lb.linen_variables(layer) for layer in layers]
  stacked = lb.layers.stack(layers)
  runs = {0: [x], 1: [x, x + 1, x + 2, x + 3] if overflow == "wrap" else [x, x + 1]}
  for i, xs in runs.items():
    for xi in xs:
      lb.layers.layer(stacked, i)(xi)
  full, counts = nnx.jit(lambda s: (lb.recorded(s), lb.counts(s)))(stacked)
  assert counts["intermediates"]["h"].tolist() == [len(runs[0]), len(runs[1])]
  for i, xs in runs.items():
    want = [LinenLayer().apply(variables[i], xi) for xi in xs][-3:]
    got = full["intermediates"]["h"][: len(want), i]
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-6, atol=1e-6)


class BridgedNet(nnx.Module):
  def __init__(self, layers):
    self.layers = layers

  def scan(self, x):
    return lb.layers.scan(self.layers, x)


@pytest.mark.parametrize("entry", ["stack", "parent"])
def test_a_stack_of_bridged_layers_gains_a_call_signature(entry):
  # Declared for (2, 4), then called on (5, 4): lb.preallocate on the stack (a call of one
  # layer) or on its parent (a method running lb.layers.scan) declares the new signature for
  # every layer; both signatures then record, equal to plain Linen layer by layer.
  x, wide = (
    jax.random.normal(jax.random.key(0), (2, 4)),
    jax.random.normal(jax.random.key(1), (5, 4)),
  )
  layers = _bridged_layers(x)
  variables = [lb.linen_variables(layer) for layer in layers]
  stacked = lb.layers.stack(layers)
  lb.layers.scan(stacked, x)
  with pytest.raises(lb.NotDeclaredError, match=r"lb\.preallocate"):
    lb.layers.scan(stacked, wide)
  if entry == "stack":
    lb.preallocate(stacked, wide, capacity=2)
  else:
    lb.preallocate(BridgedNet(stacked), wide, capacity=2, method="scan")

  @nnx.jit
  def by_index(stacked, h):
    return nnx.fori_loop(0, 3, lambda i, c: (c[0], lb.layers.layer(c[0], i)(c[1])), (stacked, h))[1]

  got = [nnx.jit(lb.layers.scan)(stacked, wide), by_index(stacked, wide + 1)]
  for call, h in enumerate([wide, wide + 1]):
    row = []
    for v in variables:
      h, state = LinenLayer().apply(v, h, mutable=["intermediates"])
      row.append(state["intermediates"]["h"][0])
    np.testing.assert_allclose(got[call], h, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
      lb.recorded(stacked, signature="(float32[5,4])")["intermediates"]["h"][call],
      np.stack(row),
      rtol=1e-6,
      atol=1e-6,
    )
  first = lb.recorded(stacked, signature="(float32[2,4])")["intermediates"]["h"]
  assert first.shape == (1, 3, 2, 4)  # the first signature's record is kept
  h = x
  for i, v in enumerate(variables):
    h = LinenLayer().apply(v, h)
    np.testing.assert_allclose(first[0, i], h, rtol=1e-6, atol=1e-6)
