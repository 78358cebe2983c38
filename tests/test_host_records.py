"""Records in host memory (`memory="host"`): placement, values against plain Linen, overflow,
read-back, re-declaration and the refusals. On a backend without pinned host memory (jax 0.5.3's
CPU), the declaration is refused instead, and that refusal is what runs here."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb


def _has_pinned_host() -> bool:
  return "pinned_host" in {m.kind for m in jax.devices()[0].addressable_memories()}


def _host_writes_compile() -> bool:
  """Whether this JAX compiles a write into pinned host memory (jax 0.7's CPU lists the memory
  but cannot): the plain-JAX form of what a host record does each step."""
  if not _has_pinned_host():
    return False
  host = jax.sharding.NamedSharding(
    jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)),
    jax.sharding.PartitionSpec(),
    memory_kind="pinned_host",
  )
  buffer = jax.device_put(np.zeros(3, np.float32), host)
  try:
    out = jax.jit(lambda b, v: jax.lax.dynamic_update_slice(b, jax.device_put(v, host), (2,)))(
      buffer, jnp.ones(1)
    )
  except Exception:  # any failure: not here
    return False
  return out.sharding.memory_kind == "pinned_host" and np.asarray(out).tolist() == [0.0, 0.0, 1.0]


HOST_WRITES = _host_writes_compile()
needs_host = pytest.mark.skipif(not HOST_WRITES, reason="no compiled writes to pinned_host here")


class Step(nn.Module):
  """One step of a recurrence: its sown values differ from step to step."""

  @nn.compact
  def __call__(self, x):
    h = jnp.tanh(nn.Dense(4)(x))
    self.sow("intermediates", "h", h)
    self.sow("intermediates", "x", x)
    return h


X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)


def _linen_steps(model: lb.ToNNX, steps: int) -> dict[str, np.ndarray]:
  """The reference: plain Linen apply, one step at a time, with the bridged model's params."""
  params = {"params": nnx.to_pure_dict(nnx.state(model, nnx.Param))}
  out: dict[str, list] = {"h": [], "x": []}
  x = X
  for _ in range(steps):
    y, state = Step().apply(params, x, mutable=["intermediates"])
    out["h"].append(np.asarray(state["intermediates"]["h"][0]))
    out["x"].append(np.asarray(state["intermediates"]["x"][0]))
    x = y
  return {k: np.stack(v) for k, v in out.items()}


def _fresh(capacity=6, **kw) -> lb.ToNNX:
  model = lb.ToNNX(Step(), rngs=nnx.Rngs(0))
  return lb.lazy_init(model, X, capacity=capacity, **kw)


def _fori(model, steps):
  @nnx.jit(donate_argnums=0)
  def run(model, x):
    return nnx.fori_loop(0, steps, lambda i, c: (c[0], c[0](c[1])), (model, x))

  run(model, X)


def _while(model, steps):
  @nnx.jit(donate_argnums=0)
  def run(model, x):
    def body(c):
      i, m, x = c
      return i + 1, m, m(x)

    return nnx.while_loop(lambda c: c[0] < steps, body, (0, model, x))

  run(model, X)


def _scan(model, steps):
  @nnx.jit(donate_argnums=0)
  def run(model, x):
    @nnx.scan(in_axes=(nnx.Carry, None), out_axes=nnx.Carry, length=steps)
    def body(carry, _):
      m, x = carry
      return m, m(x)

    return body((model, x), None)

  run(model, X)


def _compiled(model, steps):
  step = lb.compile_step(lambda m, x: m(x), model)
  x = X
  for _ in range(steps):
    x = step(x)


@needs_host
@pytest.mark.parametrize("loop", [_fori, _while, _scan, _compiled])
def test_host_records_equal_linen_step_by_step(loop):
  model = _fresh(memory="host")
  expected = _linen_steps(model, 5)
  loop(model, 5)
  got = lb.recorded(model)["intermediates"]
  for name in ("h", "x"):
    assert isinstance(got[name], np.ndarray)
    np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-6)


@needs_host
def test_buffers_live_in_pinned_host_memory_per_site():
  model = _fresh(memory={"h": "host"})
  kinds = {k: b.sharding.memory_kind for k, b in lb.buffers(model)["intermediates"].items()}
  assert kinds == {"h": "pinned_host", "x": "device"}
  model = _fresh(memory={"intermediates": "host", "x": "device"})  # the exact path wins
  kinds = {k: b.sharding.memory_kind for k, b in lb.buffers(model)["intermediates"].items()}
  assert kinds == {"h": "pinned_host", "x": "device"}


@needs_host
def test_host_and_device_records_agree():
  host, device = _fresh(memory="host"), _fresh()
  _fori(host, 4)
  _fori(device, 4)
  for name in ("h", "x"):
    np.testing.assert_array_equal(
      lb.recorded(host)["intermediates"][name],
      np.asarray(lb.recorded(device)["intermediates"][name]),
    )


@needs_host
def test_overflow_policies_on_the_host():
  expected = _linen_steps(_fresh(), 5)["h"]
  drop = _fresh(capacity=3, memory="host", overflow="drop")
  _fori(drop, 5)
  np.testing.assert_allclose(lb.recorded(drop)["intermediates"]["h"], expected[:3], atol=1e-6)
  wrap = _fresh(capacity=3, memory="host", overflow="wrap")
  _fori(wrap, 5)
  np.testing.assert_allclose(lb.recorded(wrap)["intermediates"]["h"], expected[2:], atol=1e-6)
  error = _fresh(capacity=3, memory="host")
  _fori(error, 5)
  with pytest.raises(lb.BufferOverflowError, match="capacity=3"):
    lb.recorded(error)
  assert int(lb.counts(error)["intermediates"]["h"]) == 5


@needs_host
def test_reset_and_redeclaration_keep_shape_and_records():
  model = _fresh(memory="host")
  _fori(model, 3)
  kept = lb.recorded(model)["intermediates"]["h"]
  lb.preallocate(model, X, capacity=10, memory="host")  # a larger capacity keeps the records
  assert lb.buffers(model)["intermediates"]["h"].shape == (11, 2, 4)  # the spare slot too
  np.testing.assert_array_equal(lb.recorded(model)["intermediates"]["h"], kept)
  lb.reset(model)
  assert lb.recorded(model)["intermediates"]["h"].shape == (0, 2, 4)
  assert int(lb.counts(model)["intermediates"]["h"]) == 0
  _fori(model, 1)  # written again from the first slot
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["h"], kept[:1], atol=1e-6)
  # From the device to the host: the records move with the declaration.
  device = _fresh()
  _fori(device, 2)
  before = np.asarray(lb.recorded(device)["intermediates"]["h"])
  lb.preallocate(device, X, capacity=6, memory="host")
  assert lb.buffers(device)["intermediates"]["h"].sharding.memory_kind == "pinned_host"
  np.testing.assert_array_equal(lb.recorded(device)["intermediates"]["h"], before)


@needs_host
def test_read_back_is_a_copy_a_later_donated_call_cannot_change():
  model = _fresh(memory="host", overflow="wrap", capacity=2)
  _fori(model, 2)
  first = lb.recorded(model)["intermediates"]["h"].copy()
  held = lb.recorded(model)["intermediates"]["h"]
  _fori(model, 2)
  np.testing.assert_array_equal(held, first)


@needs_host
@pytest.mark.parametrize("overflow", ["error", "wrap"])
def test_a_host_record_read_inside_a_trace_is_refused(overflow):
  model = _fresh(memory="host", overflow=overflow)

  @nnx.jit
  def read(model):
    return lb.recorded(model)["intermediates"]["h"]

  with pytest.raises(lb.BufferOverflowError, match="outside the compiled"):
    read(model)


@needs_host
def test_writes_past_the_end_never_touch_the_kept_slots():
  # "drop" keeps the first values; the writes past the end go to a spare slot no read returns.
  model = _fresh(capacity=2, memory="host", overflow="drop")
  _fori(model, 2)
  first = lb.recorded(model)["intermediates"]["h"].copy()
  _fori(model, 3)  # three more, all past the end
  np.testing.assert_array_equal(lb.recorded(model)["intermediates"]["h"], first)
  assert lb.recorded(model)["intermediates"]["h"].shape == (2, 2, 4)
  assert int(lb.counts(model)["intermediates"]["h"]) == 5


def test_bad_memory_values_are_refused():
  with pytest.raises(lb.CapacityError, match="memory='gpu'"):
    _fresh(memory="gpu")
  with pytest.raises(lb.CapacityError, match="memory=\\{\\}"):
    _fresh(memory={})
  with pytest.raises(lb.CapacityError, match="match no sow site"):
    _fresh(memory={"intermediates/h": "host"})  # keys are paths inside the collection


def test_a_backend_without_pinned_host_memory_is_refused(monkeypatch):
  from loopbridge._core import memory

  class NoHost:
    def addressable_memories(self):
      return [type("M", (), {"kind": "device"})()]

  monkeypatch.setattr(memory.jax, "devices", lambda: [NoHost()])
  with pytest.raises(lb.CapacityError, match="no 'pinned_host' memory"):
    _fresh(memory="host")


def test_host_records_are_declared_exactly_where_this_jax_compiles_their_writes():
  """Where pinned host memory is listed but a compiled write into it fails (jax 0.7's CPU), the
  declaration is refused with the reason, instead of the first step failing to trace."""
  if HOST_WRITES:
    model = _fresh(memory="host")
    assert lb.buffers(model)["intermediates"]["h"].sharding.memory_kind == "pinned_host"
  else:
    with pytest.raises(lb.CapacityError, match="pinned_host") as caught:
      _fresh(memory="host")
    assert "Fix: keep the records on the device" in str(caught.value)


@needs_host
def test_stacked_layers_refuse_host_records():
  layers = [
    lb.lazy_init(lb.ToNNX(Step(), rngs=nnx.Rngs(i)), X, capacity=4, memory="host") for i in range(2)
  ]
  with pytest.raises(lb.layers.StackError, match="host memory"):
    lb.layers.stack(layers)


@needs_host
def test_shard_buffers_refuses_a_host_record():
  from jax.sharding import Mesh, PartitionSpec

  model = _fresh(memory="host")
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  with pytest.raises(lb.sharding.ShardingError, match="host memory"):
    lb.sharding.shard_buffers(model, PartitionSpec(), mesh=mesh)


@needs_host
def test_checkpoint_round_trip_keeps_host_records_on_the_host(tmp_path):
  model = _fresh(memory="host")
  _fori(model, 3)
  lb.checkpoint.save(tmp_path / "ckpt", model)
  restored = _fresh(memory="host")
  lb.checkpoint.restore(tmp_path / "ckpt", restored)
  assert lb.buffers(restored)["intermediates"]["h"].sharding.memory_kind == "pinned_host"
  np.testing.assert_array_equal(
    lb.recorded(restored)["intermediates"]["h"], lb.recorded(model)["intermediates"]["h"]
  )


@pytest.mark.parametrize("kind", [None, "pinned_host"])
def test_single_device_placement_reads_no_deprecated_jax_name(kind):
  """jax 0.12 deprecates the class `jax.sharding.SingleDeviceSharding` (reading it warns);
  the placement host records and `loopbridge convert` use must neither warn nor misplace."""
  from loopbridge import _compat

  if kind is not None and not _has_pinned_host():
    pytest.skip("no pinned_host memory here")
  device = jax.devices()[0]
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    sharding = _compat.single_device_sharding(device, memory_kind=kind)
  placed = jax.device_put(np.arange(3.0), sharding)
  assert placed.sharding.device_set == {device}
  assert placed.sharding.memory_kind == (kind or device.default_memory().kind)
  np.testing.assert_array_equal(np.asarray(placed), np.arange(3.0))
