"""The declaration pipeline: one discovery per root, nothing of flax or the user's classes kept
patched, safe under threads, and flax's own decode-attention cache set up the Linen way.

References are plain Linen `apply` step by step (decoding) and flax's own `nnx.Module.sow`
(native sows); the thread test forces both declarations to run at the same time.
"""

from __future__ import annotations

import threading
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.core import lift as core_lift

import loopbridge as lb
from loopbridge import _compat

RTOL, ATOL = 1e-5, 1e-6
val = _compat.variable_value

pytestmark = pytest.mark.filterwarnings(
  "ignore:.*Module.sow\\(\\)' outside of 'nnx.capture:DeprecationWarning"
)

# ----------------------------------------------------------- flax's own decode attention
VOCAB, WIDTH, LENGTH = 13, 8, 6


class Decoder(nn.Module):
  """A one-layer decoder built on flax's `MultiHeadDotProductAttention(decode=True)` cache."""

  decode: bool = True

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, WIDTH)(tokens)
    # Full length (init): a causal mask; one token (decode): flax masks by its cache index.
    mask = None if tokens.shape[1] == 1 else nn.make_causal_mask(tokens)
    h = x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=WIDTH, decode=self.decode)(
      x, x, mask=mask
    )
    self.sow("intermediates", "h", h)
    return nn.Dense(VOCAB)(h)


def _greedy(logits):
  return jnp.argmax(logits[:, -1], axis=-1)[:, None].astype(jnp.int32)


def linen_decode(variables, first):
  """Plain Linen, one token per apply, the cache carried by hand: tokens and every sown h."""
  cache, tok, tokens, hs = variables["cache"], first, [], []
  for _ in range(LENGTH):
    logits, upd = Decoder().apply(
      {"params": variables["params"], "cache": cache}, tok, mutable=["cache", "intermediates"]
    )
    cache = upd["cache"]
    hs.append(upd["intermediates"]["h"][0])
    tok = _greedy(logits)
    tokens.append(tok[:, 0])
  return jnp.stack(tokens, axis=1), jnp.stack(hs)


@nnx.jit
def lb_decode(model, first):
  def body(carry):
    model, i, tok, out = carry
    tok = _greedy(model(tok, mutable=["cache"]))
    return model, i + 1, tok, out.at[:, i].set(tok[:, 0])

  carry = (model, 0, first, jnp.zeros((first.shape[0], LENGTH), jnp.int32))
  return nnx.while_loop(lambda c: c[1] < LENGTH, body, carry)[3]


def test_flax_decode_cache_initialized_on_the_full_length_decodes_like_linen():
  full = jnp.zeros((1, LENGTH), jnp.int32)
  first = jnp.array([[3]], jnp.int32)
  model = lb.ToNNX(Decoder(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, full, capacity=LENGTH)  # the Linen way: cache sized by the full length
  lb.preallocate(model, first, capacity=LENGTH)  # the loop's one-token signature
  start = jax.tree.map(jnp.array, lb.linen_variables(model))
  assert start["cache"]["MultiHeadDotProductAttention_0"]["cached_key"].shape[1] == LENGTH

  tokens = lb_decode(model, first)
  want_tokens, want_h = linen_decode(start, first)
  np.testing.assert_array_equal(tokens, want_tokens)
  h = lb.recorded(model)["intermediates"]["h"]
  assert h.shape == (LENGTH, 1, 1, WIDTH)
  np.testing.assert_allclose(h, want_h, rtol=RTOL, atol=ATOL)


def test_from_linen_variables_of_a_decode_model_initialized_on_the_full_length():
  full = jnp.zeros((1, LENGTH), jnp.int32)
  variables = Decoder().init(jax.random.key(1), full)
  model = lb.checkpoint.from_linen_variables(Decoder(), variables, full)
  lb.preallocate(model, jnp.array([[3]], jnp.int32), capacity=LENGTH)
  tokens = lb_decode(model, jnp.array([[3]], jnp.int32))
  want_tokens, _ = linen_decode(variables, jnp.array([[3]], jnp.int32))
  np.testing.assert_array_equal(tokens, want_tokens)


# ------------------------------------------------------------------------------- threads
class Waiting(nn.Module):
  """Sows, then waits for the other thread while both are inside their Linen init."""

  barrier: threading.Barrier

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(4)(x)
    self.sow("intermediates", "h", h)
    if not self.is_initializing():
      return h
    self.barrier.wait(timeout=60)
    return h


class Holder(nnx.Module):
  def __init__(self, barrier):
    self.part = lb.ToNNX(Waiting(barrier), rngs=nnx.Rngs(0))
    self.lin = nnx.Linear(4, 4, rngs=nnx.Rngs(1))

  def __call__(self, x):
    h = self.lin(self.part(x))
    self.sow(nnx.Intermediate, "out", h)
    return h


def test_two_threads_lazy_init_at_the_same_time_each_get_their_own_declaration():
  barrier = threading.Barrier(2)
  models = {3: Holder(barrier), 5: Holder(barrier)}
  errors = []

  def init(capacity):
    try:
      lb.lazy_init(models[capacity], jnp.ones((1, 4)), capacity=capacity)
    except BaseException as e:  # reported below, with the thread's capacity
      errors.append((capacity, e))

  threads = [threading.Thread(target=init, args=(c,)) for c in models]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not errors, errors
  for capacity, model in models.items():
    buffers = lb.buffers(model)
    assert buffers["part"]["intermediates"]["h"].shape == (capacity, 1, 4)
    assert buffers["intermediates"]["out"].shape == (capacity, 1, 4)
    for _ in range(capacity):
      model(jnp.ones((1, 4)))
    counts = lb.counts(model)
    assert int(counts["part"]["intermediates"]["h"]) == capacity
    assert lb.recorded(model)["part"]["intermediates"]["h"].shape == (capacity, 1, 4)


# ---------------------------------------------------------- nothing of flax kept patched
class ScanNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    def body(mdl, c, _):
      c = nn.Dense(4)(c)
      mdl.sow("intermediates", "c", c)
      return c, None

    scan = nn.scan(
      body, variable_axes={"params": 0, "intermediates": 0}, split_rngs={"params": True}, length=2
    )
    return scan(self, x, None)[0]


def test_a_foreign_patch_of_linen_sow_and_lift_pack_survives_and_is_chained():
  original_sow, original_pack = nn.Module.sow, core_lift.pack
  seen = []

  def foreign_sow(self, *args, **kwargs):
    seen.append("sow")
    return original_sow(self, *args, **kwargs)

  def foreign_pack(*args, **kwargs):
    seen.append("pack")
    return original_pack(*args, **kwargs)

  nn.Module.sow, core_lift.pack = foreign_sow, foreign_pack
  try:
    x = jnp.ones((1, 4))
    model = lb.lazy_init(lb.ToNNX(ScanNet(), rngs=nnx.Rngs(0)), x, capacity=3)
    assert nn.Module.sow is foreign_sow and core_lift.pack is foreign_pack
    assert {"sow", "pack"} <= set(seen)  # discovery went through them
    seen.clear()
    lb.preallocate(model, jnp.ones((2, 4)), capacity=3)
    assert nn.Module.sow is foreign_sow and core_lift.pack is foreign_pack
    assert {"sow", "pack"} <= set(seen)
    y = model(jnp.ones((2, 4)))
  finally:
    nn.Module.sow, core_lift.pack = original_sow, original_pack
  want_y, want = ScanNet().apply(
    lb.linen_variables(model), jnp.ones((2, 4)), mutable=["intermediates"]
  )
  np.testing.assert_allclose(y, want_y, rtol=RTOL, atol=ATOL)
  got = lb.recorded(model)["intermediates"]
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(g, jnp.stack(w), rtol=RTOL, atol=ATOL),
    got,
    want["intermediates"],
    is_leaf=lambda v: isinstance(v, tuple),
  )


class PlainSower(nnx.Module):
  def __call__(self, x):
    self.sow(nnx.Intermediate, "h", x)
    return x


class RecordingSower(nnx.Module):
  def __call__(self, x):
    self.sow(nnx.Intermediate, "h", x)
    return x + 1


def test_flax_sow_stays_flax_own_for_modules_that_do_not_record():
  flax_sow = nnx.Module.__dict__["sow"]
  assert flax_sow.__module__.startswith("flax.") and flax_sow.__qualname__ == "Module.sow"
  recording = lb.preallocate(RecordingSower(), jnp.zeros(2), capacity=4)
  plain = PlainSower()
  assert "sow" not in PlainSower.__dict__ and type(plain).sow is flax_sow
  assert nnx.Module.__dict__["sow"] is flax_sow
  recording(jnp.zeros(2))
  plain(jnp.ones(2))
  plain(jnp.ones(2))
  assert len(val(plain.h)) == 2  # flax's own tuple-append, untouched
  assert lb.recorded(recording)["intermediates"]["h"].shape == (1, 2)
  assert type(recording) is RecordingSower  # the user's class, not a stand-in


def test_lazy_init_leaves_the_model_objects_classes_as_they_were():
  barrier = threading.Barrier(1)
  model = Holder(barrier)
  before = {tuple(p): type(n) for p, n in _compat.iter_graph(model) if isinstance(n, nnx.Module)}
  lb.lazy_init(model, jnp.ones((1, 4)), capacity=2)
  after = {tuple(p): type(n) for p, n in _compat.iter_graph(model) if isinstance(n, nnx.Module)}
  assert after == before


# --------------------------------------------------------- compiled steps see re-declarations
class NativeNet(nnx.Module):
  def __init__(self):
    self.lin = nnx.Linear(3, 3, rngs=nnx.Rngs(0))

  def __call__(self, x):
    h = self.lin(x)
    self.sow(nnx.Intermediate, "h", h)
    return h


def test_compile_step_follows_preallocate_on_a_native_graph():
  x = jnp.arange(3.0)[None]
  model = lb.preallocate(NativeNet(), x, capacity=2)
  step = lb.compile_step(lambda m, x: m(x), model)
  step(x)
  lb.preallocate(model, x, capacity=6)  # grows the buffer, keeps the first record
  for _ in range(4):
    step(x)
  assert lb.buffers(model)["intermediates"]["h"].shape == (6, 1, 3)
  assert int(lb.counts(model)["intermediates"]["h"]) == 5
  reference = NativeNet()  # same seed, flax's own sow
  reference(x)
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["h"],
    jnp.stack([val(reference.h)[0]] * 5),
    rtol=RTOL,
    atol=ATOL,
  )


# ------------------------------------------------------------ one discovery per root
def test_lazy_init_traces_each_linen_part_once():
  traces = []

  class Counted(nn.Module):
    @nn.compact
    def __call__(self, x):
      traces.append(x.shape)
      h = nn.Dense(4)(x)
      self.sow("intermediates", "h", h)
      return h

  class Root(nnx.Module):
    def __init__(self):
      self.part = lb.ToNNX(Counted(), rngs=nnx.Rngs(0))

    def __call__(self, x):
      y = self.part(x)
      self.sow(nnx.Intermediate, "y", y)
      return y

  lb.lazy_init(Root(), jnp.ones((1, 4)), capacity=2)
  assert len(traces) == 1  # the init trace only: sites come from what it sowed
  traces.clear()
  lb.lazy_init(lb.ToNNX(Counted(), rngs=nnx.Rngs(0)), jnp.ones((1, 4)), capacity=2)
  assert len(traces) == 1


def _host(a):
  if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
    a = jax.random.key_data(a)
  return np.asarray(a)


def test_preallocate_traces_once_and_leaves_params_and_rng_streams_alone():
  traces = []

  class Drop(nn.Module):
    @nn.compact
    def __call__(self, x):
      traces.append(x.shape)
      h = nn.Dropout(0.5, deterministic=False)(nn.Dense(4)(x))
      self.sow("intermediates", "h", h)
      return h

  model = lb.lazy_init(lb.ToNNX(Drop(), rngs=nnx.Rngs(0, dropout=1)), jnp.ones((1, 4)), capacity=2)
  # Buffers and counts of the new signature are added; everything else stays as it was.
  records = nnx.Not(nnx.Any(lb.Buffer, lb.Count))
  state = jax.tree.map(_host, nnx.state(model, records))
  traces.clear()
  lb.preallocate(model, jnp.ones((3, 4)), capacity=2)
  assert len(traces) == 1
  after = jax.tree.map(_host, nnx.state(model, records))
  jax.tree.map(np.testing.assert_array_equal, after, state)


# ------------------------------------------------- a failed lazy_init leaves the model as it was
class DenseSow(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(4)(x)
    self.sow("intermediates", "h", h)
    return h


def test_a_lazy_init_that_fails_on_its_capacity_changes_nothing():
  x = jnp.linspace(-1, 1, 6).reshape(2, 3)
  model = lb.ToNNX(DenseSow(), rngs=nnx.Rngs(0))
  before = jax.tree.map(_host, nnx.state(model))  # the rng streams among them
  with pytest.raises(lb.CapacityError, match=r"no capacity key covers"):
    lb.lazy_init(model, x, capacity={"typo": 2})  # known wrong only after the call
  assert not lb.linen_variables(model)  # Linen's init undone
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(_host, nnx.state(model)), before)
  lb.lazy_init(model, x, capacity=2)  # the retry initializes as a first correct call would
  fresh = lb.lazy_init(lb.ToNNX(DenseSow(), rngs=nnx.Rngs(0)), x, capacity=2)
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.tree.map(_host, nnx.state(model)),
    jax.tree.map(_host, nnx.state(fresh)),
  )
  model(x)
  _, sown = DenseSow().apply(lb.linen_variables(model), x, mutable=["intermediates"])
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["h"],
    np.stack(sown["intermediates"]["h"]),
    rtol=RTOL,
    atol=ATOL,
  )


def test_a_second_lazy_init_warns_that_it_replaces_the_params():
  x = jnp.ones((2, 3))
  model = lb.lazy_init(lb.ToNNX(nn.Dense(4), rngs=nnx.Rngs(0)), x, capacity=2)
  loaded = {"params": jax.tree.map(jnp.ones_like, lb.linen_variables(model)["params"])}
  lb.checkpoint.load_linen_variables(model, loaded)
  with pytest.warns(
    lb.ParamsReinitializedWarning,
    match=r"re-initialized the parameters of lb.ToNNX\(Dense\).*already held parameters.*"
    r"Fix: .*lb\.preallocate\(model, \*args, capacity=\.\.\.\)",
  ):
    lb.lazy_init(model, x, capacity=4)
  # As stock flax.nnx.bridge does, the loaded params are replaced (the warning is the fix).
  assert not np.all(lb.linen_variables(model)["params"]["kernel"] == 1.0)
  lb.checkpoint.load_linen_variables(model, loaded)
  with warnings.catch_warnings():
    warnings.simplefilter("error", lb.ParamsReinitializedWarning)
    lb.preallocate(model, x, capacity=4)  # the way to a new capacity keeps them, silently
  np.testing.assert_array_equal(lb.linen_variables(model)["params"]["kernel"], 1.0)
