"""Checkpoints of recording models (orbax) and loading existing Linen variables.

References: the uninterrupted run of the same jitted loop (bit-exact: the same compiled
computation runs on the same values), and plain Linen `apply` step by step for models built
from existing variables (float32, rtol=atol=1e-6: eager Linen vs the bridged call).
"""

from __future__ import annotations

import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge import _compat

from conftest import graph_kw

FEATURES, DEPTH, CAPACITY = 4, 2, 5
TOL = dict(rtol=1e-6, atol=1e-6)


class Block(nn.Module):
  @nn.compact
  def __call__(self, carry, _):
    carry = nn.relu(nn.Dense(FEATURES)(carry))
    self.sow("intermediates", "carry", carry)
    return carry, None


class Noisy(nn.Module):
  """Dropout (an rng stream), a top-level sow and an nn.scan sow."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dropout(0.5, deterministic=False)(x)
    self.sow("intermediates", "x", x)
    carry, _ = nn.scan(Block, variable_axes={"params": 0, "intermediates": 0},
                       split_rngs={"params": True}, length=DEPTH)()(x, None)
    return carry


_TEMPLATES: dict = {}


def _fresh(capacity=CAPACITY, overflow="wrap"):
  """A newly declared model; lazy_init runs once per declaration, then copies are cloned."""
  key = (capacity, overflow)
  if key not in _TEMPLATES:
    model = lb.ToNNX(Noisy(), rngs=nnx.Rngs(0, dropout=1))
    _TEMPLATES[key] = lb.lazy_init(model, jnp.ones((2, FEATURES)), capacity=capacity,
                                   overflow=overflow)
  return nnx.clone(_TEMPLATES[key])


@functools.lru_cache(maxsize=None)
def _steps(graph):
  """One jitted loop for every segment: steps lo..hi-1 of the same compiled body (one
  compilation per mode, shared by the tests)."""
  @nnx.jit(**graph_kw(graph))
  def run(model, x, lo, hi):
    def body(i, carry):
      model, x = carry
      return model, model(x * (i + 1.0), mutable=True)
    return nnx.fori_loop(lo, hi, body, (model, x), **graph_kw(graph))[1]
  return run


def _snapshot(model):
  rec = jax.tree.map(np.asarray, lb.recorded(model))
  counts = jax.tree.map(int, lb.counts(model))
  leaves = {}
  for key, variable in _variables(model).items():
    value = _compat.variable_value(variable)
    if jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
      value = jax.random.key_data(value)
    leaves[key] = np.asarray(value)
  return rec, counts, leaves


def _variables(model):
  return {"/".join(map(str, path)): node for path, node in _compat.iter_graph(model)
          if isinstance(node, nnx.Variable)}


def _dir_bytes(path):
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_mid_loop_round_trip_records_exactly_the_uninterrupted_run(tmp_path, graph):
  run = _steps(graph)
  x = jnp.linspace(-1.0, 1.0, 2 * FEATURES).reshape(2, FEATURES)

  whole = _fresh()
  y_whole = run(whole, x, 0, 7)  # 7 calls into capacity 5: the wrap position is state too

  first = _fresh()
  y = run(first, x, 0, 3)
  path = lb.save_checkpoint(tmp_path / "mid", first)
  arrays = [_compat.variable_value(v) for v in _variables(first).values()]
  state_bytes = sum(np.asarray(a).nbytes for a in arrays
                    if not jnp.issubdtype(a.dtype, jax.dtypes.prng_key))
  assert _dir_bytes(path) >= state_bytes  # every buffer, param and count is on disk

  resumed = lb.restore_checkpoint(path, _fresh())
  y_resumed = run(resumed, y, 3, 7)

  rec_r, counts_r, leaves_r = _snapshot(resumed)
  rec_w, counts_w, leaves_w = _snapshot(whole)
  assert counts_r == counts_w == {"intermediates": {"x": 7, "ScanBlock_0": {"carry": 7}}}
  jax.tree.map(np.testing.assert_array_equal, rec_r, rec_w)
  assert leaves_r.keys() == leaves_w.keys()
  for key in leaves_w:  # params, buffers, counts and rng keys/counts
    np.testing.assert_array_equal(leaves_r[key], leaves_w[key], err_msg=key)
  np.testing.assert_array_equal(y_resumed, y_whole)


def test_restore_is_needed_for_the_rng_state(tmp_path):
  """The test above can fail: without restoring, the resumed records differ."""
  run, x = _steps(True), jnp.ones((2, FEATURES))
  model = _fresh()
  run(model, x, 0, 2)
  path = lb.save_checkpoint(tmp_path / "c", model)
  restored, unrestored = lb.restore_checkpoint(path, _fresh()), _fresh()
  for m in (restored, unrestored, model):
    run(m, x, 2, 3)
  np.testing.assert_array_equal(lb.recorded(restored)["intermediates"]["x"],
                                lb.recorded(model)["intermediates"]["x"])
  assert lb.recorded(unrestored)["intermediates"]["x"].shape[0] == 1
  assert not np.array_equal(lb.recorded(unrestored)["intermediates"]["x"][0],
                            lb.recorded(model)["intermediates"]["x"][2])


def test_restore_keeps_variable_identity_and_loops_still_run(tmp_path, graph):
  model = _fresh()
  model(jnp.ones((2, FEATURES)))
  path = lb.save_checkpoint(tmp_path / "c", model)
  fresh = _fresh()
  before = {k: id(v) for k, v in _variables(fresh).items()}
  lb.restore_checkpoint(path, fresh)
  assert {k: id(v) for k, v in _variables(fresh).items()} == before
  _steps(graph)(fresh, jnp.ones((2, FEATURES)), 0, 2)
  assert int(lb.counts(fresh)["intermediates"]["x"]) == 3


def test_restore_into_a_differently_declared_model_names_the_difference(tmp_path):
  path = lb.save_checkpoint(tmp_path / "c", _fresh(capacity=3))
  with pytest.raises(lb.CheckpointError,
                     match=r"loopbridge__buffers/intermediates/x saved \(3, 2, 4\) float32 vs "
                     r"model \(4, 2, 4\) float32.*Fix: .*lb.lazy_init"):
    lb.restore_checkpoint(path, _fresh(capacity=4))
  with pytest.raises(lb.CheckpointError, match=r"no checkpoint at .*Fix"):
    lb.restore_checkpoint(tmp_path / "missing", _fresh())


def test_overwrite(tmp_path):
  model = _fresh()
  lb.save_checkpoint(tmp_path / "c", model)
  model(jnp.ones((2, FEATURES)))
  path = lb.save_checkpoint(tmp_path / "c", model, overwrite=True)
  assert int(lb.counts(lb.restore_checkpoint(path, _fresh()))["intermediates"]["x"]) == 1


# ---------------------------------------------------------------- existing Linen variables

class WithStats(nn.Module):
  """Partitioned params, batch_stats and a sow: what a Linen training checkpoint holds."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(FEATURES, kernel_init=nn.with_partitioning(
        nn.initializers.lecun_normal(), (None, "model")))(x)
    h = nn.BatchNorm(use_running_average=False)(h)
    self.sow("intermediates", "h", h)
    return h


def _one_device_mesh():
  """flax 0.12 creates partitioned Variables eagerly sharded, which needs a mesh (as stock
  bridge.lazy_init does); one device is enough here."""
  from jax.sharding import Mesh

  return _compat.mesh_context(Mesh(np.array(jax.devices()[:1]), ("model",)))


def _linen_reference(module, variables, xs):
  """Plain Linen step by step: batch_stats carried, intermediates collected."""
  outs, hs = [], []
  for x in xs:
    y, state = module.apply(variables, x, mutable=["batch_stats", "intermediates"])
    variables = {**variables, "batch_stats": state["batch_stats"]}
    outs.append(y)
    hs.append(state["intermediates"]["h"][0])
  return outs, np.stack(hs), variables


def test_from_linen_variables_uses_them_without_initializing():
  x0 = jnp.ones((3, 2))
  variables = WithStats().init(jax.random.key(42), x0)
  model = lb.from_linen_variables(WithStats(), variables, x0, capacity=4)
  kernel = _compat.variable_value(_variables(model)["Dense_0/kernel"])
  np.testing.assert_array_equal(kernel, variables["params"]["Dense_0"]["kernel"].unbox())
  xs = [jnp.full((3, 2), float(i)) + jnp.arange(2.0) for i in range(3)]
  outs = [model(x, mutable=True) for x in xs]
  ref_outs, ref_hs, ref_vars = _linen_reference(WithStats(), variables, xs)
  for out, ref in zip(outs, ref_outs):
    np.testing.assert_allclose(out, ref, **TOL)
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["h"], ref_hs, **TOL)
  np.testing.assert_allclose(_compat.variable_value(_variables(model)["BatchNorm_0/mean"]),
                             ref_vars["batch_stats"]["BatchNorm_0"]["mean"], **TOL)


def test_from_linen_variables_runs_in_a_jitted_loop(graph):
  x0 = jnp.ones((3, 2))
  variables = WithStats().init(jax.random.key(0), x0)
  model = lb.from_linen_variables(WithStats(), variables, x0, capacity=3)

  @nnx.jit(**graph_kw(graph))
  def run(model, x):
    def body(i, carry):
      carry[0](carry[1], mutable=True)
      return carry
    return nnx.fori_loop(0, 3, body, (model, x), **graph_kw(graph))[1]

  run(model, x0)
  _, ref_hs, _ = _linen_reference(WithStats(), variables, [x0] * 3)
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["h"], ref_hs, **TOL)


def test_linen_checkpoint_loads_into_an_initialized_model(tmp_path):
  import orbax.checkpoint as ocp

  x0 = jnp.ones((3, 2))
  variables = nn.meta.unbox(WithStats().init(jax.random.key(3), x0))
  checkpointer = ocp.StandardCheckpointer()  # a Linen user's checkpoint
  checkpointer.save(os.fspath(tmp_path / "linen"), variables)
  checkpointer.wait_until_finished()
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                          variables)
  loaded = checkpointer.restore(os.fspath(tmp_path / "linen"), abstract)

  with _one_device_mesh():
    model = lb.lazy_init(lb.ToNNX(WithStats(), rngs=nnx.Rngs(0)), x0, capacity=2)
  ids = {k: id(v) for k, v in _variables(model).items()}
  lb.load_linen_variables(model, loaded)
  assert {k: id(v) for k, v in _variables(model).items()} == ids
  y = model(x0 + 1.0, mutable=True)
  ref, _ = WithStats().apply(variables, x0 + 1.0, mutable=["batch_stats"])
  np.testing.assert_allclose(y, ref, **TOL)


def test_linen_variables_with_another_structure_are_rejected():
  x0 = jnp.ones((3, 2))
  variables = WithStats().init(jax.random.key(0), x0)
  with pytest.raises(lb.CheckpointError, match=r"bare params tree: pass \{'params': params\}"):
    lb.from_linen_variables(WithStats(), variables["params"], x0, capacity=2)
  with pytest.raises(lb.CheckpointError,
                     match=r"params/Dense_0/kernel given \(2, 4\) float32 vs module \(5, 4\)"):
    lb.from_linen_variables(WithStats(), variables, jnp.ones((3, 5)), capacity=2)
  with _one_device_mesh():
    model = lb.lazy_init(lb.ToNNX(WithStats(), rngs=nnx.Rngs(0)), jnp.ones((3, 5)), capacity=2)
  with pytest.raises(lb.CheckpointError, match=r"do not fit the model.*Fix"):
    lb.load_linen_variables(model, variables)
