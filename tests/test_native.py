"""Native NNX sows: `lb.preallocate` on any NNX module graph, recorded inside NNX loops.

The reference is the same NNX model class built from the same seed (same parameters), called
step by step eagerly with flax's own `sow` (a growing tuple per call), read back after each step.
The loops run compiled (XLA fuses differently from eager execution), so float comparisons use
RTOL/ATOL (float32 round-off); counts and shapes are exact.
"""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge import _compat

from conftest import graph_kw

RTOL, ATOL = 1e-5, 1e-6
val = _compat.variable_value  # Variable contents on every flax (0.12 deprecates `.value`)

# The references use flax's own `Module.sow` outside `nnx.capture`, as models written for
# flax 0.10 do; flax 0.12 deprecates that path with a DeprecationWarning on every call.
pytestmark = pytest.mark.filterwarnings(
  "ignore:.*Module.sow\\(\\)' outside of 'nnx.capture:DeprecationWarning"
)

needs_capture = pytest.mark.skipif(
  not hasattr(nnx, "capture"),
  reason=f"flax {'.'.join(map(str, _compat.FLAX_VERSION))} has no nnx.capture (flax 0.12.8 has it)",
)


class Act(nnx.Variable):
  """A user-defined collection type, to check any Variable subclass records."""


class Head(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(4, 3, rngs=rngs)

  def __call__(self, h):
    y = self.lin(h)
    self.sow(Act, "y", y)
    return y


class NativeMLP(nnx.Module):
  """Sows at the root (twice under one name), in a child, with two Variable types."""

  def __init__(self, rngs):
    self.l1 = nnx.Linear(3, 4, rngs=rngs)
    self.head = Head(rngs)

  def __call__(self, x):
    self.sow(nnx.Intermediate, "x", x)
    h = jax.nn.relu(self.l1(x))
    self.sow(nnx.Intermediate, "h", h)
    self.sow(nnx.Intermediate, "h", 2 * h)
    return jnp.tanh(self.head(h))


SITES = {
  ("intermediates", "x"): lambda m: m,
  ("intermediates", "h"): lambda m: m,
  ("Act", "y"): lambda m: m.head,
}


def reference(steps, x, seed=0):
  """Plain NNX step by step: {(collection, name): Array[n, ...]} in call order, and outputs."""
  ref = NativeMLP(nnx.Rngs(seed))
  got = {site: [] for site in SITES}
  outs = []
  for _ in range(steps):
    x = ref(x)
    outs.append(x)
    for (col, name), owner in SITES.items():
      module = owner(ref)
      got[(col, name)].extend(val(getattr(module, name)))
      delattr(module, name)
  return {k: jnp.stack(v) for k, v in got.items()}, outs


def check(model, want, n):
  rec = lb.recorded(model)
  np.testing.assert_allclose(
    rec["intermediates"]["x"], want[("intermediates", "x")][:n], rtol=RTOL, atol=ATOL
  )
  np.testing.assert_allclose(
    rec["intermediates"]["h"], want[("intermediates", "h")][: 2 * n], rtol=RTOL, atol=ATOL
  )
  np.testing.assert_allclose(rec["head"]["Act"]["y"], want[("Act", "y")][:n], rtol=RTOL, atol=ATOL)


X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


def test_preallocate_declares_buffers_per_module():
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=5)
  shapes = jax.tree.map(jnp.shape, lb.buffers(model))
  assert shapes == {
    "intermediates": {"x": (5, 2, 3), "h": (5, 2, 4)},
    "head": {"Act": {"y": (5, 2, 3)}},
  }
  assert not hasattr(model, "h") and not hasattr(model.head, "y")  # nothing sown by discovery
  assert len(nnx.state(model, lb.Buffer).flat_state()) == 3


def test_while_loop(graph):
  steps = 4
  model = lb.preallocate(
    NativeMLP(nnx.Rngs(0)), X, capacity={"intermediates": 4, "h": 8, "head/y": 4}
  )

  @nnx.jit
  def run(model, x):
    def body(carry):
      model, x, i = carry
      return model, model(x), i + 1

    return nnx.while_loop(lambda c: c[2] < steps, body, (model, x, 0), **graph_kw(graph))

  model, y, _ = run(model, X)
  want, outs = reference(steps, X)
  check(model, want, steps)
  np.testing.assert_allclose(y, outs[-1], rtol=RTOL, atol=ATOL)
  assert int(lb.counts(model)["intermediates"]["h"]) == 2 * steps


def test_fori_loop(graph):
  steps = 3
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=8)

  @nnx.jit
  def run(model, x):
    def body(i, carry):
      model, x = carry
      return model, model(x)

    return nnx.fori_loop(0, steps, body, (model, x), **graph_kw(graph))

  model, _ = run(model, X)
  want, _ = reference(steps, X)
  check(model, want, steps)


def test_scan_model_in_carry(graph):
  steps = 3
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=6)
  xs = jnp.stack([X, 2 * X, -X])

  @nnx.jit
  def run(model, xs):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0), **graph_kw(graph))
    def body(model, x):
      return model, model(x)

    return body(model, xs)

  model, ys = run(model, xs)
  ref = NativeMLP(nnx.Rngs(0))
  for i in range(steps):
    np.testing.assert_allclose(ys[i], ref(xs[i]), rtol=RTOL, atol=ATOL)
  rec = lb.recorded(model)
  np.testing.assert_allclose(rec["intermediates"]["x"], xs, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
    rec["head"]["Act"]["y"], jnp.stack(val(ref.head.y)), rtol=RTOL, atol=ATOL
  )


@pytest.mark.parametrize("overflow", ["drop", "wrap"])
def test_overflow_policies(overflow):
  steps, capacity = 5, 2
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=capacity, overflow=overflow)
  model, _ = nnx.fori_loop(0, steps, lambda i, c: (c[0], c[0](c[1])), (model, X))
  want, _ = reference(steps, X)
  sl = slice(0, capacity) if overflow == "drop" else slice(steps - capacity, steps)
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["x"], want[("intermediates", "x")][sl], rtol=RTOL, atol=ATOL
  )
  assert int(lb.counts(model)["head"]["Act"]["y"]) == steps


def test_error_overflow_and_reset():
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=1)
  model(X)
  model(X)
  with pytest.raises(lb.BufferOverflowError, match="capacity=1"):
    lb.recorded(model)
  lb.reset(model)
  assert lb.recorded(model)["intermediates"]["x"].shape == (0, 2, 3)


def test_structure_identical_and_no_retrace():
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=4)
  before = nnx.state(model)
  variables = [v for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)]
  traces = []

  @nnx.jit
  def step(model, x):
    traces.append(1)
    return model(x)

  step(model, X)
  step(model, X)
  after = nnx.state(model)
  assert jax.tree.structure(before) == jax.tree.structure(after)

  def shapes(state):
    return [(jnp.shape(a), jnp.result_type(a)) for a in jax.tree.leaves(state)]

  assert shapes(before) == shapes(after)
  assert [v for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)] == variables
  assert len(traces) == 1


# ------------------------------------------------------------------- stacked layers (nnx.scan)
class Layer(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(4, 4, rngs=rngs)

  def __call__(self, x):
    h = self.lin(x)
    self.sow(nnx.Intermediate, "h", h)
    return jnp.tanh(h)


class ScanStack(nnx.Module):
  """Layers built with nnx.vmap and applied with nnx.scan (flax's scan-over-layers recipe)."""

  def __init__(self, rngs, depth=3):
    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return Layer(rngs)

    self.layers = make(rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def body(x, layer):
      return layer(x)

    return body(x, self.layers)


class Ensemble(nnx.Module):
  """nnx.vmap over stacked members, each seeing its own input."""

  def __init__(self, rngs, members=2):
    @nnx.split_rngs(splits=members)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return Layer(rngs)

    self.members = make(rngs)

  def __call__(self, xs):
    return nnx.vmap(lambda m, x: m(x), in_axes=(0, 0))(self.members, xs)


@pytest.mark.parametrize("kind", ["scan", "vmap"])
def test_stacked_layers_record_per_layer(kind, graph):
  steps = 3
  build = (lambda: ScanStack(nnx.Rngs(0))) if kind == "scan" else (lambda: Ensemble(nnx.Rngs(0)))
  x = (
    jnp.linspace(-1, 1, 8).reshape(2, 4)
    if kind == "scan"
    else (jnp.linspace(-1, 1, 16).reshape(2, 2, 4))
  )
  owner = "layers" if kind == "scan" else "members"
  model = lb.preallocate(build(), x, capacity=steps)
  assert lb.buffers(model)[owner]["intermediates"]["h"].shape[:2] == (
    (3, steps) if kind == "scan" else (2, steps)
  )

  @nnx.jit
  def run(model, x):
    return nnx.fori_loop(0, steps, lambda i, c: (c[0], c[0](c[1])), (model, x), **graph_kw(graph))

  model, _ = run(model, x)
  ref, values, h = build(), [], x
  for _ in range(steps):
    h = ref(h)
    stacked = getattr(ref, owner)
    values.extend(val(stacked.h))  # flax stacks each sow along the layer axis: (L, ...)
    delattr(stacked, "h")
  rec = lb.recorded(model)[owner]["intermediates"]["h"]
  assert rec.shape == (steps, *values[0].shape)
  np.testing.assert_allclose(rec, jnp.stack(values), rtol=RTOL, atol=ATOL)
  layers = 3 if kind == "scan" else 2
  assert lb.counts(model)[owner]["intermediates"]["h"].tolist() == [steps] * layers  # per layer


# ------------------------------------------------------------------------------- nnx.capture
@needs_capture
def test_capture_inside_loop_still_returns_this_calls_sows():
  steps = 3
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=2 * steps)

  @nnx.jit
  def run(model, x):
    def body(i, carry):
      model, x, _last = carry
      y, inter = nnx.capture(model, nnx.Intermediate)(x)
      return model, y, inter["x"][0]

    return nnx.fori_loop(0, steps, body, (model, x, jnp.zeros_like(x)))

  model, _, last_x = run(model, X)
  want, outs = reference(steps, X)
  check(model, want, steps)
  np.testing.assert_allclose(last_x, outs[-2], rtol=RTOL, atol=ATOL)


@needs_capture
def test_capture_method_outputs_on_a_preallocated_model_goes_to_the_capture_only():
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=4)
  y, sown = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(X)
  np.testing.assert_allclose(sown["__call__"][0], y)  # the capture saw the method output
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["x"], X[None])  # declared: kept


# ----------------------------------------------------------------- custom reduce, re-declare
class Summing(nnx.Module):
  def __call__(self, x):
    self.sow(
      nnx.Intermediate, "total", x, init_fn=lambda: jnp.zeros(()), reduce_fn=lambda a, b: a + b
    )
    self.sow(nnx.Intermediate, "x", x)
    return x + 1


def test_custom_reduce_accumulator_is_created_and_loops():
  model = lb.preallocate(Summing(), jnp.zeros((2,)), capacity=4)
  assert val(model.total).shape == (2,)  # init_fn() broadcast to the accumulated shape
  model, _ = nnx.fori_loop(0, 3, lambda i, c: (c[0], c[0](c[1])), (model, jnp.zeros((2,))))
  np.testing.assert_allclose(val(model.total), [3.0, 3.0])  # 0 + 1 + 2
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["x"], [[0, 0], [1, 1], [2, 2]])


def test_preallocate_again_for_a_longer_signature_keeps_same_storage():
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=3)
  model(X)
  lb.preallocate(model, X, capacity=3)  # same storage: kept
  assert int(lb.counts(model)["intermediates"]["x"]) == 1
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", lb.RecordsDiscardedWarning)
    lb.preallocate(model, jnp.ones((5, 3)), capacity=3)  # a new value shape: starts empty
  assert any(
    "held 1 recorded value" in str(w.message)
    for w in caught
    if issubclass(w.category, lb.RecordsDiscardedWarning)
  )
  assert lb.buffers(model)["intermediates"]["x"].shape == (3, 5, 3)
  assert int(lb.counts(model)["intermediates"]["x"]) == 0


def test_stale_tuple_from_earlier_plain_call_is_replaced():
  model = NativeMLP(nnx.Rngs(0))
  model(X)  # flax's own sow (no buffers yet): a tuple attribute
  assert isinstance(val(model.x), tuple)
  lb.preallocate(model, X, capacity=2)
  assert not hasattr(model, "x")
  model(X)
  assert lb.recorded(model)["intermediates"]["x"].shape == (1, 2, 3)


# ---------------------------------------------------------------------------------- errors
def test_error_no_capacity():
  with pytest.raises(lb.CapacityError, match="no capacity was declared"):
    lb.preallocate(NativeMLP(nnx.Rngs(0)), X)


def test_error_key_matches_no_site():
  with pytest.raises(lb.CapacityError, match="match no sow site"):
    lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity={"intermediates": 2, "Act": 2, "nope": 3})


def test_error_site_not_declared():
  class Branchy(nnx.Module):
    def __call__(self, x, extra=False):
      self.sow(nnx.Intermediate, "x", x)
      if extra:
        self.sow(nnx.Intermediate, "extra", x)
      return x

  model = lb.preallocate(Branchy(), X, capacity=2)
  with pytest.raises(lb.NotDeclaredError, match=r"has no buffer for it.*lb\.preallocate"):
    model(X, extra=True)


def test_error_shape_changed():
  model = lb.preallocate(NativeMLP(nnx.Rngs(0)), X, capacity=2)
  with pytest.raises(lb.NotDeclaredError, match="declared for shape"):
    model(jnp.ones((4, 3)))


def test_error_not_a_module():
  with pytest.raises(TypeError, match="needs an NNX module"):
    lb.preallocate(lambda x: x, X, capacity=2)


def test_method_by_name_and_bound_method():
  class TwoWays(nnx.Module):
    def __call__(self, x):
      return x

    def other(self, x):
      self.sow(nnx.Intermediate, "o", x)
      return x

  a = lb.preallocate(TwoWays(), X, capacity=2, method="other")
  b = TwoWays()
  assert lb.preallocate(b.other, X, capacity=2) == b.other
  for m in (a, b):
    m.other(X)
    np.testing.assert_allclose(lb.recorded(m)["intermediates"]["o"], X[None])


# ----------------------------------------------------------------- bridged parts in the graph
class LinenSow(nn.Module):
  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    return x


def test_error_uninitialized_bridge_in_graph():
  class Holder(nnx.Module):
    def __init__(self):
      self.part = lb.ToNNX(LinenSow())

    def __call__(self, x):
      return self.part(x)

  with pytest.raises(lb.NotDeclaredError, match=r"'part' is not initialized.*lb\.lazy_init"):
    lb.preallocate(Holder(), X, capacity=2)


def test_error_bridge_called_inside_an_nnx_transform():
  class Ensemble(nnx.Module):
    def __init__(self):
      self.part = lb.lazy_init(lb.ToNNX(LinenSow()), X[0], capacity=2)

    def __call__(self, xs):
      return nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(self.part, xs)

  with pytest.raises(TypeError, match=r"inside an NNX transform.*lb.preallocate on that lb.ToNNX"):
    lb.preallocate(Ensemble(), X, capacity=2)


def test_error_lazy_init_of_a_sowing_bridge_broadcast_by_nnx_vmap():
  class Ensemble(nnx.Module):
    def __init__(self):
      self.part = lb.ToNNX(LinenSow(), rngs=nnx.Rngs(0))

    def __call__(self, xs):
      return nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(self.part, xs)

  with pytest.raises(
    TypeError,
    match=r"sows inside an NNX transform which does not stack it"
    r".*Why.*Fix: give the module the transform axis",
  ):
    lb.lazy_init(Ensemble(), jnp.stack([X, X]), capacity=2)


def test_lazy_init_through_a_transform_leaves_children_it_did_not_call_uninitialized():
  class Parent(nnx.Module):
    def __init__(self):
      self.called = lb.ToNNX(nn.Dense(3), rngs=nnx.Rngs(0))
      self.unused = lb.ToNNX(nn.Dense(3), rngs=nnx.Rngs(1))

    def __call__(self, x):
      run = nnx.split_rngs(splits=2)(nnx.vmap(lambda m, x: m(x), in_axes=(0, None), axis_size=2))
      return run(self.called, x)

  model = lb.lazy_init(Parent(), X)
  kernel = lb.linen_variables(model.called)["params"]["kernel"]
  assert kernel.shape == (2, X.shape[-1], 3)
  np.testing.assert_allclose(
    model(X)[1],
    X @ kernel[1] + lb.linen_variables(model.called)["params"]["bias"][1],
    rtol=1e-5,
    atol=1e-6,
  )
  with pytest.raises(lb.NotDeclaredError, match=r"called before it was initialized.*Fix"):
    model.unused(X)


def test_bridged_and_native_capacity_keys_resolve_from_the_root():
  class Holder(nnx.Module):
    def __init__(self):
      self.part = lb.lazy_init(lb.ToNNX(LinenSow()), X, capacity=1)

    def __call__(self, x):
      self.sow(nnx.Intermediate, "y", self.part(x))
      return x

  model = lb.preallocate(Holder(), X, capacity={"part/x": 3, "y": 2})
  shapes = jax.tree.map(jnp.shape, lb.buffers(model))
  assert shapes == {"intermediates": {"y": (2, 2, 3)}, "part": {"intermediates": {"x": (3, 2, 3)}}}
  model, _ = nnx.fori_loop(0, 2, lambda i, c: (c[0], c[0](c[1])), (model, X))
  rec = lb.recorded(model)
  np.testing.assert_allclose(rec["part"]["intermediates"]["x"], jnp.stack([X, X]))
  np.testing.assert_allclose(rec["intermediates"]["y"], jnp.stack([X, X]))


def test_reset_inside_loop_keeps_stacked_counts_shape():
  x = jnp.linspace(-1, 1, 8).reshape(2, 4)
  model = lb.preallocate(ScanStack(nnx.Rngs(0)), x, capacity=2)

  def body(i, carry):
    model, x = carry
    lb.reset(model)  # keep only the last step
    return model, model(x)

  model, _ = nnx.fori_loop(0, 3, body, (model, x))
  ref, h = ScanStack(nnx.Rngs(0)), x
  for _ in range(3):
    h = ref(h)
  last = val(ref.layers.h)[-1]
  rec = lb.recorded(model)["layers"]["intermediates"]["h"]
  assert rec.shape == (1, 3, 2, 4)
  np.testing.assert_allclose(rec[0], last, rtol=RTOL, atol=ATOL)


def test_bridge_called_twice_with_different_sites():
  class TwoCalls(nn.Module):
    @nn.compact
    def __call__(self, x, first):
      self.sow("intermediates", "first" if first else "second", x)
      return x

  class Holder(nnx.Module):
    def __init__(self):
      self.part = lb.lazy_init(lb.ToNNX(TwoCalls()), X, True, capacity=1)

    def __call__(self, x):
      return self.part(self.part(x, True), False)

  model = lb.preallocate(Holder(), X, capacity={"part/first": 2, "part/second": 3})
  shapes = jax.tree.map(jnp.shape, lb.buffers(model))
  assert shapes == {"part": {"intermediates": {"first": (2, 2, 3), "second": (3, 2, 3)}}}
  model(X)
  assert int(lb.counts(model)["part"]["intermediates"]["second"]) == 1
