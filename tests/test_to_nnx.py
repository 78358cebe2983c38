"""Core: lb.ToNNX records every sow into preallocated buffers and stays loop-stable.

Every recorded value is compared with an independent reference: the plain Linen module applied
step by step with `mutable=['intermediates']`, using the same parameters. The loop runs compiled
(XLA fuses differently from eager op-by-op execution), so float comparisons use
RTOL/ATOL below (float32 round-off); integer counts and shapes are exact.
"""

from __future__ import annotations

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

RTOL, ATOL = 1e-5, 1e-6  # float32 round-off between a compiled loop and eager Linen


def linen_variables(model: lb.ToNNX) -> dict:
  """The bridged model's Linen variables (params etc.), to feed the plain-Linen reference."""
  return lb.linen_variables(model)


def seed_model(capacity=5, overflow="error", depth=3, features=8):
  x = jax.random.normal(jax.random.key(1), (1, features))
  model = lb.ToNNX(MLP(depth, features), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=capacity, overflow=overflow)
  return model, x


def reference_chain(model, x, steps):
  """Feed each output back as the next input (the seed's loop), in plain Linen."""
  linen_module = _compat.linen_module_of(model)
  variables = linen_variables(model)
  inputs, inters, h = [], [], x
  for _ in range(steps):
    inputs.append(h)
    (h,), (inter,) = linen_step_reference(linen_module, variables, [h])
    inters.append(inter)
  return h, inters


def assert_seed_records(model, inters, first, last):
  rec = lb.recorded(model)["intermediates"]
  want_x = stack_reference(inters, ["x"])[first:last]
  want_carry = stack_reference(inters, ["ScanBlock_0", "carry"])[first:last]
  np.testing.assert_allclose(rec["x"], want_x, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(rec["ScanBlock_0"]["carry"], want_carry, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------- the seed


def test_seed_000_program_runs_in_jitted_while_loop(graph):
  """The seed program with only the import and `capacity=` changed (and jit around it)."""
  model, x = seed_model(capacity=5)

  def step(carry):
    model, inputs, step = carry
    outputs = model(inputs, mutable=True)
    return model, outputs, step + 1

  def cond(carry):
    return carry[2] < 5

  @nnx.jit(**graph_kw(graph))
  def run(model, x):
    # Tree mode: a module passed to jit and returned again is an alias; it is updated in place.
    _, outputs, n = nnx.while_loop(cond, step, (model, x, 0), **graph_kw(graph))
    return outputs, n

  outputs, steps = run(model, x)
  assert int(steps) == 5
  final, inters = reference_chain(model, x, 5)
  np.testing.assert_allclose(outputs, final, rtol=RTOL, atol=ATOL)
  rec = lb.recorded(model)["intermediates"]
  assert rec["x"].shape == (5, 1, 8)
  assert rec["ScanBlock_0"]["carry"].shape == (5, 3, 1, 8)
  assert_seed_records(model, inters, 0, 5)


def test_eager_calls_record_in_order_and_keep_structure():
  model, x = seed_model(capacity=4)
  graphdef0, state0 = nnx.split(model)
  variables0 = {id(v) for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)}
  shapes0 = [(a.shape, a.dtype) for a in jax.tree.leaves(state0)]

  h = x
  for _ in range(3):
    h = model(h)

  graphdef1, state1 = nnx.split(model)
  assert graphdef1 == graphdef0
  assert jax.tree.structure(state1) == jax.tree.structure(state0)
  assert [(a.shape, a.dtype) for a in jax.tree.leaves(state1)] == shapes0
  assert {id(v) for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)} == variables0
  _, inters = reference_chain(model, x, 3)
  assert_seed_records(model, inters, 0, 3)
  assert int(lb.counts(model)["intermediates"]["x"]) == 3


def test_jitted_loop_is_not_retraced_on_second_call():
  model, x = seed_model(capacity=8)
  traces = []

  @nnx.jit
  def run(model, x):
    traces.append(1)
    return nnx.fori_loop(0, 3, lambda i, c: (c[0], c[0](c[1])), (model, x))[1]

  run(model, x)
  run(model, x)
  assert len(traces) == 1
  assert int(lb.counts(model)["intermediates"]["x"]) == 6


# --------------------------------------------------------------------------- loop kinds


def test_fori_loop(graph):
  model, x = seed_model(capacity=6)

  @nnx.jit(**graph_kw(graph))
  def run(model, x):
    return nnx.fori_loop(0, 6, lambda i, c: (c[0], c[0](c[1])), (model, x), **graph_kw(graph))[1]

  out = run(model, x)
  final, inters = reference_chain(model, x, 6)
  np.testing.assert_allclose(out, final, rtol=RTOL, atol=ATOL)
  assert_seed_records(model, inters, 0, 6)


def test_scan_with_model_in_carry(graph):
  model, x = seed_model(capacity=4)
  noise = jax.random.normal(jax.random.key(2), (4, 1, 8))

  @nnx.jit(**graph_kw(graph))
  def run(model, x, noise):
    def body(carry, n):
      model, h = carry
      h = model(h + n)
      return (model, h), h

    scan = nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0), **graph_kw(graph))
    _, ys = scan((model, x), noise)
    return ys

  ys = run(model, x, noise)
  linen_module = _compat.linen_module_of(model)
  variables = linen_variables(model)
  h, inters = x, []
  for t in range(4):
    (h,), (inter,) = linen_step_reference(linen_module, variables, [h + noise[t]])
    inters.append(inter)
    np.testing.assert_allclose(ys[t], h, rtol=RTOL, atol=ATOL)
  assert_seed_records(model, inters, 0, 4)


def test_scan_with_params_broadcast_and_buffers_carried():
  """nnx.StateAxes: params broadcast (None), buffers/counts/rng state carried."""
  model, _x = seed_model(capacity=4)
  xs = jax.random.normal(jax.random.key(3), (4, 1, 8))
  axes = nnx.StateAxes({nnx.Param: None, ...: nnx.Carry})

  @nnx.jit
  def run(model, xs):
    @nnx.scan(in_axes=(axes, 0), out_axes=0)
    def body(model, x):
      return model(x)

    return body(model, xs)

  ys = run(model, xs)
  linen_module = _compat.linen_module_of(model)
  outs, inters = linen_step_reference(linen_module, linen_variables(model), list(xs))
  np.testing.assert_allclose(ys, jnp.stack(outs), rtol=RTOL, atol=ATOL)
  assert_seed_records(model, inters, 0, 4)


def test_jax_lax_loop_via_split_merge():
  model, x = seed_model(capacity=5)
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, x):
    def body(i, carry):
      state, h = carry
      m = nnx.merge(graphdef, state)
      h = m(h)
      return nnx.state(m), h

    return jax.lax.fori_loop(0, 5, body, (state, x))

  state, out = run(state, x)
  nnx.update(model, state)
  final, inters = reference_chain(model, x, 5)
  np.testing.assert_allclose(out, final, rtol=RTOL, atol=ATOL)
  assert_seed_records(model, inters, 0, 5)


def test_grad_through_fori_loop_with_static_bounds():
  model, x = seed_model(capacity=3)

  def loss(model, x):
    _, h = nnx.fori_loop(0, 3, lambda i, c: (c[0], c[0](c[1])), (model, x))
    return jnp.sum(h**2)

  grads = nnx.jit(nnx.grad(loss))(model, x)
  linen_module = _compat.linen_module_of(model)
  variables = linen_variables(model)

  def linen_loss(params):
    h = x
    for _ in range(3):
      h = linen_module.apply({"params": params}, h)
    return jnp.sum(h**2)

  want = jax.grad(linen_loss)(variables["params"])
  got = grads["ScanBlock_0"]["Dense_0"]["kernel"]
  got = got.get_value() if hasattr(got, "get_value") else got.value
  np.testing.assert_allclose(got, want["ScanBlock_0"]["Dense_0"]["kernel"], rtol=1e-4, atol=1e-6)
  # The loop inside the differentiated function recorded as well.
  assert int(lb.counts(model)["intermediates"]["x"]) == 3


# --------------------------------------------------------------------------- overflow policies


@pytest.mark.parametrize("overflow", ["error", "drop", "wrap"])
def test_overflow_policies_inside_jitted_loop(overflow):
  model, x = seed_model(capacity=3, overflow=overflow)

  @nnx.jit
  def run(model, x):
    return nnx.fori_loop(0, 7, lambda i, c: (c[0], c[0](c[1])), (model, x))[1]

  run(model, x)
  _, inters = reference_chain(model, x, 7)
  assert int(lb.counts(model)["intermediates"]["x"]) == 7
  if overflow == "error":
    with pytest.raises(
      lb.BufferOverflowError,
      match=r"intermediates/(x|ScanBlock_0/carry) recorded 7 values .*capacity=3",
    ):
      lb.recorded(model)
    # The first `capacity` values were kept; reading the raw buffer shows them.
    np.testing.assert_allclose(
      lb.buffers(model)["intermediates"]["x"],
      stack_reference(inters, ["x"])[:3],
      rtol=RTOL,
      atol=ATOL,
    )
  elif overflow == "drop":
    assert_seed_records(model, inters, 0, 3)
  else:
    assert_seed_records(model, inters, 4, 7)  # the last 3, oldest first


def test_recorded_inside_a_trace_returns_full_buffers_oldest_first():
  model, x = seed_model(capacity=3, overflow="wrap")

  @nnx.jit
  def run(model, x):
    nnx.fori_loop(0, 4, lambda i, c: (c[0], c[0](c[1])), (model, x))
    return lb.recorded(model), lb.counts(model)

  rec, cnt = run(model, x)
  assert rec["intermediates"]["x"].shape == (3, 1, 8)
  assert int(cnt["intermediates"]["x"]) == 4
  _, inters = reference_chain(model, x, 4)
  np.testing.assert_allclose(
    rec["intermediates"]["x"], stack_reference(inters, ["x"])[1:4], rtol=RTOL, atol=ATOL
  )


def test_reset_inside_loop_keeps_shapes_and_restarts_counts():
  model, x = seed_model(capacity=2)

  @nnx.jit
  def run(model, x):
    def body(i, c):
      m, h = c
      lb.reset(m)
      return m, m(h)

    return nnx.fori_loop(0, 4, body, (model, x))[1]

  run(model, x)
  _, inters = reference_chain(model, x, 4)
  assert int(lb.counts(model)["intermediates"]["x"]) == 1
  assert_seed_records(model, inters, 3, 4)
  lb.reset(model)
  assert lb.recorded(model)["intermediates"]["x"].shape == (0, 1, 8)
  assert not np.any(lb.buffers(model)["intermediates"]["x"])


# --------------------------------------------------------------------------- capacity forms


def test_capacity_mapping_by_collection_path_and_glob():
  x = jnp.ones((1, 8))
  model = lb.ToNNX(MLP(3, 8), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity={"x": 7, "ScanBlock_0/*": 2})
  bufs = lb.buffers(model)["intermediates"]
  assert bufs["x"].shape == (7, 1, 8)
  assert bufs["ScanBlock_0"]["carry"].shape == (2, 3, 1, 8)

  model = lb.ToNNX(MLP(3, 8), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity={"intermediates": 4, "x": 1})
  bufs = lb.buffers(model)["intermediates"]
  assert bufs["x"].shape == (1, 1, 8)
  assert bufs["ScanBlock_0"]["carry"].shape == (4, 3, 1, 8)


def test_capacity_from_constructor_and_method_form():
  x = jnp.ones((1, 8))
  model = lb.ToNNX(MLP(3, 8), rngs=nnx.Rngs(0), capacity=3, overflow="wrap")
  assert model.lazy_init(x) is model
  assert lb.buffers(model)["intermediates"]["x"].shape == (3, 1, 8)
  assert lb.sow_sites(model)["x"].overflow == "wrap"
  # Stock bridge.lazy_init goes through the same path.
  model2 = lb.ToNNX(MLP(3, 8), rngs=nnx.Rngs(0), capacity=2)
  bridge.lazy_init(model2, x)
  assert lb.buffers(model2)["intermediates"]["x"].shape == (2, 1, 8)


def test_is_a_stock_bridge_and_params_match_stock_lazy_init():
  x = jnp.ones((1, 8))
  ours = lb.ToNNX(MLP(3, 8), rngs=nnx.Rngs(0))
  lb.lazy_init(ours, x, capacity=2)
  stock = bridge.ToNNX(MLP(3, 8), rngs=nnx.Rngs(0))
  bridge.lazy_init(stock, x)
  assert isinstance(ours, bridge.ToNNX)
  jax.tree.map(
    np.testing.assert_array_equal, nnx.state(ours, nnx.Param), nnx.state(stock, nnx.Param)
  )
  # Buffers and counts are public Variable types, filterable like any other.
  assert set(
    jax.tree.leaves(
      jax.tree.map(lambda a: a.shape, nnx.state(ours, lb.Buffer)),
      is_leaf=lambda s: isinstance(s, tuple),
    )
  ) == {(2, 1, 8), (2, 3, 1, 8)}
  # One count vector per recorder, an entry per site.
  assert [c.shape for c in jax.tree.leaves(nnx.state(ours, lb.Count))] == [(2,)]


# --------------------------------------------------------------------------- where sows live


class SetupChild(nn.Module):
  @nn.compact
  def __call__(self, x):
    y = nn.Dense(4)(x)
    self.sow("intermediates", "y", y)
    self.sow("intermediates", "y", y * 2)  # same name twice per call: two slots, in order
    return y


class SetupParent(nn.Module):
  def setup(self):
    self.child = SetupChild()
    self.remat_child = nn.remat(SetupChild)()

  def __call__(self, x):
    return self.remat_child(self.child(x))


def test_setup_submodules_remat_and_repeated_names():
  x = jnp.arange(8.0).reshape(2, 4)
  model = lb.ToNNX(SetupParent(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=6)
  infos = {info.path: info for info in lb.sow_sites(model)}
  assert infos[("child", "y")].per_call == 2

  @nnx.jit
  def run(model, x):
    return nnx.fori_loop(0, 3, lambda i, c: (c[0], c[0](c[1]) @ jnp.ones((4, 4))), (model, x))[1]

  run(model, x)
  variables = linen_variables(model)
  h, inters = x, []
  for _ in range(3):
    out, state = SetupParent().apply(variables, h, mutable=["intermediates"])
    inters.append(state["intermediates"])
    h = out @ jnp.ones((4, 4))
  rec = lb.recorded(model)["intermediates"]
  for name in ("child", "remat_child"):
    want = stack_reference(inters, [name, "y"])
    assert want.shape == (6, 2, 4)
    np.testing.assert_allclose(rec[name]["y"], want, rtol=RTOL, atol=ATOL)


class VmapBody(nn.Module):
  @nn.compact
  def __call__(self, x):
    y = nn.Dense(3)(x)
    self.sow("intermediates", "y", y)
    return y


class Lifted(nn.Module):
  @nn.compact
  def __call__(self, x):
    v = nn.vmap(
      VmapBody,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      in_axes=0,
      out_axes=0,
    )()(x)

    class Inner(nn.Module):
      @nn.compact
      def __call__(self, c, _):
        c = jnp.tanh(nn.Dense(3)(c))
        self.sow("intermediates", "c", c)
        return c, None

    class Outer(nn.Module):
      @nn.compact
      def __call__(self, c, _):
        c, _ = nn.scan(
          Inner,
          variable_axes={"params": 0, "intermediates": 0},
          split_rngs={"params": True},
          length=2,
        )()(c, None)
        self.sow("intermediates", "c", c)
        return c, None

    nested, _ = nn.scan(
      Outer, variable_axes={"params": 0, "intermediates": 0}, split_rngs={"params": True}, length=3
    )()(v[0], None)
    rev = nn.scan(
      Inner,
      variable_axes={"params": 0, "intermediates": 1},
      split_rngs={"params": True},
      length=4,
      reverse=True,
    )(name="rev")
    axis1, _ = rev(nested, None)
    return axis1


def test_vmap_nested_scan_axis1_and_reverse_scan():
  x = jax.random.normal(jax.random.key(0), (5, 2, 3))
  model = lb.ToNNX(Lifted(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=2)
  shapes = {info.path: info.shape for info in lb.sow_sites(model)}
  assert shapes[("VmapVmapBody_0", "y")] == (5, 2, 3)
  assert shapes[("ScanOuter_0", "c")] == (3, 2, 3)
  assert shapes[("ScanOuter_0", "ScanInner_0", "c")] == (3, 2, 2, 3)
  assert shapes[("rev", "c")] == (2, 4, 3)  # stacked on axis 1

  # Same input each step; compare with two Linen applies.
  def step(i, c):
    m, _, xs = c
    return m, m(xs), xs

  nnx.jit(lambda m, x: nnx.fori_loop(0, 2, step, (m, jnp.zeros((2, 3)), x)))(model, x)
  variables = linen_variables(model)
  _, state = Lifted().apply(variables, x, mutable=["intermediates"])
  rec = lb.recorded(model)["intermediates"]
  for path in [
    ("VmapVmapBody_0", "y"),
    ("ScanOuter_0", "c"),
    ("ScanOuter_0", "ScanInner_0", "c"),
    ("rev", "c"),
  ]:
    want = stack_reference([state["intermediates"]] * 2, list(path))
    got = rec
    for key in path:
      got = got[key]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg="/".join(path))


# --------------------------------------------------------------------------- other collections


class WithState(nn.Module):
  """batch_stats, a decode-style cache and a custom-reduce accumulator, plus one plain sow."""

  @nn.compact
  def __call__(self, x, train: bool = True):
    x = nn.BatchNorm(use_running_average=not train, momentum=0.5)(x)
    cache = self.variable("cache", "total", jnp.zeros, x.shape)
    if self.is_mutable_collection("cache"):
      cache.value = cache.value + x
    self.sow(
      "intermediates",
      "running_max",
      x,
      init_fn=lambda: jnp.full(x.shape, -jnp.inf),
      reduce_fn=jnp.maximum,
    )
    self.sow("intermediates", "h", x)
    return x


def test_batch_stats_cache_and_custom_reduce_update_in_place_in_loop():
  x = jax.random.normal(jax.random.key(0), (4, 3))
  model = lb.ToNNX(WithState(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=3)
  start = linen_variables(model)
  assert start["intermediates"]["running_max"].shape == (4, 3)  # accumulator exists before the loop
  before = {id(v) for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)}

  @nnx.jit
  def run(model, x):
    return nnx.fori_loop(0, 3, lambda i, c: (c[0], c[0](c[1] * 1.5, mutable=True)), (model, x))[1]

  run(model, x)
  assert {id(v) for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)} == before

  # Reference: Linen apply per step from the state lazy_init left (Linen's init already ran
  # the cache update once), threading batch_stats/cache/accumulator along.
  variables = start
  h, hs = x, []
  for _ in range(3):
    h, upd = WithState().apply(variables, h * 1.5, mutable=True)
    hs.append(upd["intermediates"]["h"][0])
    variables = {**variables, **upd}
    variables["intermediates"] = {"running_max": upd["intermediates"]["running_max"]}
  got = linen_variables(model)
  np.testing.assert_allclose(
    got["batch_stats"]["BatchNorm_0"]["mean"],
    variables["batch_stats"]["BatchNorm_0"]["mean"],
    rtol=RTOL,
    atol=ATOL,
  )
  np.testing.assert_allclose(
    got["cache"]["total"], variables["cache"]["total"], rtol=RTOL, atol=ATOL
  )
  np.testing.assert_allclose(
    got["intermediates"]["running_max"],
    variables["intermediates"]["running_max"],
    rtol=RTOL,
    atol=ATOL,
  )
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["h"], jnp.stack(hs), rtol=RTOL, atol=ATOL
  )


def test_mutable_false_still_records_but_leaves_other_collections():
  x = jax.random.normal(jax.random.key(0), (4, 3))
  model = lb.ToNNX(WithState(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=3)
  stats = np.asarray(linen_variables(model)["batch_stats"]["BatchNorm_0"]["mean"])
  model(x, train=False)  # mutable defaults to False, as in stock ToNNX
  assert int(lb.counts(model)["intermediates"]["h"]) == 1
  np.testing.assert_array_equal(linen_variables(model)["batch_stats"]["BatchNorm_0"]["mean"], stats)


# --------------------------------------------------------------------------- preallocate


class Decoder(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    h = nn.Embed(11, 4)(tokens)
    self.sow("intermediates", "h", h)
    return h.sum(-1)

  def prefix(self, tokens):
    return self.__call__.__wrapped__(self, tokens) if False else tokens * 0


def test_preallocate_redeclares_for_another_signature_and_keeps_params():
  model = lb.ToNNX(Decoder(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, jnp.zeros((1, 1), jnp.int32), capacity=2)
  params = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
  with pytest.raises(
    lb.NotDeclaredError, match=r"shape \(1, 5, 4\).*declared for shape \(1, 1, 4\).*lb.preallocate"
  ):
    model(jnp.zeros((1, 5), jnp.int32))
  lb.preallocate(model, jnp.zeros((1, 5), jnp.int32), capacity=3)
  jax.tree.map(np.testing.assert_array_equal, nnx.state(model, nnx.Param), params)
  tokens = jnp.arange(5).reshape(1, 5)

  def step(i, c):
    m, t = c
    m(t)
    return m, t + 1

  nnx.jit(lambda m, t: nnx.fori_loop(0, 3, step, (m, t))[1])(model, tokens)
  want = [
    Decoder().apply(linen_variables(model), tokens + i, mutable=["intermediates"])[1][
      "intermediates"
    ]["h"][0]
    for i in range(3)
  ]
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["h"], jnp.stack(want), rtol=RTOL, atol=ATOL
  )
  # A call that sows nothing records nothing and needs no declaration.
  assert int(model(tokens, method="prefix").sum()) == 0


class TwoMethods(nn.Module):
  def setup(self):
    self.embed = nn.Embed(11, 4)

  def encode(self, tokens):  # no sow
    return self.embed(tokens)

  def __call__(self, tokens):
    h = self.embed(tokens)
    self.sow("intermediates", "h", h)
    return h


def test_sow_without_a_buffer_is_reported_even_with_mutable_false():
  model = lb.ToNNX(TwoMethods(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, jnp.zeros((1, 1), jnp.int32), method="encode")  # sows nothing
  with pytest.raises(
    lb.NotDeclaredError,
    match=r"sowed into 'intermediates/h', a site with no buffer.*lb.preallocate",
  ):
    model(jnp.zeros((1, 1), jnp.int32))


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
  "capacity, match",
  [
    (0, r"capacity must be a positive int, got 0"),
    (-3, r"capacity must be a positive int, got -3"),
    (2.5, r"capacity must be a positive int, got 2.5 of type float"),
    (True, r"capacity must be a positive int, got True of type bool"),
    ({"x": 0}, r"capacity\['x'\] must be a positive int"),
    ({"nope": 3, "intermediates": 2}, r"capacity key\(s\) \['nope'\] match no sow site"),
    ({"x": 3}, r"no capacity key covers sow site\(s\) intermediates/ScanBlock_0/carry"),
    (None, r"MLP sows at 2 site\(s\) .* no capacity was declared"),
  ],
)
def test_bad_capacity(capacity, match):
  model = lb.ToNNX(MLP(3, 8), rngs=nnx.Rngs(0))
  with pytest.raises(lb.CapacityError, match=match):
    lb.lazy_init(model, jnp.ones((1, 8)), capacity=capacity)


def test_bad_overflow_and_non_linen_module_and_use_before_init():
  with pytest.raises(lb.CapacityError, match=r"overflow='ring' is not a policy .*'wrap'"):
    lb.ToNNX(MLP(), overflow="ring")
  with pytest.raises(TypeError, match=r"wraps a Linen module .* got Linear.*NNX module"):
    lb.ToNNX(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
  with pytest.raises(TypeError, match=r"got ABCMeta|got ModuleMeta|got type|Fix: pass an instance"):
    lb.ToNNX(MLP)
  with pytest.raises(lb.NotDeclaredError, match=r"called before it was initialized.*lb.lazy_init"):
    lb.ToNNX(MLP())(jnp.ones((1, 8)))
  with pytest.raises(TypeError, match=r"stock flax.nnx.bridge.ToNNX.*lb.ToNNX"):
    lb.lazy_init(bridge.ToNNX(MLP(), rngs=nnx.Rngs(0)), jnp.ones((1, 8)), capacity=2)


class Echo(nn.Module):
  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    return x


def test_dtype_drift_is_an_error_naming_the_path():
  model = lb.ToNNX(Echo())
  lb.lazy_init(model, jnp.ones((2, 4)), capacity=2)
  with pytest.raises(
    lb.NotDeclaredError, match=r"intermediates/x received .* dtype bfloat16.*float32"
  ):
    model(jnp.ones((2, 4), jnp.bfloat16))


class _Grows(nn.Module):
  @nn.compact
  def __call__(self, x, extra=False):
    if extra:
      late = self.variable("batch_stats", "late", jnp.zeros, ())
      late.value += 1.0
    return nn.Dense(2)(x)


def leaf_type(leaf) -> type:
  return leaf.type if type(leaf).__name__ == "VariableState" else type(leaf)


def test_new_variable_on_later_call_is_an_error_inside_a_trace():
  model = lb.ToNNX(_Grows(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, jnp.ones((1, 2)))

  @nnx.jit
  def step(model, x):
    return model(x, extra=True, mutable=True)

  with pytest.raises(
    lb.StructureChangeError,
    match=r"created the variable 'batch_stats/late'.*inside a traced function"
    r".*Why.*Fix",
  ):
    step(model, jnp.ones((1, 2)))
  assert "late" not in vars(model)  # all or nothing


def test_new_variable_on_later_call_outside_a_trace_is_added_like_linen():
  """As stock ToNNX (flax >= 0.11; 0.10's stock loses the new entry): the Variable is added."""
  x = jnp.ones((1, 2))
  model = lb.lazy_init(lb.ToNNX(_Grows(), rngs=nnx.Rngs(0)), x)
  variables = {"params": lb.linen_variables(model)["params"]}
  for _ in range(2):
    want, updates = _Grows().apply(variables, x, extra=True, mutable=True)
    variables = {**variables, **updates}
    np.testing.assert_allclose(model(x, extra=True, mutable=True), want)
  late = nnx.state(model)["late"]
  assert leaf_type(late) is nnx.BatchStat
  assert float(late.get_value() if hasattr(late, "get_value") else late.value) == 2.0
  assert float(variables["batch_stats"]["late"]) == 2.0
  if _compat.FLAX_VERSION >= (0, 11):
    stock = bridge.lazy_init(bridge.ToNNX(_Grows(), rngs=nnx.Rngs(0)), x)
    stock(x, extra=True, mutable=True)
    stock(x, extra=True, mutable=True)
    # flax annotates bridge.lazy_init's result as a module or a function.
    assert type(stock.late) is nnx.BatchStat  # pyright: ignore[reportFunctionMemberAccess]


# The maintainer's workaround from seed 000: shape-stable accumulators via init_fn/reduce_fn.
def _acc_init():
  return dict(i=jnp.array(0), x=jnp.zeros((4, 1, 3)))


def _acc_reduce(acc, x):
  return dict(i=acc["i"] + 1, x=acc["x"].at[acc["i"]].set(x))


class AccBlock(nn.Module):
  @nn.compact
  def __call__(self, c, _):
    c = nn.relu(nn.Dense(3)(c))
    self.sow("intermediates", "acc", c, init_fn=_acc_init, reduce_fn=_acc_reduce)
    return c, None


class AccModel(nn.Module):
  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "top", x, init_fn=_acc_init, reduce_fn=_acc_reduce)
    return nn.scan(
      AccBlock,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      length=2,
    )()(x, None)[0]


def test_custom_reduce_accumulators_exist_before_the_loop_and_update_in_place():
  x = jax.random.normal(jax.random.key(0), (1, 3))
  model = lb.ToNNX(AccModel(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x)  # no tuple sows: no capacity needed
  start = linen_variables(model)
  assert start["intermediates"]["ScanAccBlock_0"]["acc"]["x"].shape == (2, 4, 1, 3)

  nnx.jit(lambda m, x: nnx.fori_loop(0, 3, lambda i, c: (c[0], c[0](c[1], mutable=True)), (m, x)))(
    model, x
  )

  variables, h = {"params": start["params"]}, x
  for _ in range(3):  # Linen from scratch: the accumulator starts from init_fn() on first call
    h, upd = AccModel().apply(variables, h, mutable=["intermediates"])
    variables = {"params": start["params"], "intermediates": upd["intermediates"]}
  got = linen_variables(model)["intermediates"]
  np.testing.assert_array_equal(got["top"]["i"], 3)
  np.testing.assert_allclose(
    got["top"]["x"], variables["intermediates"]["top"]["x"], rtol=RTOL, atol=ATOL
  )
  np.testing.assert_allclose(
    got["ScanAccBlock_0"]["acc"]["x"],
    variables["intermediates"]["ScanAccBlock_0"]["acc"]["x"],
    rtol=RTOL,
    atol=ATOL,
  )


class SowsNumbers(nn.Module):
  """Sows Python numbers (a float, an int, one inside a tuple) next to an array."""

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(2)(x)
    self.sow("intermediates", "scale", 0.5)
    self.sow("intermediates", "step", 3)
    self.sow("intermediates", "pair", (y, 2.0))
    return y * 0.5


def test_python_numbers_sown_are_recorded_as_0d_arrays(graph):
  x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
  model = lb.lazy_init(lb.ToNNX(SowsNumbers(), rngs=nnx.Rngs(0)), x, capacity=4)
  model(x)
  nnx.fori_loop(0, 2, lambda i, m: (m(x), m)[1], model, **graph_kw(graph))
  _, sown = SowsNumbers().apply(linen_variables(model), x, mutable=["intermediates"])
  want = sown["intermediates"]  # plain Linen keeps the Python numbers as they were sown
  got = lb.recorded(model)["intermediates"]
  assert got["scale"].shape == (3,) and got["scale"].dtype == jnp.float32
  assert got["step"].dtype == jnp.int32
  np.testing.assert_array_equal(got["scale"], [want["scale"][0]] * 3)
  np.testing.assert_array_equal(got["step"], [want["step"][0]] * 3)
  np.testing.assert_allclose(got["pair"][0], np.stack([want["pair"][0][0]] * 3), rtol=1e-6)
  np.testing.assert_array_equal(got["pair"][1], [want["pair"][0][1]] * 3)


# ------------------------------------------------------------------ one owner for each fact
def test_one_predicate_recognises_lb_to_nnx_and_its_subclasses_only():
  from loopbridge._core.bridge_settings import is_bridge, is_bridge_class

  class Mine(lb.ToNNX):
    pass

  assert is_bridge(lb.ToNNX(nn.Dense(2))) and is_bridge(Mine(nn.Dense(2)))
  assert not is_bridge(bridge.ToNNX(nn.Dense(2), rngs=nnx.Rngs(0)))
  assert not is_bridge(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
  assert is_bridge_class(Mine) and not is_bridge_class(bridge.ToNNX)


def test_the_constructor_keeps_one_validated_hashable_spec():
  from loopbridge._core.bridge_settings import bridge_settings
  from loopbridge._core.capacity import DEFAULT_OVERFLOW, DeclarationSpec

  one = bridge_settings(lb.ToNNX(nn.Dense(2), capacity={"a": 1, "b/*": 2}))
  two = bridge_settings(lb.ToNNX(nn.Dense(2), capacity={"b/*": 2, "a": 1}))
  assert one == two and hash(one) == hash(two)  # static: part of the GraphDef
  assert one.spec == DeclarationSpec.checked({"a": 1, "b/*": 2}, DEFAULT_OVERFLOW)
  assert bridge_settings(lb.ToNNX(nn.Dense(2))).spec.overflow == "error"


def test_overflow_policies_are_the_literal_type():
  import typing

  from loopbridge._core.capacity import DEFAULT_OVERFLOW, OVERFLOW_POLICIES, Overflow

  assert typing.get_args(Overflow) == OVERFLOW_POLICIES == ("error", "drop", "wrap")
  assert DEFAULT_OVERFLOW in OVERFLOW_POLICIES
  with pytest.raises(lb.CapacityError, match=r"overflow='keep' is not a policy.*'wrap'"):
    lb.ToNNX(nn.Dense(2), overflow="keep")  # pyright: ignore[reportArgumentType]
