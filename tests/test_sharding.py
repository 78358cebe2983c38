"""Sharded recording on a device mesh: buffers laid out like the values they record.

Needs 8 devices, so it runs in its own process (see `SHARDING_COMMAND` in conftest.py):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest -q -m sharding \
      tests/test_sharding.py tests/test_bad_inputs.py
In the default single-device run every test here is skipped with that command as the reason.

Reference: the same Linen module applied step by step on one device with plain
`apply(mutable=['intermediates'])`. The sharded run partitions matmuls differently, so floats
are compared with rtol=atol=1e-5 (float32 round-off); counts exactly.
"""

from __future__ import annotations

import typing as tp

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.linen import spmd
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import loopbridge as lb
from loopbridge import _compat

from conftest import SHARDING_COMMAND, SHARDING_DEVICES, graph_kw

pytestmark = [
  pytest.mark.sharding,
  pytest.mark.skipif(
    jax.device_count() < SHARDING_DEVICES,
    reason=f"needs {SHARDING_DEVICES} devices, found {jax.device_count()}; run: {SHARDING_COMMAND}",
  ),
]

BATCH, FEATURES, DEPTH, STEPS, CAPACITY = 8, 8, 2, 3, 4
TOL: dict[str, tp.Any] = dict(rtol=1e-5, atol=1e-5)


def _partitioned(init, names, logical):
  return nn.with_logical_partitioning(init, names) if logical else nn.with_partitioning(init, names)


def _dense(logical):
  """Dense with every param annotated: Linen pins annotated params under the mesh; params
  without metadata are laid out by XLA's propagation, as in plain Linen."""
  names = ("embed", "mlp") if logical else (None, "model")
  return nn.Dense(
    FEATURES,
    kernel_init=_partitioned(nn.initializers.lecun_normal(), names, logical),
    bias_init=_partitioned(nn.initializers.zeros_init(), names[1:], logical),
  )


class Block(nn.Module):
  logical: bool = False

  @nn.compact
  def __call__(self, carry, _):
    carry = nn.relu(_dense(self.logical)(carry))
    self.sow("intermediates", "carry", carry)
    return carry, None


class Net(nn.Module):
  """Partitioned params (mesh axes or logical names), a top-level sow and one in nn.scan."""

  logical: bool = False

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    h = _dense(self.logical)(x)
    self.sow("intermediates", "h", h)
    carry, _ = nn.scan(
      Block,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      length=DEPTH,
      metadata_params={nn.PARTITION_NAME: None},
    )(self.logical)(h, None)
    return carry


LOGICAL_RULES = (("batch", "data"), ("embed", None), ("mlp", "model"))


@pytest.fixture(scope="module")
def mesh():
  return Mesh(np.array(jax.devices()[:SHARDING_DEVICES]).reshape(4, 2), ("data", "model"))


def _context(mesh, logical):
  import contextlib

  stack = contextlib.ExitStack()
  stack.enter_context(_compat.mesh_context(mesh))
  if logical:
    stack.enter_context(nn.logical_axis_rules(LOGICAL_RULES))
  return stack


def _shard_params(model, mesh, logical):
  """Place every Variable by its partitioning metadata (what `nnx.get_partition_spec` does;
  done by hand because flax 0.10's version fails on bridged logical params)."""
  for _, node in _compat.iter_graph(model):
    if not isinstance(node, nnx.Variable):
      continue
    names, _ = _compat.variable_sharding(node)
    if names is None:
      spec = P()
    elif logical and isinstance(node, nnx.Param):
      spec = spmd.logical_to_mesh_axes(names, LOGICAL_RULES)
    else:
      spec = P(*names)
    value = _compat.variable_value(node)
    _compat.set_variable_value(node, jax.device_put(value, NamedSharding(mesh, spec)))


def _array_shardings(tree):
  return {
    jax.tree_util.keystr(path): leaf.sharding
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


def _spec_equal(array, mesh, spec):
  return array.sharding.is_equivalent_to(NamedSharding(mesh, spec), array.ndim)


def _inputs():
  return jax.random.normal(jax.random.key(1), (STEPS, BATCH, 4))


def _reference(logical, params, xs):
  """Single device, plain Linen, one apply per step (the params copied to host first)."""
  params = jax.device_get(params)
  inters = []
  for x in np.asarray(xs):
    _, state = Net(logical).apply({"params": params}, jnp.asarray(x), mutable=["intermediates"])
    inters.append(state["intermediates"])
  return {
    "x": np.stack([t["x"][0] for t in inters]),
    "h": np.stack([t["h"][0] for t in inters]),
    "carry": np.stack([t["ScanBlock_0"]["carry"][0] for t in inters]),
  }


def _build(mesh, logical):
  x_sharding = NamedSharding(mesh, P("data", None))
  xs = _inputs()
  with _context(mesh, logical):
    model = lb.ToNNX(Net(logical), rngs=nnx.Rngs(0))
    lb.lazy_init(model, jax.device_put(xs[0], x_sharding), capacity=CAPACITY)
  _shard_params(model, mesh, logical)
  return model, jax.device_put(xs, NamedSharding(mesh, P(None, "data", None)))


def _loop(model, xs, mesh, logical, graph):
  @nnx.jit(**graph_kw(graph))
  def run(model, xs):
    def cond(carry):
      return carry[2] < STEPS

    def body(carry):
      m, xs, i = carry
      m(xs[i], mutable=True)
      return m, xs, i + 1

    # The model is updated in place (tree mode: returning it again would be an alias).
    _, _, steps = nnx.while_loop(cond, body, (model, xs, 0), **graph_kw(graph))
    return steps

  with _context(mesh, logical):
    assert int(run(model, xs)) == STEPS


@pytest.mark.parametrize("logical", [False, True], ids=["mesh-axes", "logical-rules"])
def test_inferred_buffer_sharding_survives_jitted_while_loop(mesh, logical, graph):
  model, xs = _build(mesh, logical)
  params_before = _array_shardings(nnx.state(model, nnx.Param))
  bufs = lb.buffers(model)["intermediates"]
  # Sharded like the recorded value along the batch axis; capacity (and nn.scan) axes not.
  expected = {
    "x": P(None, "data", None),
    "h": P(None, "data", None),
    "carry": P(None, None, "data", None),
  }
  got = {"x": bufs["x"], "h": bufs["h"], "carry": bufs["ScanBlock_0"]["carry"]}
  for name, spec in expected.items():
    assert _spec_equal(got[name], mesh, spec), (name, got[name].sharding)
    # Per-device bytes shrink with the 4-way data axis.
    assert got[name].addressable_shards[0].data.nbytes * 4 == got[name].nbytes

  _loop(model, xs, mesh, logical, graph)

  bufs = lb.buffers(model)["intermediates"]
  got = {"x": bufs["x"], "h": bufs["h"], "carry": bufs["ScanBlock_0"]["carry"]}
  for name, spec in expected.items():
    assert _spec_equal(got[name], mesh, spec), (name, got[name].sharding)
  params_after = _array_shardings(nnx.state(model, nnx.Param))
  assert params_after.keys() == params_before.keys()
  for key, sharding in params_before.items():
    if logical and "ScanBlock_0" in key:
      # Linen constrains logically partitioned params per nn.scan slice only; on flax 0.10
      # XLA then may lay the stacked array out differently. Records are still checked below.
      continue
    assert params_after[key].is_equivalent_to(sharding, 3), (key, params_after[key], sharding)
  kernel = nnx.state(model, nnx.Param)["Dense_0"]["kernel"]
  kernel = _compat.variable_value(kernel) if isinstance(kernel, nnx.Variable) else kernel.value
  assert _spec_equal(kernel, mesh, P(None, "model"))

  counts = lb.counts(model)["intermediates"]
  assert int(counts["x"]) == int(counts["ScanBlock_0"]["carry"]) == STEPS
  # The count vector (one per recorder, an entry per site) stays whole on every device.
  (vector,) = jax.tree.leaves(nnx.state(model, lb.Count))
  assert vector.shape == (3,) and vector.sharding.is_fully_replicated
  rec = lb.recorded(model)["intermediates"]
  ref = _reference(logical, nnx.state(model, nnx.Param).to_pure_dict(), xs)
  np.testing.assert_allclose(rec["x"], ref["x"], **TOL)
  np.testing.assert_allclose(rec["h"], ref["h"], **TOL)
  np.testing.assert_allclose(rec["ScanBlock_0"]["carry"], ref["carry"], **TOL)


def test_partition_spec_of_state_includes_buffers(mesh):
  """`nnx.get_partition_spec` sees the buffer layout, so the standard recipe keeps it."""
  model, _ = _build(mesh, logical=False)
  specs = nnx.get_partition_spec(nnx.state(model, lb.Buffer)).to_pure_dict()
  assert tuple(specs["loopbridge__buffers"]["intermediates"]["x"]) == (None, "data", None)
  assert tuple(specs["loopbridge__buffers"]["intermediates"]["ScanBlock_0"]["carry"]) == (
    None,
    None,
    "data",
    None,
  )


def test_replicated_inputs_leave_buffers_unsharded(mesh):
  with _compat.mesh_context(mesh):
    model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
    lb.lazy_init(model, _inputs()[0], capacity=CAPACITY)
  buf = lb.buffers(model)["intermediates"]["x"]
  assert buf.addressable_shards[0].data.nbytes == buf.nbytes


def test_shard_buffers_override_mapping(mesh, graph):
  model, xs = _build(mesh, logical=False)
  lb.sharding.shard_buffers(
    model, {"h": P("data", "model"), "ScanBlock_0/*": P(None, None, "model")}, mesh=mesh
  )
  bufs = lb.buffers(model)["intermediates"]
  assert _spec_equal(bufs["h"], mesh, P(None, "data", "model"))
  assert _spec_equal(bufs["ScanBlock_0"]["carry"], mesh, P(None, None, None, "model"))
  assert _spec_equal(bufs["x"], mesh, P(None, "data", None))  # no key: inferred layout kept
  assert bufs["h"].addressable_shards[0].data.nbytes * 8 == bufs["h"].nbytes

  _loop(model, xs, mesh, False, graph)
  bufs = lb.buffers(model)["intermediates"]
  assert _spec_equal(bufs["h"], mesh, P(None, "data", "model"))
  assert _spec_equal(bufs["ScanBlock_0"]["carry"], mesh, P(None, None, None, "model"))
  rec = lb.recorded(model)["intermediates"]
  ref = _reference(False, nnx.state(model, nnx.Param).to_pure_dict(), xs)
  np.testing.assert_allclose(rec["h"], ref["h"], **TOL)
  np.testing.assert_allclose(rec["ScanBlock_0"]["carry"], ref["carry"], **TOL)


def test_shard_buffers_between_compile_step_calls(mesh):
  # A compiled step built before shard_buffers must write the new buffers, not the replaced
  # ones (which it would otherwise keep donating: zeros read back, or deleted arrays).
  model, xs = _build(mesh, logical=False)
  step = lb.compile_step(lambda m, x: m(x), model)
  with _compat.mesh_context(mesh):
    step(xs[0])
    lb.sharding.shard_buffers(model, {"h": P("data", "model")}, mesh=mesh)
    step(xs[1])
    step(xs[2])
  assert int(lb.counts(model)["intermediates"]["h"]) == STEPS
  bufs = lb.buffers(model)["intermediates"]
  assert _spec_equal(bufs["h"], mesh, P(None, "data", "model"))
  rec = lb.recorded(model)["intermediates"]
  ref = _reference(False, nnx.state(model, nnx.Param).to_pure_dict(), xs)
  np.testing.assert_allclose(rec["h"], ref["h"], **TOL)
  np.testing.assert_allclose(rec["x"], ref["x"], **TOL)


class _SowsPair(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(FEATURES)(x)
    self.sow("intermediates", "pair", (h, h.sum(-1)))
    return h


def test_shard_buffers_takes_a_pytree_sows_path_as_capacity_does(mesh):
  # The sow's path names every leaf of the sown pytree, for shard_buffers as for capacity=.
  xs = _inputs()
  model = lb.lazy_init(lb.ToNNX(_SowsPair(), rngs=nnx.Rngs(0)), xs[0], capacity={"pair": 4})
  lb.sharding.shard_buffers(model, {"pair": P("data")}, mesh=mesh)
  bufs = lb.buffers(model)["intermediates"]["pair"]
  assert _spec_equal(bufs[0], mesh, P(None, "data", None))
  assert _spec_equal(bufs[1], mesh, P(None, "data"))
  with _compat.mesh_context(mesh):
    for x in xs:
      model(x)
  params = jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  for i, x in enumerate(xs):
    _, state = _SowsPair().apply({"params": params}, x, mutable=["intermediates"])
    (want,) = state["intermediates"]["pair"]
    got = lb.recorded(model)["intermediates"]["pair"]
    np.testing.assert_allclose(got[0][i], want[0], **TOL)
    np.testing.assert_allclose(got[1][i], want[1], **TOL)


def test_shard_buffers_callable_and_reset_keep_layout(mesh):
  model, xs = _build(mesh, logical=False)

  def rule(site, value_shape):
    # Shard the feature axis of every value; `site` is e.g. "intermediates/ScanBlock_0/carry".
    return P(*([None] * (len(value_shape) - 1)), "model")

  lb.sharding.shard_buffers(model, rule, mesh=mesh)
  with _compat.mesh_context(mesh):
    model(xs[0])
    lb.reset(model)
  buf = lb.buffers(model)["intermediates"]["x"]
  assert _spec_equal(buf, mesh, P(None, None, None)) is False
  assert _spec_equal(buf, mesh, P(None, None, "model"))
  assert int(lb.counts(model)["intermediates"]["x"]) == 0


class _SowsH(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(FEATURES)(x)
    self.sow("intermediates", "h", h)
    return h


@pytest.mark.parametrize("how", ["collection", "path", "path in its collection", "callable"])
def test_shard_buffers_places_every_call_signatures_buffers_by_the_public_path(mesh, how):
  # Two call signatures (batch 8, then batch 4): a key, or a callable, names a sow's buffers
  # of every signature alike, by the path users see (never the internal slot key). The path
  # with its collection ("intermediates/h", as the callable and lb.sow_sites name it) too.
  big = jax.random.normal(jax.random.key(2), (BATCH, FEATURES))
  small = big[:4] * 2
  model = lb.lazy_init(lb.ToNNX(_SowsH(), rngs=nnx.Rngs(0)), big, capacity=2)
  lb.preallocate(model, small, capacity=2)
  seen = []

  def rule(site, value_shape):
    seen.append(site)
    return P("data")

  spec = {
    "collection": {"intermediates": P("data")},
    "path": {"h": P("data")},
    "path in its collection": {"intermediates/h": P("data")},
    "callable": rule,
  }
  lb.sharding.shard_buffers(model, spec[how], mesh=mesh)
  if how == "callable":
    assert sorted(seen) == ["intermediates/h", "intermediates/h"]
  for label in (f"(float32[{BATCH},{FEATURES}])", f"(float32[4,{FEATURES}])"):
    buf = lb.buffers(model, signature=label)["intermediates"]["h"]
    assert _spec_equal(buf, mesh, P(None, "data", None)), (label, buf.sharding)
  with _compat.mesh_context(mesh):
    model(big)
    model(small)
  params = jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  for x in (big, small):
    _, state = _SowsH().apply({"params": params}, x, mutable=["intermediates"])
    got = lb.recorded(model, signature=f"(float32[{x.shape[0]},{FEATURES}])")
    np.testing.assert_allclose(got["intermediates"]["h"][0], state["intermediates"]["h"][0], **TOL)


def test_shard_buffers_key_naming_no_buffer_lists_the_keys_that_would(mesh):
  # A key naming no buffer is refused, and every name the message lists is a key that works.
  big = jax.random.normal(jax.random.key(2), (BATCH, FEATURES))
  model = lb.lazy_init(lb.ToNNX(_SowsH(), rngs=nnx.Rngs(0)), big, capacity=2)
  lb.preallocate(model, big[:4], capacity=2)
  with pytest.raises(
    lb.sharding.ShardingError,
    match=r"\['intermediates/g'\] name no buffer.*are: \['intermediates/h'\]",
  ):
    lb.sharding.shard_buffers(model, {"intermediates/g": P("data")}, mesh=mesh)
  lb.sharding.shard_buffers(model, {"intermediates/h": P("data")}, mesh=mesh)
  for label in (f"(float32[{BATCH},{FEATURES}])", f"(float32[4,{FEATURES}])"):
    buf = lb.buffers(model, signature=label)["intermediates"]["h"]
    assert _spec_equal(buf, mesh, P(None, "data", None)), (label, buf.sharding)


def test_shard_buffers_rejects_uneven_split(mesh):
  with _compat.mesh_context(mesh):
    model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
    lb.lazy_init(model, jnp.ones((6, 4)), capacity=CAPACITY)
  with pytest.raises(
    lb.sharding.ShardingError, match=r"axis 0 \(size 6\).*'data'.*does not divide"
  ):
    lb.sharding.shard_buffers(model, {"x": P("data")}, mesh=mesh)


class _Plain(nn.Module):
  """No partitioned params: buffer layouts come from the sample input's sharding alone."""

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    h = nn.Dense(FEATURES)(x)
    self.sow("intermediates", "h", h)
    return h


class _Root(nnx.Module):
  def __init__(self):
    self.part = lb.ToNNX(_Plain(), rngs=nnx.Rngs(0))

  def __call__(self, x):
    return self.part(x)


@pytest.mark.parametrize("entry", ["lazy_init", "preallocate"])
def test_buffer_shardings_are_the_same_for_a_bridged_part_alone_and_inside_a_root(mesh, entry):
  x = jax.device_put(jnp.ones((BATCH, 4)), NamedSharding(mesh, P("data")))
  alone = lb.ToNNX(_Plain(), rngs=nnx.Rngs(0))
  root = _Root()
  if entry == "lazy_init":
    lb.lazy_init(alone, x, capacity=3)
    lb.lazy_init(root, x, capacity=3)
  else:  # initialized unsharded, then declared for the sharded signature
    lb.lazy_init(alone, jnp.ones((BATCH, 4)), capacity=3)
    lb.lazy_init(root, jnp.ones((BATCH, 4)), capacity=3)
    lb.preallocate(alone, x, capacity=3)
    lb.preallocate(root, x, capacity=3)
  got_alone = lb.buffers(alone)["intermediates"]
  got_root = lb.buffers(root)["part"]["intermediates"]
  for name in ("x", "h"):
    assert _spec_equal(got_alone[name], mesh, P(None, "data", None)), got_alone[name].sharding
    assert got_root[name].sharding.is_equivalent_to(got_alone[name].sharding, 3)


class _TanhLayer(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = jnp.tanh(nn.Dense(FEATURES)(x))
    self.sow("intermediates", "h", h)
    return h


LAYERS = 3


def _stacked_layers(capacity: int):
  x = jnp.ones((BATCH, FEATURES))
  layers = [
    lb.lazy_init(lb.ToNNX(_TanhLayer(), rngs=nnx.Rngs(i)), x, capacity=capacity)
    for i in range(LAYERS)
  ]
  params = [jax.device_get(nnx.state(layer, nnx.Param).to_pure_dict()) for layer in layers]
  return lb.layers.stack(layers), params


def test_shard_buffers_on_a_layer_stack_shards_the_recorded_values_axis(mesh):
  # A stack's buffer is (layers, capacity, batch, features); the spec describes the recorded
  # (batch, features) value, so 'data' lands on axis 2 (not the capacity axis).
  stack, params = _stacked_layers(capacity=4)
  seen = []
  lb.sharding.shard_buffers(stack, lambda site, shape: seen.append(shape) or P("data"), mesh=mesh)
  assert seen == [(BATCH, FEATURES)]
  lb.sharding.shard_buffers(stack, {"h": P("data", "model")}, mesh=mesh)
  buf = lb.buffers(stack)["intermediates"]["h"]
  assert buf.shape == (LAYERS, 4, BATCH, FEATURES)
  assert _spec_equal(buf, mesh, P(None, None, "data", "model")), buf.sharding
  xs = _inputs()[:, :, :1] * jnp.ones((1, 1, FEATURES))
  with _compat.mesh_context(mesh):
    for x in xs:
      h = x
      for i in range(LAYERS):
        h = lb.layers.layer(stack, i)(h)
  # Records read back as plain Linen computes them, layer by layer.
  got = lb.recorded(stack)["intermediates"]["h"]
  for step, x in enumerate(xs):
    h = x
    for i in range(LAYERS):
      h, state = _TanhLayer().apply({"params": params[i]}, h, mutable=["intermediates"])
      np.testing.assert_allclose(got[step, i], state["intermediates"]["h"][0], **TOL)


def test_shard_buffers_on_a_layer_stack_names_the_recorded_values_shape(mesh):
  # A capacity of 3 does not matter (its axis is never split): a batch of 8 over 'data' (4)
  # fits. A spec longer than the value is refused naming the value's own shape.
  stack, _ = _stacked_layers(capacity=3)
  lb.sharding.shard_buffers(stack, {"h": P("data")}, mesh=mesh)
  buf = lb.buffers(stack)["intermediates"]["h"]
  assert _spec_equal(buf, mesh, P(None, None, "data", None)), buf.sharding
  with pytest.raises(
    lb.sharding.ShardingError, match=rf"the recorded value has\s+shape \({BATCH}, {FEATURES}\)"
  ):
    lb.sharding.shard_buffers(stack, {"h": P(None, "data", "model")}, mesh=mesh)
