"""lb.while_loop / lb.fori_loop: drop-in NNX loops for any carry, on every supported flax.

References are independent of the code under test: plain Python loops over the same modules
(eager NNX calls on clones), and for the bridged seed-000 model the plain Linen module applied
step by step with `mutable=['intermediates']` (tests/models.py). Compiled loops and eager
calls round differently, so float comparisons use RTOL/ATOL (float32 round-off).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx import bridge

import loopbridge as lb
from loopbridge import _compat

from conftest import graph_kw
from models import MLP, linen_step_reference, stack_reference

RTOL, ATOL = 1e-5, 1e-6
FLAX = ".".join(map(str, _compat.FLAX_VERSION))


def value(variable):
  return np.asarray(_compat.variable_value(variable))


def seed_001_models():
  """The two different models of seed 001."""
  model = nnx.Linear(2, 2, rngs=nnx.Rngs(jax.random.PRNGKey(0)))
  model2 = nnx.Linear(2, 2, rngs=nnx.Rngs(jax.random.PRNGKey(1)))
  return model, model2


def identity_body(i, x):
  return x


# ----------------------------------------------------------------------------- seed 001
def test_seed_001_lb_fori_loop():
  model, model2 = seed_001_models()
  kernels = value(model.kernel), value(model2.kernel)
  out = lb.fori_loop(0, 10, identity_body, (model, model2))
  assert out[0] is model and out[1] is model2
  np.testing.assert_array_equal(value(model.kernel), kernels[0])
  np.testing.assert_array_equal(value(model2.kernel), kernels[1])
  assert not np.array_equal(kernels[0], kernels[1])  # really two different models


def test_seed_001_lb_fori_loop_trains_both_models():
  """Each step changes both models differently; compare with a plain Python loop."""
  model, model2 = seed_001_models()
  ref, ref2 = nnx.clone(model), nnx.clone(model2)
  x = jnp.arange(2.0)[None]

  def body(i, carry):
    m, m2, y = carry
    _compat.set_variable_value(m.kernel, _compat.variable_value(m.kernel) + i)
    _compat.set_variable_value(m2.bias, _compat.variable_value(m2.bias) * 0.5)
    return m, m2, m2(m(y))

  _, _, y = lb.fori_loop(0, 4, body, (model, model2, x))
  y_ref = x
  for i in range(4):
    _compat.set_variable_value(ref.kernel, value(ref.kernel) + i)
    _compat.set_variable_value(ref2.bias, value(ref2.bias) * 0.5)
    y_ref = ref2(ref(y_ref))
  np.testing.assert_allclose(y, y_ref, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(value(model.kernel), value(ref.kernel), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(value(model2.bias), value(ref2.bias), rtol=RTOL, atol=ATOL)


@pytest.mark.skipif(
  _compat.FLAX_VERSION < (0, 11),
  reason=f"flax {FLAX}: nnx.fori_loop rejects two different modules in one carry (seed 001, "
  "fixed in later flax); lb.fori_loop covers it: test_seed_001_lb_fori_loop",
)
def test_seed_001_nnx_fori_loop(graph):
  model, model2 = seed_001_models()
  kernels = value(model.kernel), value(model2.kernel)
  nnx.fori_loop(0, 10, identity_body, (model, model2), **graph_kw(graph))
  np.testing.assert_array_equal(value(model.kernel), kernels[0])
  np.testing.assert_array_equal(value(model2.kernel), kernels[1])


# ----------------------------------------------------------------------------- seed 000 (lb.ToNNX)
@functools.cache
def _seed_000_base():
  x = jax.random.normal(jax.random.key(1), (1, 4))
  module = MLP(depth=2, features=4)
  model = lb.ToNNX(module, rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=5)
  return module, model, x


def seed_000():
  """The seed-000 model, lb.ToNNX with capacity=5 (a fresh copy: lazy_init once per session)."""
  module, base, x = _seed_000_base()
  model = nnx.clone(base)
  assert int(lb.counts(model)["intermediates"]["x"]) == 0
  variables = {"params": nnx.state(model, nnx.Param).to_pure_dict()}
  return module, model, variables, x


def linen_chain(module, variables, x, steps):
  """Plain Linen, one apply per step, each step fed the previous output."""
  outs, inters = [], []
  for _ in range(steps):
    (y,), (inter,) = linen_step_reference(module, variables, [x])
    outs.append(y)
    inters.append(inter)
    x = y
  return outs, inters


def check_records(model, inters):
  recorded = lb.recorded(model)["intermediates"]
  np.testing.assert_allclose(recorded["x"], stack_reference(inters, ("x",)), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
    recorded["ScanBlock_0"]["carry"],
    stack_reference(inters, ("ScanBlock_0", "carry")),
    rtol=RTOL,
    atol=ATOL,
  )


def seed_000_body(carry):
  model, x, step = carry
  return model, model(x, mutable=True), step + 1


def test_seed_000_lb_while_loop_matches_linen():
  module, model, variables, x = seed_000()
  _, y, step = lb.while_loop(lambda c: c[2] < 3, seed_000_body, (model, x, 0))
  outs, inters = linen_chain(module, variables, x, 3)
  assert int(step) == 3
  np.testing.assert_allclose(y, outs[-1], rtol=RTOL, atol=ATOL)
  check_records(model, inters)


def test_seed_000_lb_fori_loop_matches_linen():
  module, model, variables, x = seed_000()
  _, y, _ = lb.fori_loop(0, 4, lambda i, c: seed_000_body(c), (model, x, 0))
  outs, inters = linen_chain(module, variables, x, 4)
  np.testing.assert_allclose(y, outs[-1], rtol=RTOL, atol=ATOL)
  check_records(model, inters)


def test_seed_000_inside_nnx_jit(graph):
  module, model, variables, x = seed_000()

  def run(model, x):
    model, y, _ = lb.while_loop(lambda c: c[2] < 3, seed_000_body, (model, x, 0))
    return y

  y = nnx.jit(run, **graph_kw(graph))(model, x)
  outs, inters = linen_chain(module, variables, x, 3)
  np.testing.assert_allclose(y, outs[-1], rtol=RTOL, atol=ATOL)
  check_records(model, inters)


def test_traced_bounds_inside_jit():
  module, model, variables, x = seed_000()

  @nnx.jit
  def run(model, x, n):
    return lb.fori_loop(jnp.int32(0), n, lambda i, c: seed_000_body(c), (model, x, 0))[1]

  y = run(model, x, jnp.int32(2))
  outs, inters = linen_chain(module, variables, x, 2)
  np.testing.assert_allclose(y, outs[-1], rtol=RTOL, atol=ATOL)
  check_records(model, inters)


# ----------------------------------------------------------------------------- carries
class Holder(nnx.Module):
  def __init__(self, sub):
    self.sub = sub
    self.scale = nnx.Param(jnp.ones(()))


def shared_body(i, carry):
  a, b, x = carry
  _compat.set_variable_value(a.sub.kernel, _compat.variable_value(a.sub.kernel) * 0.9)
  _compat.set_variable_value(b.scale, _compat.variable_value(b.scale) + 1.0)
  return a, b, b.sub(x) * _compat.variable_value(b.scale)


def test_shared_submodule_carry():
  shared = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  a, b = Holder(shared), Holder(shared)
  ref_a, ref_b = nnx.clone((a, b))  # one clone of both: the sharing is kept in the copy
  assert ref_a.sub is ref_b.sub
  x = jnp.ones((1, 2))
  _, _, y = lb.fori_loop(0, 3, shared_body, (a, b, x))
  y_ref = x
  for i in range(3):
    _, _, y_ref = shared_body(i, (ref_a, ref_b, y_ref))
  assert a.sub is b.sub is shared
  np.testing.assert_allclose(y, y_ref, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(value(shared.kernel), value(ref_a.sub.kernel), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(value(b.scale), 4.0)
  np.testing.assert_allclose(value(a.scale), 1.0)


@pytest.mark.parametrize("loop", ["while", "fori"])
def test_graph_argument_is_refused(loop):
  """The loops split the carry one way on every flax (shared references kept), so a `graph=`
  switch would have no effect; it is refused rather than silently ignored."""
  model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="graph"):
    if loop == "while":
      lb.while_loop(lambda c: False, lambda c: c, model, graph=False)
    else:
      lb.fori_loop(0, 1, lambda i, c: c, model, graph=False)


def test_mixed_carry_stock_native_bridged_and_scalars():
  """lb.ToNNX, a native module, a dict, a Python int and a float array in one carry."""
  module, bridged, variables, x = seed_000()
  native = nnx.Linear(4, 4, rngs=nnx.Rngs(3))
  ref_native = nnx.clone(native)
  carry = {"bridged": bridged, "native": native, "x": x, "n": 0, "acc": jnp.zeros(())}

  def body(c):
    y = c["native"](c["bridged"](c["x"]))
    return {**c, "x": y, "n": c["n"] + 1, "acc": c["acc"] + y.sum()}

  out = lb.while_loop(lambda c: c["n"] < 2, body, carry)
  assert out["bridged"] is bridged and out["native"] is native and int(out["n"]) == 2
  y_ref, acc = x, 0.0
  inters = []
  for _ in range(2):
    (h,), (inter,) = linen_step_reference(module, variables, [y_ref])
    inters.append(inter)
    y_ref = ref_native(h)
    acc += float(y_ref.sum())
  np.testing.assert_allclose(out["x"], y_ref, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(out["acc"], acc, rtol=1e-4)
  check_records(bridged, inters)


def test_rngs_in_carry_advance_like_eager_calls():
  rngs, ref = nnx.Rngs(0), nnx.Rngs(0)

  def body(i, carry):
    rngs, total = carry
    return rngs, total + jax.random.uniform(rngs())

  _, total = lb.fori_loop(0, 3, body, (rngs, jnp.zeros(())))
  expected = sum(float(jax.random.uniform(ref())) for _ in range(3))
  np.testing.assert_allclose(total, expected, rtol=1e-6)
  assert int(value(rngs.default.count)) == int(value(ref.default.count)) == 3


def test_structure_error_is_the_explain_report():
  def body(i, x):
    return jnp.concatenate([x, x])

  expected = str(lb.explain(lambda x: body(0, x), jnp.ones(2)))
  with pytest.raises(lb.StructureChangeError) as info:
    lb.fori_loop(0, 2, body, jnp.ones(2))
  assert str(info.value).endswith(expected.replace("lb.explain(<lambda>)", "lb.explain(body)"))


def test_eager_call_is_traced_once():
  model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  traces = []

  def body(i, carry):
    traces.append(i)
    m, x = carry
    return m, m(x)

  x = jnp.ones((1, 2))
  y1 = lb.fori_loop(0, 2, body, (model, x))[1]
  y2 = lb.fori_loop(0, 2, body, (model, x))[1]
  assert len(traces) == 1
  np.testing.assert_allclose(y1, y2)


def test_same_module_twice_and_numpy_bounds():
  model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  kernel = value(model.kernel)

  def body(i, carry):
    a, b, x = carry
    _compat.set_variable_value(a.kernel, _compat.variable_value(a.kernel) + 1.0)
    return a, b, x + _compat.variable_value(b.kernel).sum()

  a, b, x = lb.fori_loop(np.int64(0), np.int64(3), body, (model, model, jnp.zeros(())))
  assert a is b is model
  np.testing.assert_allclose(value(model.kernel), kernel + 3.0)
  expected = sum(float((kernel + k).sum()) for k in (1.0, 2.0, 3.0))  # b is a: sees each update
  np.testing.assert_allclose(x, expected, rtol=1e-6)


def test_grad_through_lb_fori_loop_matches_python_loop():
  model = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
  x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)

  def loss_lb(m):
    _, y = lb.fori_loop(0, 3, lambda i, c: (c[0], jnp.tanh(c[0](c[1]))), (m, x))
    return (y**2).sum()

  def loss_python(m):
    y = x
    for _ in range(3):
      y = jnp.tanh(m(y))
    return (y**2).sum()

  grads = nnx.grad(loss_lb)(model)
  grads_ref = nnx.grad(loss_python)(nnx.clone(model))
  np.testing.assert_allclose(
    value(grads["kernel"]), value(grads_ref["kernel"]), rtol=1e-5, atol=1e-6
  )


# flax 0.12 deprecates `Module.sow` outside `nnx.capture` (0.10 has no capture); a native sow
# growing in a loop is exactly the failure these tests explain.
native_sow_warning = pytest.mark.filterwarnings(
  r"ignore:Using 'Module\.sow\(\)' outside of 'nnx\.capture\(\)':DeprecationWarning"
)


class Sower(nnx.Module):
  def __init__(self):
    self.linear = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

  def __call__(self, x):
    y = self.linear(x)
    self.sow(nnx.Intermediate, "y", y)
    return y


@native_sow_warning
def test_native_sows_preallocated_in_lb_fori_loop_match_eager_calls():
  model, x = Sower(), jnp.ones((1, 2))
  ref = nnx.clone(model)
  lb.preallocate(model, x, capacity=4)
  _, y = lb.fori_loop(0, 3, lambda i, c: (c[0], c[0](c[1])), (model, x))
  y_ref = x
  for _ in range(3):
    y_ref = ref(y_ref)  # plain NNX: appends to the sow tuple
  np.testing.assert_allclose(y, y_ref, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["y"],
    jnp.stack(_compat.variable_value(ref.y)),
    rtol=RTOL,
    atol=ATOL,
  )


# ----------------------------------------------------------------------------- structure errors
@native_sow_warning
def test_native_sow_growing_raises_readable_error():
  model, x = Sower(), jnp.ones((1, 2))
  model(x)
  with pytest.raises(
    lb.StructureChangeError,
    match=r"(?s)lb\.fori_loop: the body changes the structure.*carry\[0\]\.y: "
    r"sow tuple grew from 1 to 2 values.*lb\.preallocate",
  ):
    lb.fori_loop(0, 3, lambda i, c: (c[0], c[0](c[1])), (model, x))


def test_stock_bridge_in_while_loop_raises_readable_error():
  x = jnp.ones((1, 4))
  model = bridge.ToNNX(MLP(depth=2, features=4), rngs=nnx.Rngs(0))
  bridge.lazy_init(model, x)
  with pytest.raises(
    lb.StructureChangeError,
    match=r"(?s)lb\.while_loop: .*carry\[0\]\.x: new sow tuple.*"
    r"stock flax\.nnx\.bridge\.ToNNX",
  ):
    lb.while_loop(lambda c: c[2] < 3, seed_000_body, (model, x, 0))


def test_shape_change_raises_readable_error_under_jit():
  @jax.jit
  def run(x):
    return lb.fori_loop(0, 2, lambda i, x: jnp.concatenate([x, x]), x)

  with pytest.raises(lb.StructureChangeError, match=r"carry: shape \(2,\) became \(4,\)"):
    run(jnp.ones(2))


def test_dtype_change_raises_readable_error():
  with pytest.raises(lb.StructureChangeError, match=r"carry\[1\]: dtype float32 became int32"):
    lb.while_loop(
      lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1].astype(jnp.int32)), (0, jnp.ones(2))
    )


def test_sharing_broken_raises_readable_error():
  shared = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

  def body(i, carry):
    a, b = carry
    b.sub = nnx.clone(b.sub)
    return a, b

  with pytest.raises(
    lb.StructureChangeError, match=r"carry\[0\]\.sub and carry\[1\]\.sub were one shared Linear"
  ):
    lb.fori_loop(0, 2, body, (Holder(shared), Holder(shared)))


# ---------------------------------------------------------------- modules outside the carry

CLOSED = nnx.Linear(2, 2, rngs=nnx.Rngs(3))  # reached through the body's globals


def _global_body(i, x):
  return jnp.tanh(CLOSED(x))


class _Sampler:
  def __init__(self, model):
    self.model = model

  def step(self, i, x):
    return jnp.tanh(self.model(x))


def _bodies(model):
  """The ways a body reaches a module outside its carry."""

  def closure(i, x):
    return jnp.tanh(model(x))

  def default(i, x, m=model):
    return jnp.tanh(m(x))

  return {
    "closure": (model, closure),
    "default-argument": (model, default),
    "bound-method-self": (model, _Sampler(model).step),
    "functools-partial": (model, functools.partial(lambda m, i, x: jnp.tanh(m(x)), model)),
    "global": (CLOSED, _global_body),
  }


def _loops(name):
  """(lb loop, nnx loop) running the fori body 3 times; the while one counts in the carry."""
  if name == "fori":
    return (
      lambda body, x: lb.fori_loop(0, 3, body, x),
      lambda body, x: nnx.fori_loop(0, 3, body, x),
    )

  def as_while(loop):
    return lambda body, x: loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, body(c[0], c[1])), (0, x))[
      1
    ]

  return as_while(lb.while_loop), as_while(nnx.while_loop)


@pytest.mark.parametrize("kind", ["fori", "while"])
@pytest.mark.parametrize("how", list(_bodies(None)))
def test_a_module_outside_the_carry_is_read_at_each_call(kind, how):
  """Its params change between calls: every call sees the current ones, as nnx loops do."""
  model, body = _bodies(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))[how]
  ours, theirs = _loops(kind)
  x = jnp.array([[0.5, -1.0]])
  kernel = _compat.variable_value(model.kernel)
  try:
    for scale in (1.0, 2.0, -0.5):
      _compat.set_variable_value(model.kernel, kernel * scale)
      want = x
      for _ in range(3):  # plain Python: the reference
        want = jnp.tanh(want @ (kernel * scale) + _compat.variable_value(model.bias))
      np.testing.assert_allclose(ours(body, x), want, rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(ours(body, x), theirs(body, x), rtol=1e-6, atol=1e-6)
  finally:
    _compat.set_variable_value(model.kernel, kernel)


def test_a_body_reaching_nothing_outside_the_carry_is_still_compiled_once():
  """The test above can fail: a cached loop over a closed-over module reads stale params."""
  from loopbridge._loops import loops as _loops

  model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  assert _loops._closure_state(lambda i, c: (c[0], c[0](c[1]))).dynamic is False
  assert _loops._closure_state(lambda i, x: model(x)).nodes == [model]
  assert _loops._closure_state(lambda i, x: x + jnp.ones(2)).dynamic is False  # jnp: a module
  arr = jnp.ones(2)
  assert _loops._closure_state(lambda i, x: x + arr).dynamic is True


@pytest.mark.parametrize("kind", ["fori", "while"])
def test_a_body_writing_to_a_module_outside_the_carry_is_refused(kind):
  class Net(nn.Module):
    def __call__(self, x):
      self.sow("intermediates", "x", x)
      return x + 1

  x = jnp.ones((1, 2))
  model = lb.lazy_init(lb.ToNNX(Net()), x, capacity=4)
  raw = {
    path: _compat.get_raw_value(v)
    for path, v in _compat.iter_graph(model)
    if isinstance(v, nnx.Variable)
  }
  ours, _ = _loops(kind)
  with pytest.raises(
    lb.StructureChangeError,
    match=rf"lb.{kind}_loop: the body writes to a module it reaches outside the "
    r"loop carry \(ToNNX, .*Why: .*Fix: pass that module in the carry",
  ):
    ours(lambda i, x: model(x), x)
  for path, v in _compat.iter_graph(model):  # untouched: no traced value left behind
    if isinstance(v, nnx.Variable):
      assert _compat.get_raw_value(v) is raw[path]
  lb.fori_loop(0, 2, lambda i, c: (c[0], c[0](c[1])), (model, x))  # in the carry: records
  assert int(lb.counts(model)["intermediates"]["x"]) == 2
