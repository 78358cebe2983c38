"""NNX parts inside Linen (`nnx.bridge.ToLinen`), inside `lb.ToNNX`: their sows are recorded.

A wrapper like `nnx.bridge.ToLinen` runs an NNX module inside a Linen module and writes the NNX
module's `sow`s into the Linen collection after the call (with `put_variable`), and not at all
during `init`. Every recorded value is compared with plain Linen
`apply(..., mutable=['intermediates'])` run step by step on the same variables.
"""

from __future__ import annotations

import functools
import typing as tp

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util
from flax.nnx import bridge

import loopbridge as lb
from loopbridge import _compat

RTOL, ATOL = 1e-5, 1e-6  # float32 round-off between a compiled loop and eager Linen
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)


def value(variable):
  return _compat.variable_value(variable)


def set_value(variable, new):
  _compat.set_variable_value(variable, new)


def assert_close(got, want):
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)


def flat(tree):
  return traverse_util.flatten_dict(tree, is_leaf=lambda _, v: isinstance(v, tuple))


def assert_step_equal(recorded, linen_steps):
  """recorded[site][k] == what plain Linen's k-th apply returned at that site (a 1-tuple)."""
  want_sites = {path for step in linen_steps for path in flat(step)}
  got = flat(recorded["intermediates"])
  assert set(got) == want_sites, (sorted(got), sorted(want_sites))
  for path in want_sites:
    assert got[path].shape[0] == len(linen_steps), path
    for k, step in enumerate(linen_steps):
      (want,) = tp.cast(tuple, flat(step)[path])
      assert_close(got[path][k], want)


# ============================================================================ minimal model
class SowingLinear(nnx.Module):
  """An NNX module that sows (default tuple reduce)."""

  def __init__(self, din, dout, *, rngs):
    self.lin = nnx.Linear(din, dout, rngs=rngs)

  def __call__(self, x):
    h = self.lin(x)
    self.sow(nnx.Intermediate, "h", jnp.tanh(h))
    return h


class Wrapped(nn.Module):
  """Linen around the NNX part, with a Linen sow of its own next to it."""

  @nn.compact
  def __call__(self, x):
    y = bridge.ToLinen(SowingLinear, args=(x.shape[-1], 3), name="part")(x)
    self.sow("intermediates", "out", y * 2.0)
    return nn.Dense(4)(y)


def linen_steps(module, variables, xs, method=None):
  """Plain Linen, one apply per input: the intermediates each call returns."""
  steps = []
  for x in xs:
    _, updates = module.apply(variables, x, mutable=["intermediates"], method=method)
    steps.append(updates["intermediates"])
  return steps


def params_only(model):
  """The model's Linen variables for a plain Linen apply (flax 0.10's ToLinen also needs the
  graphdef it keeps in the 'nnx' collection)."""
  return {k: v for k, v in lb.linen_variables(model).items() if k != "intermediates"}


def test_plain_linen_returns_the_nnx_sow_as_a_tuple():
  """The reference this file relies on: Linen's apply returns the NNX sow at its Linen path."""
  variables = Wrapped().init(jax.random.key(0), X)
  _, updates = Wrapped().apply(variables, X, mutable=["intermediates"])
  (h,) = updates["intermediates"]["part"]["h"]
  assert h.shape == (2, 3)


def test_lazy_init_discovers_the_nnx_sow_and_eager_calls_record_it():
  model = lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, X, capacity=4)
  sites = {site.label: site for site in lb.sow_sites(model)}
  assert set(sites) == {"part/h", "out"}
  assert sites["part/h"].shape == (2, 3)
  xs = [X, X * 2.0, X - 1.0]
  for x in xs:
    model(x)
  assert_step_equal(lb.recorded(model), linen_steps(Wrapped(), params_only(model), xs))


def test_the_nnx_sow_is_not_a_variable_after_lazy_init():
  """lazy_init keeps records out of the Linen variables, as for a Linen sow."""
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=4)
  assert "intermediates" not in lb.linen_variables(model)


@pytest.mark.parametrize("loop", ["fori_loop", "while_loop"])
def test_recorded_in_place_in_a_jitted_nnx_loop(loop):
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=5)
  steps = 5

  @nnx.jit
  def run(model, x):
    def body(i, carry):
      model, x = carry
      return model, jnp.tanh(model(x))

    if loop == "fori_loop":
      return nnx.fori_loop(0, steps, body, (model, x))[1]

    def cond(carry):
      return carry[0] < steps

    def wbody(carry):
      i, model, x = carry
      model, x = body(i, (model, x))
      return i + 1, model, x

    return nnx.while_loop(cond, wbody, (jnp.asarray(0), model, x))[2]

  out = run(model, X)
  xs, x = [], X
  variables = params_only(model)
  for _ in range(steps):
    xs.append(x)
    x = jnp.tanh(Wrapped().apply(variables, x))
  assert_step_equal(lb.recorded(model), linen_steps(Wrapped(), variables, xs))
  assert_close(out, x)


def test_preallocate_finds_the_nnx_sow_of_another_signature():
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=4)
  x3 = jnp.ones((3, 4))
  lb.preallocate(model, x3, capacity=4)
  assert {s.label: s.shape for s in lb.sow_sites(model)}["part/h"] == (3, 3)
  model(x3)
  assert_step_equal(lb.recorded(model), linen_steps(Wrapped(), params_only(model), [x3]))


# ================================================ an NNX accumulator (custom reduce_fn/init_fn)
class Accumulating(nnx.Module):
  """Sows a running sum (shape-stable custom reduce) next to a record (default reduce)."""

  def __init__(self, din, dout, *, rngs):
    self.lin = nnx.Linear(din, dout, rngs=rngs)

  def __call__(self, x):
    h = self.lin(x)
    self.sow(
      nnx.Intermediate, "total", h.sum(0), reduce_fn=lambda a, b: a + b, init_fn=lambda: jnp.ones(3)
    )
    self.sow(nnx.Intermediate, "h", jnp.tanh(h))
    return h


class WrappedAccumulating(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(4)(bridge.ToLinen(Accumulating, args=(4, 3), name="part")(x))


XS = jnp.stack([X, X * 2.0, X - 1.0, X + 0.5])


def _nnx_reference(model, xs):
  """Plain NNX: the same module with the model's params, called once per input (its
  accumulator persists across calls, as NNX's `sow` keeps it)."""
  ref = Accumulating(4, 3, rngs=nnx.Rngs(0))
  params = lb.linen_variables(model)["params"]["part"]["lin"]
  set_value(ref.lin.kernel, params["kernel"])
  set_value(ref.lin.bias, params["bias"])
  hs = [jnp.tanh(ref(x)) for x in xs]
  return value(ref.total), hs


def _variable_ids(model):
  return {id(n) for _, n in _compat.iter_graph(model) if isinstance(n, nnx.Variable)}


@nnx.jit
def _eager_then_loop(model, xs):
  def body(i, model):
    model(xs[i])
    return model

  return nnx.fori_loop(1, xs.shape[0], body, model)


@pytest.mark.parametrize("entry", ["lazy_init", "preallocate"])
def test_an_nnx_accumulator_inside_linen_is_declared_and_reduced_in_place(entry):
  # The NNX module's custom-reduce sow is state: declared before the loop (from init_fn),
  # given back to the module on every call, reduced in place; equal to plain NNX step by
  # step, and its first call to plain Linen's apply.
  if entry == "lazy_init":
    model = lb.lazy_init(lb.ToNNX(WrappedAccumulating(), rngs=nnx.Rngs(0)), X, capacity=4)
  else:
    variables = WrappedAccumulating().init(jax.random.key(1), X)
    model = lb.checkpoint.from_linen_variables(WrappedAccumulating(), variables, X)
    lb.preallocate(model, X, capacity=4)
  assert_close(lb.linen_variables(model)["intermediates"]["part"]["total"], jnp.ones(3))
  ids = _variable_ids(model)
  model(XS[0])
  plain = WrappedAccumulating().init(jax.random.key(0), X)
  plain = {**plain, "params": lb.linen_variables(model)["params"]}
  _, linen = WrappedAccumulating().apply(plain, XS[0], mutable=["intermediates"])
  assert_close(
    lb.linen_variables(model)["intermediates"]["part"]["total"],
    linen["intermediates"]["part"]["total"],
  )
  _eager_then_loop(model, XS)
  total, hs = _nnx_reference(model, XS)
  assert_close(lb.linen_variables(model)["intermediates"]["part"]["total"], total)
  recorded = lb.recorded(model)["intermediates"]["part"]["h"]
  for k, h in enumerate(hs):
    assert_close(recorded[k], h)
  assert _variable_ids(model) == ids  # updated in place: no Variable created or replaced


class BareAccumulating(nn.Module):
  """The NNX part is the whole Linen model: its graphdef sits at the root of 'nnx' (flax 0.10)."""

  @nn.compact
  def __call__(self, x):
    return bridge.ToLinen(Accumulating, args=(4, 3), name="part")(x)


@pytest.mark.parametrize("where", ["inside", "bare"])
def test_an_nnx_accumulators_model_runs_again_in_plain_linen_and_accumulates_as_it(where):
  # The Linen variables of the model (records left out) are what plain Linen holds: its apply
  # takes them (flax 0.10's ToLinen rebuilt its module from a graphdef that named the
  # accumulator: "Expected key 'total' in state"), and the accumulator is the running sum of
  # what plain Linen's applies, each starting from init_fn(), add to it.
  linen = WrappedAccumulating() if where == "inside" else bridge.ToLinen(Accumulating, args=(4, 3))
  model = lb.lazy_init(lb.ToNNX(linen, rngs=nnx.Rngs(0)), X, capacity=4)
  model(XS[0])
  _eager_then_loop(model, XS)
  plain = params_only(model)
  steps = [linen.apply(plain, x, mutable=["intermediates"])[1]["intermediates"] for x in XS]
  if where == "bare":
    steps = [{"part": s} for s in steps]
  held = lb.linen_variables(model)["intermediates"]
  got = held["part"]["total"] if where == "inside" else held["total"]
  want = jnp.ones(3) + sum(s["part"]["total"] - jnp.ones(3) for s in steps)
  assert_close(got, want)
  recorded = lb.recorded(model)["intermediates"]
  recorded = recorded["part"]["h"] if where == "inside" else recorded["h"]
  for k, step in enumerate(steps):
    (h,) = step["part"]["h"]
    assert_close(recorded[k], h)


# ====================================================== transforms and depth around the NNX part
class Deep(nn.Module):
  """The NNX part two Linen levels down."""

  @nn.compact
  def __call__(self, x):
    return Wrapped(name="mid")(x)


class ScanStep(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return jnp.tanh(
      bridge.ToLinen(SowingLinear, args=(x.shape[-1], x.shape[-1]), name="p")(x)
    ), None


LAYER_AXES = {"params": 0, "intermediates": 0, "nnx": 0}  # 'nnx': flax 0.10's graphdef


class ScanOver(nn.Module):
  remat: bool = False

  @nn.compact
  def __call__(self, x):
    step = nn.remat(ScanStep) if self.remat else ScanStep
    stack = nn.scan(step, variable_axes=LAYER_AXES, split_rngs={"params": True}, length=3)
    return stack(name="layers")(x, None)[0]


class VmapOver(nn.Module):
  @nn.compact
  def __call__(self, x):
    part = nn.vmap(
      ScanStep, variable_axes=LAYER_AXES, split_rngs={"params": True}, in_axes=(0, None)
    )
    return part(name="members")(jnp.stack([x, -x]), None)[0]


class RematOnly(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.remat(Wrapped)(name="r")(x)


@pytest.mark.parametrize(
  "module, stacked",
  [
    (Deep(), False),
    (ScanOver(), True),
    (ScanOver(remat=True), True),
    (VmapOver(), True),
    (RematOnly(), False),
  ],
  ids=["depth", "scan", "scan-remat", "vmap", "remat"],
)
def test_nnx_sows_under_linen_transforms_are_recorded_as_linen_returns_them(module, stacked):
  model = lb.lazy_init(lb.ToNNX(module, rngs=nnx.Rngs(0)), X, capacity=3)
  nnx_sites = [s for s in lb.sow_sites(model) if s.path[-1] == "h"]
  assert len(nnx_sites) == 1
  if stacked:
    (site,) = nnx_sites
    assert site.lifted and site.shape[0] in (2, 3), site
    # The write log saw the lifted transform: its stacked axis and length are known.
    (lift,) = [t for t in site.transforms if t.kind in ("scan", "vmap")]
    assert (lift.axis, lift.length, site.sown_shape) == (0, site.shape[0], site.shape[1:])
  xs = [X, X * 0.5]

  @nnx.jit
  def call(model, x):
    return model(x)

  for x in xs:
    call(model, x)
  assert_step_equal(lb.recorded(model), linen_steps(module, params_only(model), xs))


# ================================================================ a MaxText-shaped decoder
B, WIDTH, HEADS, MAX_LEN, VOCAB, LAYERS, STEPS = 2, 8, 2, 6, 11, 2, 5


class DecoderLayer(nnx.Module):
  """NNX attention with its KV cache in `nnx.Cache` variables (flax's layout: batch, length,
  heads, head dim); sows the attention weights and the output."""

  def __init__(self, width, heads, max_len, batch, *, rngs):
    self.heads = heads
    self.qkv = nnx.Linear(width, 3 * width, rngs=rngs)
    self.out = nnx.Linear(width, width, rngs=rngs)
    shape = (batch, max_len, heads, width // heads)
    self.cached_key = nnx.Cache(jnp.zeros(shape))
    self.cached_value = nnx.Cache(jnp.zeros(shape))
    self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

  def __call__(self, x):
    split = lambda t: t.reshape(*t.shape[:-1], self.heads, -1)  # noqa: E731
    q, k, v = map(split, jnp.split(self.qkv(x), 3, axis=-1))
    i = value(self.cache_index)
    keys = jax.lax.dynamic_update_slice(value(self.cached_key), k, (0, i, 0, 0))
    values = jax.lax.dynamic_update_slice(value(self.cached_value), v, (0, i, 0, 0))
    set_value(self.cached_key, keys)
    set_value(self.cached_value, values)
    set_value(self.cache_index, i + x.shape[1])  # a prefill writes its P tokens at once
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, keys) / jnp.sqrt(q.shape[-1])
    visible = jnp.arange(keys.shape[1])[None, :] <= (i + jnp.arange(x.shape[1]))[:, None]
    weights = jax.nn.softmax(jnp.where(visible, scores, -1e9), axis=-1)
    self.sow(nnx.Intermediate, "attn_weights", weights)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, values).reshape(x.shape)
    h = x + self.out(attended)
    self.sow(nnx.Intermediate, "hidden", h)
    return h


class DecoderBlock(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    layer = bridge.ToLinen(DecoderLayer, args=(WIDTH, HEADS, MAX_LEN, B), name="layer")
    return layer(x), None


class Decoder(nn.Module):
  """Embedding, an `nn.scan` over NNX decoder layers (as MaxText stacks them), logits."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, WIDTH)(tokens)
    layers = nn.scan(
      DecoderBlock,
      variable_axes={"params": 0, "cache": 0, "intermediates": 0, "nnx": 0},
      split_rngs={"params": True},
      length=LAYERS,
    )
    x, _ = layers(name="layers")(x, None)
    self.sow("intermediates", "final", x)
    return nn.Dense(VOCAB)(x)


class Generator(nnx.Module):
  def __init__(self):
    self.decoder = lb.ToNNX(Decoder(), rngs=nnx.Rngs(0))

  def __call__(self, token):
    return self.decoder(token, mutable=["cache"])


def greedy(logits):
  return jnp.argmax(logits[:, -1], axis=-1)[:, None].astype(jnp.int32)


_linen_step = jax.jit(functools.partial(Decoder().apply, mutable=["cache", "intermediates"]))


def linen_greedy(variables, tokens, steps):
  """Plain Linen, one jitted apply per call (compiled once per shape), each greedy token fed
  back: (variables after, the tokens chosen (B, steps), each call's intermediates)."""
  chosen, calls = [], []
  for _ in range(steps):
    logits, updates = _linen_step(variables, tokens)
    variables = {**variables, "cache": updates["cache"]}
    calls.append(updates["intermediates"])
    tokens = greedy(logits)
    chosen.append(tokens[:, 0])
  return variables, jnp.stack(chosen, axis=1), calls


@pytest.mark.slow
def test_maxtext_shaped_greedy_decode_in_one_jit_matches_linen_step_by_step():
  first = jnp.array([[3], [7]], jnp.int32)
  gen = lb.lazy_init(Generator(), first, capacity=STEPS)
  labels = {s.label for s in lb.sow_sites(gen.decoder)}
  assert labels == {"final", "layers/layer/attn_weights", "layers/layer/hidden"}
  start = params_only(gen.decoder)
  assert int(jnp.sum(start["cache"]["layers"]["layer"]["cache_index"])) == 0

  @nnx.jit
  def decode(gen, token):
    def body(i, carry):
      gen, token, tokens = carry
      token = greedy(gen(token))
      return gen, token, tokens.at[:, i].set(token[:, 0])

    return nnx.fori_loop(0, STEPS, body, (gen, token, jnp.zeros((B, STEPS), jnp.int32)))[2]

  tokens = decode(gen, first)

  variables, want_tokens, steps = linen_greedy(start, first, STEPS)
  np.testing.assert_array_equal(tokens, want_tokens)
  assert_step_equal(lb.recorded(gen.decoder), steps)
  jax.tree.map(assert_close, params_only(gen.decoder)["cache"], variables["cache"])


@pytest.mark.slow
def test_maxtext_shaped_prefill_then_decode_records_both_signatures_as_linen():
  """MaxText's engine: one prefill call on the prompt, then one-token decode steps, in one
  `nnx.jit`; each call records into its own signature's buffers."""
  prompt = jnp.array([[3, 1, 4], [7, 2, 2]], jnp.int32)
  decode_steps = MAX_LEN - prompt.shape[1]
  gen = lb.lazy_init(Generator(), prompt, capacity=1)  # the prefill signature
  lb.preallocate(gen, prompt[:, :1], capacity=decode_steps)  # the decode step's, beside it
  start = params_only(gen.decoder)

  @nnx.jit
  def prefill_and_decode(gen, prompt):
    token = greedy(gen(prompt))

    def body(i, carry):
      gen, token, tokens = carry
      token = greedy(gen(token))
      return gen, token, tokens.at[:, i].set(token[:, 0])

    tokens = jnp.zeros((B, decode_steps), jnp.int32)
    return token, nnx.fori_loop(0, decode_steps, body, (gen, token, tokens))[2]

  first, tokens = prefill_and_decode(gen, prompt)

  variables, want_first, prefill_steps = linen_greedy(start, prompt, 1)
  np.testing.assert_array_equal(first, want_first)
  variables, want_tokens, steps = linen_greedy(variables, first, decode_steps)
  np.testing.assert_array_equal(tokens, want_tokens)
  assert_step_equal(lb.recorded(gen.decoder, signature=f"(int32[{B},3])"), prefill_steps)
  assert_step_equal(lb.recorded(gen.decoder, signature=f"(int32[{B},1])"), steps)
  jax.tree.map(assert_close, params_only(gen.decoder)["cache"], variables["cache"])


# ==================================================================== checkpoints and loaders
@pytest.mark.slow
def test_checkpoint_save_restore_keeps_the_nnx_records(tmp_path):
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=4)
  model(X)
  path = lb.checkpoint.save(tmp_path / "step", model)
  fresh = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(1)), X, capacity=4)
  lb.checkpoint.restore(path, fresh)
  fresh(X * 2.0)
  variables = params_only(model)
  assert_step_equal(lb.recorded(fresh), linen_steps(Wrapped(), variables, [X, X * 2.0]))


@pytest.mark.parametrize("given", ["params", "all"])
def test_load_linen_variables_into_a_model_with_a_tolinen_part(given):
  """flax 0.10 keeps ToLinen's graphdef in an 'nnx' collection; loading must not trip on it."""
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=4)
  variables = Wrapped().init(jax.random.key(7), X)
  loaded = {"params": variables["params"]} if given == "params" else variables
  lb.checkpoint.load_linen_variables(model, loaded)
  out = model(X)
  want, updates = Wrapped().apply(variables, X, mutable=["intermediates"])
  assert_close(out, want)
  assert_step_equal(lb.recorded(model), [updates["intermediates"]])


@pytest.mark.parametrize("given", ["params", "all"])
def test_from_linen_variables_with_a_tolinen_part(given):
  variables = Wrapped().init(jax.random.key(7), X)
  loaded = {"params": variables["params"]} if given == "params" else variables
  model = lb.checkpoint.from_linen_variables(Wrapped(), loaded, X)
  lb.preallocate(model, X, capacity=2)
  assert {s.label for s in lb.sow_sites(model)} == {"part/h", "out"}
  out = model(X)
  want, updates = Wrapped().apply(variables, X, mutable=["intermediates"])
  assert_close(out, want)
  assert_step_equal(lb.recorded(model), [updates["intermediates"]])


def test_load_linen_variables_names_a_wrong_shape_under_the_tolinen_part():
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=4)
  wrong = Wrapped().init(jax.random.key(7), jnp.ones((2, 5)))
  with pytest.raises(lb.checkpoint.CheckpointError, match=r"part/lin/kernel given \(5, 3\)"):
    lb.checkpoint.load_linen_variables(model, {"params": wrong["params"]})


# ===================================================== nnx.bridge.Module: sows after init
HAS_BRIDGE_MODULE = hasattr(bridge, "Module") and hasattr(bridge, "linen_in_bridge_mdl")
needs_bridge_module = pytest.mark.skipif(
  not HAS_BRIDGE_MODULE,
  reason=f"flax {'.'.join(map(str, _compat.FLAX_VERSION))} has no nnx.bridge.Module / "
  "linen_in_bridge_mdl (added in flax 0.11)",
)


class CountingLayer(nn.Module):
  """flax's test_linen_submodule layer: sows only after init (a counter and an output)."""

  dim: int
  dropout_rate: float

  def setup(self):
    self.linear = nn.Dense(self.dim, use_bias=False)
    self.dropout = nn.Dropout(self.dropout_rate, deterministic=False)

  def __call__(self, x):
    if not self.is_initializing():
      self.sow("intermediates", "count", 1, init_fn=lambda: 0, reduce_fn=lambda a, b: a + b)
    x = self.dropout(self.linear(x))
    if not self.is_initializing():
      self.sow("intermediates", "out", x)
    return x


def bridge_mlp():
  class BridgeMLP(bridge.Module):
    @bridge.compact
    def __call__(self, x):
      x = bridge.linen_in_bridge_mdl(CountingLayer(8, 0.3))(x)
      return bridge.linen_in_bridge_mdl(CountingLayer(8, 0.3), name="another")(x)

  return BridgeMLP()


def run_flax_linen_submodule():
  """flax's tests/nnx/bridge/module_test.py::test_linen_submodule (its checks), returning
  the mutable apply's output and updates."""
  model = bridge_mlp()
  x = jax.random.normal(jax.random.key(0), (4, 8))
  variables = model.init(jax.random.key(1), x)
  params = variables["params"]
  assert not jnp.array_equal(
    params["CountingLayer_0"]["linear"]["kernel"], params["another"]["linear"]["kernel"]
  )
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  y1 = model.apply(variables, x, rngs={"params": k1, "dropout": k2})
  y2 = model.apply(variables, x, rngs={"params": k1, "dropout": k3})
  assert not jnp.array_equal(y1, y2)
  y3, updates = model.apply(variables, x, rngs={"params": k1, "dropout": k3}, mutable=True)
  assert updates["intermediates"]["CountingLayer_0"]["count"] == 1
  # The updated params are the ones passed in (the call applies, it does not initialize).
  jax.tree.map(np.testing.assert_array_equal, updates["params"], params)
  return y3, updates


@needs_bridge_module
def test_flax_linen_submodule_with_lb_to_nnx(monkeypatch):
  """Stock wrappers first (the reference), then `lb.ToNNX` swapped in for
  `linen_in_bridge_mdl`: flax's checks pass and the updates are the stock ones."""
  want_y, want_updates = run_flax_linen_submodule()
  monkeypatch.setattr(bridge.wrappers, "ToNNX", lb.ToNNX)
  y, updates = run_flax_linen_submodule()
  np.testing.assert_array_equal(y, want_y)
  assert flat(updates).keys() == flat(want_updates).keys()
  jax.tree.map(np.testing.assert_array_equal, updates, want_updates)
  # The default-reduce sow first made after init is there, as the stock wrapper returns it
  # (the output itself from flax 0.12; flax 0.11.2's stock wrapper returns a zero there).
  (out,) = updates["intermediates"]["another"]["out"]
  (want_out,) = want_updates["intermediates"]["another"]["out"]
  np.testing.assert_array_equal(out, want_out)
  if np.shape(want_out) == np.shape(y):
    np.testing.assert_array_equal(out, y)


# ======================================================================== the CLI report
CLI_TARGET = """
import flax.linen as nn
from flax import nnx
from flax.nnx import bridge


class SowingLinear(nnx.Module):
  def __init__(self, din, dout, *, rngs):
    self.lin = nnx.Linear(din, dout, rngs=rngs)

  def __call__(self, x):
    h = self.lin(x)
    self.sow(nnx.Intermediate, "h", h)
    return h


class Wrapped(nn.Module):
  @nn.compact
  def __call__(self, x):
    return bridge.ToLinen(SowingLinear, args=(x.shape[-1], 3), name="part")(x)
"""


@pytest.mark.slow
def test_cli_inspect_lists_and_records_the_nnx_sow(tmp_path, monkeypatch, capsys):
  import json
  import sys
  import uuid

  from loopbridge.__main__ import main

  name = f"lb_nnx_in_linen_target_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(CLI_TARGET)
  monkeypatch.syspath_prepend(str(tmp_path))
  try:
    argv = ["inspect", f"{name}:Wrapped", "--arg", "float32[2,4]", "--steps", "2"]
    code = main([*argv, "--capacity", "4", "--json"])
  finally:
    sys.modules.pop(name, None)
  out, _ = capsys.readouterr()
  assert code == 0
  doc = json.loads(out)
  sites = {s["path"]: s for s in doc["sow_sites"]["sites"]}
  assert set(sites) == {"part/h"} and sites["part/h"]["shape"] == [2, 3]
  ours = doc["live_check"]["loopbridge"]
  assert ours["ok"] and ours["recorded"]["intermediates/part/h"]["sown"] == 2


def test_mutable_true_calls_loop_with_a_tolinen_part():
  """`mutable=True` makes every collection mutable: flax 0.10's ToLinen then puts its
  graphdef again on each call, which the loop must carry unchanged."""
  model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=3)

  @nnx.jit
  def run(model, x):
    def body(i, carry):
      model, x = carry
      return model, jnp.tanh(model(x, mutable=True))

    return nnx.fori_loop(0, 3, body, (model, x))[1]

  out = run(model, X)
  xs, x, variables = [], X, params_only(model)
  for _ in range(3):
    xs.append(x)
    x = jnp.tanh(Wrapped().apply(variables, x))
  assert_close(out, x)
  assert_step_equal(lb.recorded(model), linen_steps(Wrapped(), variables, xs))


# ============================================ lazy_init's extra apply is abstract: caches stay
class CachedLM(nn.Module):
  """flax's decode attention (cache sized at init) next to a ToLinen part."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, WIDTH)(tokens)
    x = nn.MultiHeadDotProductAttention(num_heads=HEADS, decode=True)(x)
    x = bridge.ToLinen(SowingLinear, args=(WIDTH, WIDTH), name="part")(x)
    return nn.Dense(VOCAB)(x)


@pytest.mark.slow
def test_lazy_init_on_the_full_length_leaves_the_decode_cache_as_linen_init_does():
  prompt = jnp.arange(B * MAX_LEN, dtype=jnp.int32).reshape(B, MAX_LEN) % VOCAB
  model = lb.lazy_init(lb.ToNNX(CachedLM(), rngs=nnx.Rngs(0)), prompt, capacity=MAX_LEN)
  want = CachedLM().init(jax.random.key(0), prompt)["cache"]
  jax.tree.map(np.testing.assert_array_equal, lb.linen_variables(model)["cache"], want)
  # flax's decode attention applies one token at a time, so the init signature cannot be
  # applied (even abstractly): the NNX sow is found when the step signature is declared, and a
  # step before that says so.
  assert list(lb.sow_sites(model)) == []
  with pytest.raises(lb.NotDeclaredError, match=r"'intermediates/part/h'.*lb\.preallocate"):
    model(prompt[:, :1], mutable=["cache"])
  lb.preallocate(model, prompt[:, :1], capacity=MAX_LEN)
  assert {s.label for s in lb.sow_sites(model)} == {"part/h"}
  # Decoding one token at a time from there matches Linen (the cache was not advanced).
  variables, steps = params_only(model), []
  for t in range(3):
    token = prompt[:, t : t + 1]
    model(token, mutable=["cache"])
    _, updates = CachedLM().apply(variables, token, mutable=["cache", "intermediates"])
    variables = {**variables, "cache": updates["cache"]}
    steps.append(updates["intermediates"])
  assert_step_equal(lb.recorded(model), steps)


# ==================================================== a layer stack made by nnx.vmap at init
MEMBERS = 3


class TanhPart(nn.Module):
  @nn.compact
  def __call__(self, x):
    return jnp.tanh(bridge.ToLinen(SowingLinear, args=(x.shape[-1], x.shape[-1]), name="part")(x))


class VmapStack(nnx.Module):
  """lb.ToNNX members stacked by nnx.vmap (lazy_init runs a copy inside the transform)."""

  def __init__(self, *, rngs):
    self.inner = lb.ToNNX(TanhPart(), rngs=rngs)

  def __call__(self, x):
    @nnx.split_rngs(splits=MEMBERS)
    @nnx.vmap(in_axes=(0, None), axis_size=MEMBERS)
    def run(inner, x):
      return inner(x)

    return run(self.inner, x)


@pytest.mark.slow
def test_nnx_sow_in_a_layer_stack_made_by_nnx_vmap():
  model = lb.lazy_init(VmapStack(rngs=nnx.Rngs(0)), X, capacity=2)
  assert [s.label for s in lb.sow_sites(model.inner)] == ["part/h"]
  model(X)
  got = lb.recorded(model.inner)["intermediates"]["part"]["h"]
  assert got.shape == (1, MEMBERS, *X.shape[:-1], X.shape[-1])
  variables = params_only(model.inner)
  for i in range(MEMBERS):
    member = jax.tree.map(lambda a, i=i: a[i] if hasattr(a, "shape") else a, variables)
    _, updates = TanhPart().apply(member, X, mutable=["intermediates"])
    assert_close(got[0, i], updates["intermediates"]["part"]["h"][0])


# ============================================================= what discovery costs and patches
class Tally:
  """A plain object (Linen would freeze a list attribute into a tuple)."""

  def __init__(self):
    self.traces = []


class Counted(nn.Module):
  """Counts how often its Linen call is traced (init, abstract apply, real calls)."""

  inner: nn.Module
  tally: Tally

  @nn.compact
  def __call__(self, x):
    self.tally.traces.append(self.is_initializing())
    return self.inner(x)


class PlainSow(nn.Module):
  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "h", x * 2.0)
    return nn.Dense(3)(x)


def test_lazy_init_applies_abstractly_once_only_when_a_module_wrote_its_variables_itself():
  plain = Tally()
  lb.lazy_init(lb.ToNNX(Counted(PlainSow(), plain), rngs=nnx.Rngs(0)), X, capacity=2)
  assert plain.traces == [True]  # Linen's own sow: init shows it, no second trace
  with_part = Tally()
  lb.lazy_init(lb.ToNNX(Counted(Wrapped(), with_part), rngs=nnx.Rngs(0)), X, capacity=2)
  assert with_part.traces == [True, False]  # init, then one abstract apply


def test_put_variable_is_wrapped_only_during_discovery_and_a_foreign_patch_is_chained():
  original = nn.Module.put_variable
  seen = []

  def foreign(self, *args, **kwargs):
    seen.append(args[0])
    return original(self, *args, **kwargs)

  nn.Module.put_variable = foreign
  try:
    model = lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=2)
    assert nn.Module.put_variable is foreign and "intermediates" in seen
    assert [s.label for s in lb.sow_sites(model)] == ["out", "part/h"]
  finally:
    nn.Module.put_variable = original
  lb.lazy_init(lb.ToNNX(Wrapped(), rngs=nnx.Rngs(0)), X, capacity=2)
  assert nn.Module.put_variable is original
