"""lb.compile_step: a split-once, jax.jit-compiled call that updates the model in place.

Recorded values are compared with plain Linen applied step by step (`mutable=['intermediates']`)
with the same parameters; the loop runs compiled, so floats compare within float32 round-off.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from flax.nnx import bridge

import loopbridge as lb
from loopbridge import _compat

from conftest import feedback_while_loop as while_run
from conftest import graph_kw, matmul_tolerance
from models import MLP, linen_step_reference, stack_reference
from models import recording_mlp as seed_model

RTOL, ATOL = matmul_tolerance(1e-5, 1e-6)


def reference_chain(model, x, steps):
  """The seed loop (output fed back as input) in plain Linen: final output, sows per step."""
  module = _compat.linen_module_of(model)
  variables = lb.linen_variables(model)
  inters, h = [], x
  for _ in range(steps):
    (h,), (inter,) = linen_step_reference(module, variables, [h])
    inters.append(inter)
  return h, inters


def assert_records_like_linen(model, inters):
  """The seed model's records equal the sows of plain Linen's steps (`reference_chain`)."""
  rec = lb.recorded(model)["intermediates"]
  np.testing.assert_allclose(rec["x"], stack_reference(inters, ["x"]), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
    rec["ScanBlock_0"]["carry"],
    stack_reference(inters, ["ScanBlock_0", "carry"]),
    rtol=RTOL,
    atol=ATOL,
  )


def test_loop_records_like_linen_step_by_step(graph):
  model, x = seed_model()
  want_y, inters = reference_chain(model, x, 5)
  step = lb.compile_step(while_run(graph), model)
  y = step(x, 3)
  y = step(y, 2)  # a second call continues from the model's updated counts
  np.testing.assert_allclose(y, want_y, rtol=RTOL, atol=ATOL)
  assert_records_like_linen(model, inters)
  assert int(lb.counts(model)["intermediates"]["x"]) == 5


def test_a_model_given_rngs_only_at_lazy_init_keeps_no_stream_and_records_like_linen(graph):
  # The fastest configuration for a model that draws no randomness when called (see the rules
  # guide): nothing per-call but the buffers and counts goes through the compiled step.
  seeded, x = seed_model()
  model = lb.ToNNX(_compat.linen_module_of(seeded))
  lb.lazy_init(model, x, capacity=8, rngs=nnx.Rngs(0))
  assert not jax.tree_util.tree_leaves(nnx.state(model, nnx.RngState))
  want_y, inters = reference_chain(model, x, 4)
  step = lb.compile_step(while_run(graph), model)
  np.testing.assert_allclose(step(x, 4), want_y, rtol=RTOL, atol=ATOL)
  assert_records_like_linen(model, inters)


def test_single_steps_and_reset_between_calls():
  model, x = seed_model()
  step = lb.compile_step(lambda m, x: m(x), model)
  step(x)
  lb.reset(model)  # changed outside the step: the next call must see it
  _, inters = reference_chain(model, x, 1)
  y = step(x)
  step(y)
  assert int(lb.counts(model)["intermediates"]["x"]) == 2
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["x"][0],
    stack_reference(inters, ["x"])[0],
    rtol=RTOL,
    atol=ATOL,
  )


def test_changed_values_are_donated_and_parameters_are_not():
  model, x = seed_model()
  old_buffer = lb.buffers(model)["intermediates"]["x"]
  kernel = _compat.variable_value(model.ScanBlock_0["Dense_0"]["kernel"])
  lb.compile_step(lambda m, x: m(x), model)(x)
  assert old_buffer.is_deleted()
  assert not kernel.is_deleted()
  assert _compat.variable_value(model.ScanBlock_0["Dense_0"]["kernel"]) is kernel


@pytest.mark.parametrize("overflow,calls", [("error", 4), ("drop", 4), ("drop", 6), ("wrap", 4)])
def test_a_read_full_buffer_survives_the_next_donating_call(overflow, calls):
  # An exactly full buffer (and an overflowed 'drop' one) is read whole: the read must be a
  # copy, as a partial read is, or the next call's donation deletes the caller's array.
  model, x = seed_model(capacity=4)
  model = lb.preallocate(model, x, capacity=4, overflow=overflow)
  step = lb.compile_step(lambda m, x: m(x), model)
  xs = [x * (i + 1) for i in range(calls)]
  for xi in xs:
    step(xi)
  read = lb.recorded(model)["intermediates"]["x"]
  step(x)
  _, inters = linen_step_reference(_compat.linen_module_of(model), lb.linen_variables(model), xs)
  assert not read.is_deleted()
  np.testing.assert_allclose(read, stack_reference(inters, ["x"])[:4], rtol=RTOL, atol=ATOL)


class _LastInput(nn.Module):
  """A cache initialised from the input itself: Linen init stores the caller's array as is."""

  @nn.compact
  def __call__(self, x):
    last = self.variable("cache", "last", lambda: x)
    self.sow("intermediates", "last", last.value)
    last.value = x
    return x + 1


def test_a_cache_initialised_from_the_sample_does_not_donate_the_callers_array():
  sample = jnp.arange(3.0)
  model = lb.lazy_init(lb.ToNNX(_LastInput(), rngs=nnx.Rngs(0)), sample, capacity=4)
  step = lb.compile_step(lambda m, x: m(x, mutable=["cache"]), model)
  xs = [jnp.full(3, 10.0), jnp.full(3, 20.0)]
  for x in xs:
    step(x)
  assert not sample.is_deleted()
  np.testing.assert_array_equal(sample, np.arange(3.0))
  # Plain Linen: init from the sample, then one apply per step carrying the cache.
  variables = _LastInput().init(jax.random.key(0), sample)
  want = []
  for x in xs:
    _, state = _LastInput().apply(variables, x, mutable=["cache", "intermediates"])
    variables = {**variables, "cache": state["cache"]}
    want.append(state["intermediates"]["last"][0])
  np.testing.assert_array_equal(lb.recorded(model)["intermediates"]["last"], np.stack(want))


def test_a_step_called_inside_an_outer_jit_is_refused_and_changes_nothing():
  model, x = seed_model()
  step = lb.compile_step(lambda m, x: m(x), model)
  step(x)
  with pytest.raises(lb.StructureChangeError, match=r"inside a traced function.*Fix: call"):
    jax.jit(lambda x: step(x))(x)
  assert int(lb.counts(model)["intermediates"]["x"]) == 1
  y = step(x)  # no tracer was left in the model: the next call records on
  _, inters = reference_chain(model, x, 1)
  want = stack_reference(inters + inters, ["x"])
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["x"], want, rtol=RTOL, atol=ATOL)
  assert not isinstance(y, jax.core.Tracer)


def test_a_step_built_inside_nnx_jit_from_its_model_records():
  model, x = seed_model()

  @nnx.jit
  def run(model, x):
    return lb.compile_step(lambda m, x: m(m(x)), model)(x)

  run(model, x)
  _, inters = reference_chain(model, x, 2)
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["x"],
    stack_reference(inters, ["x"]),
    rtol=RTOL,
    atol=ATOL,
  )


@pytest.mark.parametrize(
  "name",
  [
    "flat",
    *(
      pytest.param(n, marks=pytest.mark.slow)
      for n in ("fun", "jit_info", "self", "kwargs", "packed")
    ),
  ],
)
def test_keyword_arguments_of_any_name_reach_the_function(name):
  # Names of the jitted function's own parameters (or of jax's dispatch) must not collide.
  model, x = seed_model()
  step = lb.compile_step(lambda m, **kw: m(kw[name]), model)
  y = step(**{name: x})
  want_y, inters = reference_chain(model, x, 1)
  np.testing.assert_allclose(y, want_y, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["x"], stack_reference(inters, ["x"]), rtol=RTOL, atol=ATOL
  )
  assert step.lower(**{name: x}).compile() is not None


def _fori_run(graph):
  def run(model, x, n):
    return nnx.fori_loop(0, n, lambda i, c: (c[0], c[0](c[1])), (model, x), **graph_kw(graph))[1]

  return run


@pytest.mark.parametrize("loop", ["fori", "while", "lax-fori"])
def test_a_loop_donates_only_what_it_writes(graph, loop):
  """flax 0.10's nnx.fori_loop hands back every Variable as a new value; the params it never
  writes must not be donated: the caller's Linen variables stay valid."""
  _, x = seed_model()
  variables = MLP(2, 4).init(jax.random.key(5), x)
  model = lb.checkpoint.load_linen_variables(seed_model()[0], variables)
  kernel = variables["params"]["ScanBlock_0"]["Dense_0"]["kernel"]
  old_buffer = lb.buffers(model)["intermediates"]["x"]

  def lax_run(model, x, n):
    graphdef, state = nnx.split(model)

    def body(i, c):
      m = nnx.merge(graphdef, c[0])
      y = m(c[1])
      return nnx.state(m), y

    state, y = jax.lax.fori_loop(0, n, body, (state, x))
    nnx.update(model, state)
    return y

  run = {"fori": _fori_run(graph), "while": while_run(graph), "lax-fori": lax_run}[loop]
  step = lb.compile_step(run, model)
  y = step(x, 3)
  assert not kernel.is_deleted()
  assert old_buffer.is_deleted()  # the buffer is written: still donated
  np.testing.assert_array_equal(
    _compat.variable_value(model.ScanBlock_0["Dense_0"]["kernel"]), kernel
  )
  want_y, inters = reference_chain(model, x, 3)
  np.testing.assert_allclose(y, want_y, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["x"], stack_reference(inters, ["x"]), rtol=RTOL, atol=ATOL
  )


def test_written_values_found_inside_a_loop_are_donated():
  """The test above can fail: the forwarding analysis keeps written leaves donated."""
  from loopbridge._loops import compile_step as _compiled

  def body(i, c):
    return c[0], c[1] + 1.0, c[2]

  closed = jax.make_jaxpr(lambda a, b, c: jax.lax.fori_loop(0, 3, body, (a, b, c)))(
    jnp.ones(2), jnp.ones(2), 3
  )
  assert _compiled._forwarded(closed.jaxpr) == [0, None, 2]
  closed = jax.make_jaxpr(
    lambda a, b: jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0], c[1] + 1), (a, b))
  )(jnp.ones(2), 0)
  assert _compiled._forwarded(closed.jaxpr) == [0, None]


def test_donate_false_keeps_old_arrays():
  model, x = seed_model()
  old_buffer = lb.buffers(model)["intermediates"]["x"]
  lb.compile_step(lambda m, x: m(x), model, donate=False)(x)
  assert not old_buffer.is_deleted()
  assert int(lb.counts(model)["intermediates"]["x"]) == 1


def test_notices_buffers_redeclared_by_preallocate():
  model, x = seed_model(capacity=2)
  step = lb.compile_step(lambda m, x: m(x), model)
  step(x)
  lb.preallocate(model, x, capacity=6)  # grows the buffer, keeps the first record
  for _ in range(4):
    step(x)
  assert lb.buffers(model)["intermediates"]["x"].shape == (6, 1, 4)
  assert int(lb.counts(model)["intermediates"]["x"]) == 5


def test_rejects_a_non_module():
  with pytest.raises(TypeError, match="needs an NNX module"):
    lb.compile_step(lambda m: m, {"not": "a module"})


def test_rejects_returning_the_model():
  model, x = seed_model()
  with pytest.raises(TypeError, match="returned an NNX module"):
    lb.compile_step(lambda m, x: (m(x), m), model)(x)


class _Grows(nnx.Module):
  def __init__(self):
    self.w = nnx.Param(jnp.ones((2,)))


def test_rejects_a_structure_change():
  model = _Grows()

  def grow(m, x):
    m.extra = nnx.Param(x)
    return x

  with pytest.raises(lb.StructureChangeError, match="changed the model's structure"):
    lb.compile_step(grow, model)(jnp.ones((2,)))


def test_plain_nnx_module_state_updates_in_place():
  model = _Grows()

  def double(m, x):
    value = _compat.variable_value(m.w) * x
    _compat.set_variable_value(m.w, value)
    return value.sum()

  step = lb.compile_step(double, model)
  assert float(step(2.0)) == 4.0
  assert float(step(3.0)) == 12.0
  np.testing.assert_array_equal(_compat.variable_value(model.w), [6.0, 6.0])


class _Noisy(nn.Module):
  """Dropout (draws from the model's rng stream on every call) and a sow."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dropout(0.5, deterministic=False)(nn.Dense(8)(x))
    self.sow("intermediates", "h", h)
    return h


def _rng_key_variable(model):
  rngs = _compat.rngs_of(model)
  assert rngs is not None
  return rngs.dropout.key


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_rng_stream_draws_match_stock_bridge_under_nnx_jit(impl):
  """The step's rng key (passed to the executable as its raw data) gives the same draws as
  stock flax.nnx.bridge.ToNNX under nnx.jit, also after a key of another PRNG implementation
  is stored in the model between calls."""
  x = jnp.ones((2, 8))
  ours = lb.lazy_init(lb.ToNNX(_Noisy(), rngs=nnx.Rngs(params=0, dropout=1)), x, capacity=8)
  stock = bridge.ToNNX(_Noisy(), rngs=nnx.Rngs(params=0, dropout=1))
  bridge.lazy_init(stock, x)
  step = lb.compile_step(lambda m, x: m(x), ours)
  stock_step = nnx.jit(lambda m, x: m(x))
  expected = []
  for call in range(4):
    if call == 2:  # reseed both with a key of the parametrized implementation
      for model in (ours, stock):
        _rng_key_variable(model).value = jax.random.key(7, impl=impl)
    got, want = step(x), stock_step(stock, x)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    expected.append(want)
  assert len({np.asarray(e).tobytes() for e in expected}) == 4  # every call drew anew
  np.testing.assert_allclose(
    lb.recorded(ours)["intermediates"]["h"], np.stack(expected), rtol=RTOL, atol=ATOL
  )


class _TwoWeights(nnx.Module):
  def __init__(self):
    self.a = nnx.Param(jnp.full((2,), 2.0))
    self.b = nnx.Param(jnp.full((2,), 10.0))
    self.calls = nnx.BatchStat(jnp.zeros((), jnp.int32))


def test_leaves_read_only_for_some_argument_shapes_are_read_when_needed():
  """A value the function does not read is not passed to the executable; when new argument
  shapes make the function read it, the step reads the model's current value."""
  model = _TwoWeights()

  def weigh(m, x):
    _compat.set_variable_value(m.calls, _compat.variable_value(m.calls) + 1)
    weight = m.a if x.ndim == 1 else m.b
    return x * _compat.variable_value(weight)

  step = lb.compile_step(weigh, model)
  np.testing.assert_array_equal(step(jnp.ones((2,))), [2.0, 2.0])
  _compat.set_variable_value(model.b, jnp.full((2,), 5.0))  # unread by the 1-d calls
  np.testing.assert_array_equal(step(jnp.ones((2,))), [2.0, 2.0])
  np.testing.assert_array_equal(step(jnp.ones((1, 2))), [[5.0, 5.0]])
  _compat.set_variable_value(model.b, jnp.full((2,), 3.0))
  np.testing.assert_array_equal(step(jnp.ones((1, 2))), [[3.0, 3.0]])
  _compat.set_variable_value(model.a, jnp.full((2,), 7.0))
  np.testing.assert_array_equal(step(jnp.ones((2,))), [7.0, 7.0])
  assert int(_compat.variable_value(model.calls)) == 5
