"""Checkpoints of recording models (orbax) and loading existing Linen variables.

References: the uninterrupted run of the same jitted loop (bit-exact: the same compiled
computation runs on the same values), and plain Linen `apply` step by step for models built
from existing variables (float32, rtol=atol=1e-6: eager Linen vs the bridged call).
"""

from __future__ import annotations

import functools
import os
import typing as tp

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge import _compat
from loopbridge._core import recorder as _recorder

from conftest import full_precision_tolerance, graph_kw

FEATURES, DEPTH, CAPACITY = 4, 2, 5
TOL: dict[str, tp.Any] = dict(rtol=1e-6, atol=1e-6)


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
    carry, _ = nn.scan(
      Block,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      length=DEPTH,
    )()(x, None)
    return carry


_TEMPLATES: dict = {}


def _fresh(capacity=CAPACITY, overflow="wrap"):
  """A newly declared model; lazy_init runs once per declaration, then copies are cloned."""
  key = (capacity, overflow)
  if key not in _TEMPLATES:
    model = lb.ToNNX(Noisy(), rngs=nnx.Rngs(0, dropout=1))
    _TEMPLATES[key] = lb.lazy_init(
      model, jnp.ones((2, FEATURES)), capacity=capacity, overflow=overflow
    )
  return nnx.clone(_TEMPLATES[key])


@functools.cache
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
  return {
    "/".join(map(str, path)): node
    for path, node in _compat.iter_graph(model)
    if isinstance(node, nnx.Variable)
  }


def _dir_bytes(path):
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_mid_loop_round_trip_records_exactly_the_uninterrupted_run(tmp_path, graph):
  run = _steps(graph)
  x = jnp.linspace(-1.0, 1.0, 2 * FEATURES).reshape(2, FEATURES)

  whole = _fresh()
  y_whole = run(whole, x, 0, 7)  # 7 calls into capacity 5: the wrap position is state too

  first = _fresh()
  y = run(first, x, 0, 3)
  path = lb.checkpoint.save(tmp_path / "mid", first)
  arrays = [_compat.variable_value(v) for v in _variables(first).values()]
  state_bytes = sum(
    np.asarray(a).nbytes for a in arrays if not jnp.issubdtype(a.dtype, jax.dtypes.prng_key)
  )
  assert _dir_bytes(path) >= state_bytes  # every buffer, param and count is on disk

  resumed = lb.checkpoint.restore(path, _fresh())
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
  path = lb.checkpoint.save(tmp_path / "c", model)
  restored, unrestored = lb.checkpoint.restore(path, _fresh()), _fresh()
  for m in (restored, unrestored, model):
    run(m, x, 2, 3)
  np.testing.assert_array_equal(
    lb.recorded(restored)["intermediates"]["x"], lb.recorded(model)["intermediates"]["x"]
  )
  assert lb.recorded(unrestored)["intermediates"]["x"].shape[0] == 1
  assert not np.array_equal(
    lb.recorded(unrestored)["intermediates"]["x"][0], lb.recorded(model)["intermediates"]["x"][2]
  )


def test_restore_keeps_variable_identity_and_loops_still_run(tmp_path, graph):
  model = _fresh()
  model(jnp.ones((2, FEATURES)))
  path = lb.checkpoint.save(tmp_path / "c", model)
  fresh = _fresh()
  before = {k: id(v) for k, v in _variables(fresh).items()}
  lb.checkpoint.restore(path, fresh)
  assert {k: id(v) for k, v in _variables(fresh).items()} == before
  _steps(graph)(fresh, jnp.ones((2, FEATURES)), 0, 2)
  assert int(lb.counts(fresh)["intermediates"]["x"]) == 3


def test_restore_into_a_model_with_other_shapes_names_the_difference(tmp_path):
  path = lb.checkpoint.save(tmp_path / "c", _fresh(capacity=3))
  model = lb.ToNNX(Noisy(), rngs=nnx.Rngs(0, dropout=1))
  lb.lazy_init(model, jnp.ones((3, FEATURES)), capacity=3, overflow="wrap")
  with pytest.raises(
    lb.checkpoint.CheckpointError,
    match=r"declared differently from the model: .*"
    r"loopbridge__buffers/intermediates/x: value_shape saved \[2, 4\] vs model "
    r"\[3, 4\].*Why.*Fix: .*lb.lazy_init",
  ):
    lb.checkpoint.restore(path, model)


# ---------------------------------------------------------------- the saved declaration


class Sow(nn.Module):
  """Deterministic records (no rng), so every value can be checked against plain Linen."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(3)(x)
    self.sow("intermediates", "h", h)
    return h


X0 = jnp.ones((2, 2))
SOW_VARIABLES = Sow().init(jax.random.key(0), X0)


def _xs(n):
  return [jnp.arange(4.0).reshape(2, 2) * (i + 1) - 1.5 for i in range(n)]


def _sow_model(capacity, overflow, calls=0):
  model = lb.checkpoint.from_linen_variables(Sow(), SOW_VARIABLES, X0)
  lb.preallocate(model, X0, capacity=capacity, overflow=overflow)
  for x in _xs(calls):
    model(x)
  return model


def _linen_hs(xs):
  """Plain Linen, one apply per step: the value each call sows."""
  return np.stack(
    [
      Sow().apply(SOW_VARIABLES, x, mutable=["intermediates"])[1]["intermediates"]["h"][0]
      for x in xs
    ]
  )


def _values(model):
  return {k: np.asarray(v) for k, v in _snapshot(model)[2].items()}


def _assert_untouched(model, before):
  after = _values(model)
  assert after.keys() == before.keys()
  for key in before:
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)


@pytest.mark.parametrize("saved,wanted", [("error", "wrap"), ("wrap", "drop"), ("drop", "error")])
def test_another_overflow_policy_is_refused_and_the_model_untouched(tmp_path, saved, wanted):
  # Five calls into capacity 3: read as another policy the slots would mean other values
  # (error -> wrap used to read [2, 0, 1] where the last three were 2, 3, 4).
  path = lb.checkpoint.save(tmp_path / "c", _sow_model(3, saved, calls=5))
  model = _sow_model(3, wanted, calls=1)
  before = _values(model)
  with pytest.raises(
    lb.checkpoint.CheckpointError,
    match=rf"at {path}.*loopbridge__buffers/intermediates/h: overflow saved "
    rf"'{saved}' vs model '{wanted}'.*Why: .*overflow policy.*Fix: .*overflow=",
  ):
    lb.checkpoint.restore(path, model)
  _assert_untouched(model, before)


def test_a_smaller_capacity_is_refused(tmp_path):
  path = lb.checkpoint.save(tmp_path / "c", _sow_model(3, "wrap", calls=1))
  model = _sow_model(2, "wrap")
  before = _values(model)
  with pytest.raises(
    lb.checkpoint.CheckpointError,
    match=r"intermediates/h: capacity saved 3 vs model 2 \(smaller: the saved "
    r"values would not fit\).*Fix",
  ):
    lb.checkpoint.restore(path, model)
  _assert_untouched(model, before)


@pytest.mark.parametrize("overflow", ["error", "drop", "wrap"])
def test_a_larger_capacity_keeps_every_value_in_order(tmp_path, overflow):
  """Two values saved at capacity 3, restored at capacity 6, then five more calls: the
  records are what one model of capacity 6 records over the seven calls, per policy."""
  xs = _xs(7)
  path = lb.checkpoint.save(tmp_path / "c", _sow_model(3, overflow, calls=2))
  model = lb.checkpoint.restore(path, _sow_model(6, overflow))
  assert _compat.variable_value(_variables(model)["loopbridge__buffers/intermediates/h"]).shape == (
    6,
    2,
    3,
  )
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["h"], _linen_hs(xs[:2]), **TOL)
  for x in xs[2:]:
    model(x)
  assert int(lb.counts(model)["intermediates"]["h"]) == 7
  if overflow == "error":
    with pytest.raises(lb.BufferOverflowError, match=r"recorded 7 values.*capacity=6"):
      lb.recorded(model)
  else:
    want = _linen_hs(xs[:6] if overflow == "drop" else xs[1:])
    np.testing.assert_allclose(lb.recorded(model)["intermediates"]["h"], want, **TOL)


@pytest.mark.parametrize("overflow", ["error", "drop", "wrap"])
def test_a_larger_capacity_after_an_overflow_is_refused(tmp_path, overflow):
  path = lb.checkpoint.save(tmp_path / "c", _sow_model(2, overflow, calls=3))
  model = _sow_model(4, overflow)
  before = _values(model)
  with pytest.raises(
    lb.checkpoint.CheckpointError,
    match=rf"cannot be restored into a larger capacity: buffer "
    rf"loopbridge__buffers/intermediates/h \(overflow='{overflow}'\) had 3 values "
    r"sown into capacity 2, so 1 of them are not in the checkpoint.*Fix: restore "
    r"into a model declared with capacity 2",
  ):
    lb.checkpoint.restore(path, model)
  _assert_untouched(model, before)


class _SlashNames(nn.Module):
  """A '/' inside a sow name and inside a sown dict's key (Linen accepts both)."""

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "a/b", x)
    self.sow("intermediates", "d", {"k/1": 2 * x})
    return x


def test_a_larger_capacity_restores_sites_with_a_slash_in_their_name(tmp_path):
  xs = _xs(3)
  small = lb.lazy_init(lb.ToNNX(_SlashNames()), X0, capacity=2)
  small(xs[0])
  small(xs[1])
  path = lb.checkpoint.save(tmp_path / "c", small)
  model = lb.checkpoint.restore(path, lb.lazy_init(lb.ToNNX(_SlashNames()), X0, capacity=4))
  model(xs[2])
  want = [_SlashNames().apply({}, x, mutable=["intermediates"])[1]["intermediates"] for x in xs]
  rec = lb.recorded(model)["intermediates"]
  np.testing.assert_array_equal(rec["a/b"], np.stack([w["a/b"][0] for w in want]))
  np.testing.assert_array_equal(rec["d"]["k/1"], np.stack([w["d"][0]["k/1"] for w in want]))


class _SowsEmpty(nn.Module):
  """Sows a zero-size slice next to a regular value (orbax refuses zero-size arrays)."""

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    self.sow("intermediates", "none", x[:, :0])
    return x


@pytest.mark.parametrize("capacity", [3, 5])
def test_a_zero_size_sow_saves_and_restores(tmp_path, capacity):
  xs = _xs(3)
  model = lb.lazy_init(lb.ToNNX(_SowsEmpty()), X0, capacity=3)
  model(xs[0])
  model(xs[1])
  path = lb.checkpoint.save(tmp_path / "c", model)
  fresh = lb.lazy_init(lb.ToNNX(_SowsEmpty()), X0, capacity=capacity)
  model = lb.checkpoint.restore(path, fresh)
  model(xs[2])
  assert int(lb.counts(model)["intermediates"]["none"]) == 3
  want = [_SowsEmpty().apply({}, x, mutable=["intermediates"])[1]["intermediates"] for x in xs]
  rec = lb.recorded(model)["intermediates"]
  np.testing.assert_array_equal(rec["x"], np.stack([w["x"][0] for w in want]))
  np.testing.assert_array_equal(rec["none"], np.stack([w["none"][0] for w in want]))


# ---------------------------------------------------------------- damaged checkpoints


def _data_files(path):
  return [
    os.path.join(root, f) for root, _, files in os.walk(os.path.join(path, "d")) for f in files
  ]


def _truncate_data(path):
  for f in _data_files(path):
    with open(f, "r+b") as handle:
      handle.truncate(os.path.getsize(f) // 2)


def _delete_a_data_file(path):
  os.remove(sorted(_data_files(path))[0])


def _garbage(name):
  def damage(path):
    with open(os.path.join(path, name), "wb") as handle:
      handle.write(b"\xff\xfe not metadata")

  return damage


def _empty(path):
  import shutil

  shutil.rmtree(path)
  os.makedirs(path)


def _nothing_there(path):
  import shutil

  shutil.rmtree(path)


def _a_file(path):
  import shutil

  shutil.rmtree(path)
  with open(path, "w") as handle:
    handle.write("not a checkpoint")


def _plain_orbax(path):
  """A checkpoint orbax wrote without lb.checkpoint.save (no declaration)."""
  import shutil

  import orbax.checkpoint as ocp

  shutil.rmtree(path)
  state = jax.tree.map(np.asarray, nnx.state(_sow_model(3, "wrap"), nnx.Param).to_pure_dict())
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, state)


DAMAGE = {
  "truncated-data": (
    _truncate_data,
    r"cannot restore the checkpoint at {path}: .*Why: .*"
    r"truncated.*untouched\. Fix: restore an earlier complete checkpoint",
  ),
  "deleted-data-file": (_delete_a_data_file, r"cannot restore the checkpoint at {path}: .*Why"),
  "garbage-array-metadata": (
    _garbage("_METADATA"),
    r"cannot restore the checkpoint at {path}: .*metadata.*Why",
  ),
  "garbage-step-metadata": (
    _garbage("_CHECKPOINT_METADATA"),
    r"cannot restore the checkpoint at {path}: its step metadata \(the "
    r"buffers' declaration\) cannot be read: UnicodeDecodeError.*Why",
  ),
  "empty-directory": (_empty, r"no checkpoint at {path}: the directory is empty.*Fix"),
  "path-does-not-exist": (_nothing_there, r"no checkpoint at {path}: the path does not exist.*Fix"),
  "path-is-a-file": (_a_file, r"no checkpoint at {path}: it is a file.*Fix"),
  "no-declaration": (
    _plain_orbax,
    r"the checkpoint at {path} holds no loopbridge declaration"
    r".*Why: it was not written by lb.checkpoint.save.*Fix",
  ),
}


# orbax 0.12, failing to read damaged files, leaves a callback for its closed asyncio loop;
# Python reports it as an unraisable "Event loop is closed" later (only printed outside
# pytest). It is orbax's, not a loopbridge error: collected here and not made an error.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_checkpoint_is_a_checkpoint_error_and_the_model_untouched(tmp_path, damage):
  import gc
  import re

  damage_fn, match = DAMAGE[damage]
  path = lb.checkpoint.save(tmp_path / "c", _sow_model(3, "wrap", calls=2))
  damage_fn(path)
  model = _sow_model(3, "wrap", calls=1)
  before = _values(model)
  with pytest.raises(lb.checkpoint.CheckpointError, match=match.format(path=re.escape(path))):
    lb.checkpoint.restore(path, model)
  _assert_untouched(model, before)
  gc.collect()


def test_the_undamaged_checkpoint_restores(tmp_path):
  """The damage cases above can fail: the same checkpoint, undamaged, restores."""
  path = lb.checkpoint.save(tmp_path / "c", _sow_model(3, "wrap", calls=2))
  model = lb.checkpoint.restore(path, _sow_model(3, "wrap", calls=1))
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["h"], _linen_hs(_xs(2)), **TOL)


# ---------------------------------------------------------------- across flax versions

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def _fixture_dirs():
  return sorted(d for d in os.listdir(FIXTURES) if d.startswith("checkpoint_flax_"))


def test_a_fixture_exists_for_each_end_of_the_supported_range():
  assert _fixture_dirs() == ["checkpoint_flax_0.10.2", "checkpoint_flax_0.12.8"]


@pytest.mark.parametrize("fixture", _fixture_dirs())
def test_a_checkpoint_saved_on_any_supported_flax_restores_here(fixture, tmp_path):
  """Saved by tests/fixtures/make_checkpoint_fixture.py on each end of the range (the rng
  attribute is `rngs` on flax 0.10 and `to_nnx__rngs` on 0.12); restored on this flax."""
  import shutil
  import sys

  sys.path.insert(0, FIXTURES)
  try:
    import make_checkpoint_fixture as fx
  finally:
    sys.path.remove(FIXTURES)
  path = shutil.copytree(os.path.join(FIXTURES, fixture, "ckpt"), tmp_path / "ckpt")
  model = lb.checkpoint.restore(path, fx.fresh_model())
  saved = np.load(os.path.join(FIXTURES, fixture, "state.npz"))
  values = {
    k.replace("rngs/", "to_nnx__rngs/") if k.startswith("rngs/") else k: v
    for k, v in _values(model).items()
  }
  # The fixtures are loopbridge 0.2's format 1: a scalar count per site, at the site's path
  # under loopbridge__counts; this model holds one count vector, an entry per site.
  counts = "loopbridge__counts"
  per_site = {k: k[len(counts) + 1 :] for k in saved.files if k.startswith(counts + "/")}
  assert per_site == {"loopbridge__counts/intermediates/h": "intermediates/h"}
  assert values.pop(counts).shape == (1,)
  for key, site in per_site.items():
    values[key] = np.asarray(lb.counts(model)[site.split("/")[0]][site.split("/")[1]])
  assert int(values["loopbridge__counts/intermediates/h"]) == fx.STEPS
  assert sorted(values) == sorted(saved.files)
  for key in saved.files:  # params, buffer, count, rng keys and counts
    np.testing.assert_array_equal(values[key], saved[key], err_msg=key)
  # The records against plain Linen with the restored params: the last 3 of 5 (wrap). The saved
  # records were computed on a CPU, in float32: so is the reference, at full precision on any
  # backend (a TPU's default float32 matmul is one bfloat16 pass, 2e-2 off).
  variables = {"params": jax.tree.map(np.asarray, nnx.state(model, nnx.Param).to_pure_dict())}
  tol = dict(zip(("rtol", "atol"), full_precision_tolerance(TOL["rtol"], TOL["atol"])))
  with jax.default_matmul_precision("highest"):
    hs = [
      fx.FixtureNet().apply(
        variables, fx.inputs(i), mutable=["intermediates"], rngs={"dropout": jax.random.key(0)}
      )[1]["intermediates"]["h"][0]
      for i in range(fx.STEPS + 1)
    ]
    np.testing.assert_allclose(lb.recorded(model)["intermediates"]["h"], np.stack(hs[2:5]), **tol)
    model(fx.inputs(fx.STEPS))  # and records on from there
    np.testing.assert_allclose(lb.recorded(model)["intermediates"]["h"], np.stack(hs[3:6]), **tol)


def test_overwrite(tmp_path):
  model = _fresh()
  lb.checkpoint.save(tmp_path / "c", model)
  model(jnp.ones((2, FEATURES)))
  path = lb.checkpoint.save(tmp_path / "c", model, overwrite=True)
  assert int(lb.counts(lb.checkpoint.restore(path, _fresh()))["intermediates"]["x"]) == 1


# ---------------------------------------------------------------- existing Linen variables


class WithStats(nn.Module):
  """Partitioned params, batch_stats and a sow: what a Linen training checkpoint holds."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(
      FEATURES, kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(), (None, "model"))
    )(x)
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
  model = lb.preallocate(
    lb.checkpoint.from_linen_variables(WithStats(), variables, x0), x0, capacity=4
  )
  kernel = _compat.variable_value(_variables(model)["Dense_0/kernel"])
  np.testing.assert_array_equal(kernel, variables["params"]["Dense_0"]["kernel"].unbox())
  xs = [jnp.full((3, 2), float(i)) + jnp.arange(2.0) for i in range(3)]
  outs = [model(x, mutable=True) for x in xs]
  ref_outs, ref_hs, ref_vars = _linen_reference(WithStats(), variables, xs)
  for out, ref in zip(outs, ref_outs):
    np.testing.assert_allclose(out, ref, **TOL)
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["h"], ref_hs, **TOL)
  np.testing.assert_allclose(
    _compat.variable_value(_variables(model)["BatchNorm_0/mean"]),
    ref_vars["batch_stats"]["BatchNorm_0"]["mean"],
    **TOL,
  )


def test_from_linen_variables_runs_in_a_jitted_loop(graph):
  x0 = jnp.ones((3, 2))
  variables = WithStats().init(jax.random.key(0), x0)
  model = lb.preallocate(
    lb.checkpoint.from_linen_variables(WithStats(), variables, x0), x0, capacity=3
  )

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
  abstract = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), variables
  )
  loaded = checkpointer.restore(os.fspath(tmp_path / "linen"), abstract)

  with _one_device_mesh():
    model = lb.lazy_init(lb.ToNNX(WithStats(), rngs=nnx.Rngs(0)), x0, capacity=2)
  ids = {k: id(v) for k, v in _variables(model).items()}
  lb.checkpoint.load_linen_variables(model, loaded)
  assert {k: id(v) for k, v in _variables(model).items()} == ids
  y = model(x0 + 1.0, mutable=True)
  ref, _ = WithStats().apply(variables, x0 + 1.0, mutable=["batch_stats"])
  np.testing.assert_allclose(y, ref, **TOL)


class _Sows(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(FEATURES)(x)
    self.sow("intermediates", "h", h)
    return h


@nnx.jit(donate_argnums=0)
def _donating_step(model, x):
  return model(x)


def test_loaded_linen_variables_survive_a_donating_call():
  # The README's loop donates the model: by default the model holds its own copy, so the
  # user's Linen variables stay usable with plain Linen afterwards.
  x = jnp.ones((2, 3))
  variables = _Sows().init(jax.random.key(5), x)
  model = lb.lazy_init(lb.ToNNX(_Sows(), rngs=nnx.Rngs(0)), x, capacity=2)
  lb.checkpoint.load_linen_variables(model, variables)
  for step in range(2):
    y = _donating_step(model, x + step)
    ref, state = _Sows().apply(variables, x + step, mutable=["intermediates"])
    np.testing.assert_allclose(y, ref, **TOL)
    np.testing.assert_allclose(
      lb.recorded(model)["intermediates"]["h"][step], state["intermediates"]["h"][0], **TOL
    )
  assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(variables))


def test_load_linen_variables_copy_false_moves_the_arrays():
  # Moving (for tight memory): the model holds the very arrays given, so no second copy
  # exists, and a donating call consumes them.
  x = jnp.ones((2, 3))
  variables = _Sows().init(jax.random.key(5), x)
  ref = _Sows().apply(variables, x)
  model = lb.lazy_init(lb.ToNNX(_Sows(), rngs=nnx.Rngs(0)), x, capacity=2)
  lb.checkpoint.load_linen_variables(model, variables, copy=False)
  held = lb.linen_variables(model)["params"]["Dense_0"]
  given = variables["params"]["Dense_0"]
  assert held["kernel"] is given["kernel"] and held["bias"] is given["bias"]
  np.testing.assert_allclose(_donating_step(model, x), ref, **TOL)
  assert given["kernel"].is_deleted()
  with pytest.raises(TypeError, match=r"copy= must be True or False, got 'no'.*Fix"):
    lb.checkpoint.load_linen_variables(model, variables, copy="no")  # pyright: ignore[reportArgumentType]


def test_linen_variables_with_another_structure_are_rejected():
  x0 = jnp.ones((3, 2))
  variables = WithStats().init(jax.random.key(0), x0)
  with pytest.raises(
    lb.checkpoint.CheckpointError, match=r"bare params tree: pass \{'params': params\}"
  ):
    lb.checkpoint.from_linen_variables(WithStats(), variables["params"], x0)
  with pytest.raises(
    lb.checkpoint.CheckpointError,
    match=r"params/Dense_0/kernel given \(2, 4\) float32 vs module \(5, 4\)",
  ):
    lb.checkpoint.from_linen_variables(WithStats(), variables, jnp.ones((3, 5)))
  with _one_device_mesh():
    model = lb.lazy_init(lb.ToNNX(WithStats(), rngs=nnx.Rngs(0)), jnp.ones((3, 5)), capacity=2)
  with pytest.raises(lb.checkpoint.CheckpointError, match=r"do not fit the model.*Fix"):
    lb.checkpoint.load_linen_variables(model, variables)


# ---------------------------------------------------------------- loopbridge 0.2's format 1


class TwoMethods(nn.Module):
  """One sow per method: declared as two signatures, so the later site's count entry (1)
  comes before the first site's in key order (`intermediates/a` < `intermediates/z`)."""

  def setup(self):
    self.dense = nn.Dense(2)

  def __call__(self, x):
    h = self.dense(x)
    self.sow("intermediates", "z", h)
    return h

  def first(self, x):
    h = self.dense(x)
    self.sow("intermediates", "a", h * 2)
    return h


def _two_methods_model():
  model = lb.lazy_init(lb.ToNNX(TwoMethods(), rngs=nnx.Rngs(0)), X0, capacity=4)
  return lb.preallocate(model, X0, capacity=4, method="first")


def _save_as_format_1(path, model):
  """What loopbridge 0.2 saved: the same arrays, but a scalar count per site at the site's
  path under loopbridge__counts (no count vector), and format 1 in the declaration."""
  import orbax.checkpoint as ocp
  from flax import traverse_util

  from loopbridge._checkpoint import save_restore

  variables = save_restore._model_variables(model)
  tree = {}
  for key, variable in variables.items():
    value = save_restore._saved_form(_compat.variable_value(variable))
    if key[-1] != "loopbridge__counts":
      tree[key] = value
      continue
    for site in _recorder.sites_of(model) or ():
      tree[(*key, *site.key)] = value[..., site.count_index]
  declaration = {
    "format": 1,
    "buffers": save_restore._declaration(variables),
    "empty_arrays": [],
  }
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(
    str(path), traverse_util.unflatten_dict(tree), custom_metadata={"loopbridge": declaration}
  )
  checkpointer.wait_until_finished()
  return str(path)


def test_a_format_1_checkpoint_restores_each_site_count_into_its_entry(tmp_path):
  model = _two_methods_model()
  assert [(s.name, s.count_index) for s in _recorder.sites_of(model) or ()] == [("z", 0), ("a", 1)]
  xs = _xs(5)
  for x in xs[:3]:
    model(x)
  for x in xs[3:]:
    model(x, method="first")
  path = _save_as_format_1(tmp_path / "c", model)
  restored = lb.checkpoint.restore(path, _two_methods_model())
  counts = lb.counts(restored)["intermediates"]
  assert (int(counts["z"]), int(counts["a"])) == (3, 2)
  linen = lb.linen_variables(model)
  want_z = [TwoMethods().apply(linen, x, mutable=["intermediates"])[1] for x in xs[:3]]
  want_a = [
    TwoMethods().apply(linen, x, method="first", mutable=["intermediates"])[1] for x in xs[3:]
  ]
  recorded = lb.recorded(restored)["intermediates"]
  np.testing.assert_allclose(
    recorded["z"], np.stack([w["intermediates"]["z"][0] for w in want_z]), **TOL
  )
  np.testing.assert_allclose(
    recorded["a"], np.stack([w["intermediates"]["a"][0] for w in want_a]), **TOL
  )
  # Saving again writes the new form: one vector, read back the same.
  again = lb.checkpoint.restore(lb.checkpoint.save(tmp_path / "d", restored), _two_methods_model())
  assert jax.tree.map(int, lb.counts(again)) == {"intermediates": {"z": 3, "a": 2}}
