"""Several call signatures per model: a prompt call and one-token decode steps in one program.

The model is shaped like HuggingFace's Flax decoders (transformers 4.x): a KV cache sized by
an initializing call on the full length (`init_cache`), then one call on the prompt `(B, P)`
and one call per generated token `(B, 1)`, all in one jitted program, with a capture filter
recording every attention block's `(out, weights)`. Every recorded value is compared with
plain Linen `apply`, call by call. The default run keeps the prompt + decode test and the
cheap ones; the rest (each declares the decoder three times) runs in the slow pass.
"""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge._core import recorder as _recorder

from models import MLP

B, P, MAX_LEN, VOCAB, D = 2, 3, 8, 11, 16
STEPS = 4  # decode steps after the prompt (P + STEPS <= MAX_LEN)


class CachedAttention(nn.Module):
  """Single-head causal attention with an HF-style cache: any number of new tokens per call."""

  @nn.compact
  def __call__(self, x):
    q, k, v = (nn.Dense(D, name=n)(x) for n in ("q", "k", "v"))
    is_init = self.is_initializing()
    cached_k = self.variable("cache", "key_cache", jnp.zeros, (x.shape[0], MAX_LEN, D))
    cached_v = self.variable("cache", "value_cache", jnp.zeros, (x.shape[0], MAX_LEN, D))
    index = self.variable("cache", "index", lambda: jnp.array(0, jnp.int32))
    if is_init:  # sizing call on the full length: plain causal attention, cache untouched
      keys, values, start = k, v, 0
    else:
      start = index.value
      cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, start, 0))
      cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, start, 0))
      index.value = start + x.shape[1]
      keys, values = cached_k.value, cached_v.value
    positions = start + jnp.arange(x.shape[1])
    visible = jnp.arange(keys.shape[1])[None, :] <= positions[:, None]
    logits = jnp.where(visible, q @ keys.transpose(0, 2, 1) / np.sqrt(D), -1e9)
    weights = jax.nn.softmax(logits, axis=-1)
    return weights @ values, weights


class Decoder(nn.Module):
  @nn.compact
  def __call__(self, ids):
    h = nn.Embed(VOCAB, D)(ids)
    for i in range(2):
      out, _ = CachedAttention(name=f"attn_{i}")(h)
      h = h + nn.Dense(D, name=f"mlp_{i}")(out)
    self.sow("intermediates", "last_hidden", h[:, -1])  # same shape for prompt and step
    return nn.Dense(VOCAB, name="head")(h)


def attention_only(module, method_name):
  return isinstance(module, CachedAttention)


PROMPT_SIG = f"(int32[{B},{P}])"
STEP_SIG = f"(int32[{B},1])"


def prompt_ids():
  return jax.random.randint(jax.random.key(3), (B, P), 0, VOCAB)


def decoding_model():
  model = lb.ToNNX(Decoder(), rngs=nnx.Rngs(0), capture_intermediates=attention_only)
  full = jnp.zeros((B, MAX_LEN), jnp.int32)
  lb.lazy_init(model, full, capacity=1)  # init_cache on the full length
  lb.preallocate(model, prompt_ids(), capacity=1)
  lb.preallocate(model, full[:, :1], capacity=STEPS)
  return model


@nnx.jit(donate_argnums=0)
def generate(model, ids):
  logits = model(ids, mutable=["cache"])
  token = jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)

  def step(i, carry):
    m, token, tokens = carry
    logits = m(token, mutable=["cache"])
    token = jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)
    return m, token, tokens.at[:, i].set(token[:, 0])

  tokens = jnp.zeros((B, STEPS), jnp.int32)
  _, _, tokens = nnx.fori_loop(0, STEPS, step, (model, token, tokens))
  return tokens


def linen_generate(model):
  """Plain Linen, call by call: the tokens and each call's intermediates."""
  module = Decoder()
  variables = lb.linen_variables(model)
  params, cache = {"params": variables["params"]}, variables["cache"]
  calls = []

  def call(ids):
    nonlocal cache
    logits, state = module.apply(
      {**params, "cache": cache},
      ids,
      mutable=["cache", "intermediates"],
      capture_intermediates=attention_only,
    )
    cache = state["cache"]
    calls.append(state["intermediates"])
    return jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)

  token = call(prompt_ids())
  tokens = []
  for _ in range(STEPS):
    token = call(token)
    tokens.append(token[:, 0])
  return np.stack(tokens, 1), calls


def test_prompt_and_decode_steps_both_recorded_equal_to_linen():
  model = decoding_model()
  want_tokens, calls = linen_generate(model)  # before the run: the cache starts empty
  tokens = generate(model, prompt_ids())
  np.testing.assert_array_equal(tokens, want_tokens)

  prompt = lb.recorded(model, signature=PROMPT_SIG)["intermediates"]
  steps = lb.recorded(model, signature=STEP_SIG)["intermediates"]
  for name in ("attn_0", "attn_1"):
    out, weights = prompt[name]["__call__"]
    want_out, want_weights = calls[0][name]["__call__"][0]
    assert out.shape == (1, B, P, D)
    np.testing.assert_allclose(out[0], want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights[0], want_weights, rtol=1e-5, atol=1e-6)
    out, weights = steps[name]["__call__"]
    assert out.shape == (STEPS, B, 1, D)
    for t in range(STEPS):
      want_out, want_weights = calls[t + 1][name]["__call__"][0]
      np.testing.assert_allclose(out[t], want_out, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(weights[t], want_weights, rtol=1e-5, atol=1e-6)
  # A sow of the same shape in both signatures is still kept apart.
  np.testing.assert_allclose(
    prompt["last_hidden"][0], calls[0]["last_hidden"][0], rtol=1e-5, atol=1e-6
  )
  for t in range(STEPS):
    np.testing.assert_allclose(
      steps["last_hidden"][t], calls[t + 1]["last_hidden"][0], rtol=1e-5, atol=1e-6
    )

  # signature=None: a sow holding records of both signatures reads as {label: value}.
  both = lb.recorded(model)["intermediates"]["last_hidden"]
  assert list(both) == [PROMPT_SIG, STEP_SIG]
  assert both[PROMPT_SIG].shape == (1, B, D) and both[STEP_SIG].shape == (STEPS, B, D)
  counts = lb.counts(model)["intermediates"]["last_hidden"]
  assert {k: int(v) for k, v in counts.items()} == {PROMPT_SIG: 1, STEP_SIG: STEPS}
  # The full-length signature of lazy_init recorded nothing and is left out.
  assert f"(int32[{B},{MAX_LEN}])" not in both


class HFDecoder(nn.Module):
  """HuggingFace Flax's cache protocol: the `cache` collection exists only after a call with
  `init_cache=True` (on the full length); later calls use it when it is there. One head, the
  cache laid out as HF's `(batch, length, heads, head_dim)`."""

  @nn.compact
  def __call__(self, ids, init_cache=False):
    h = nn.Embed(VOCAB, D)(ids)
    q, k, v = (nn.Dense(D, name=n)(h) for n in ("q", "k", "v"))
    positions = jnp.arange(ids.shape[1])
    keys, values = k, v
    if init_cache or self.has_variable("cache", "cached_key"):
      ready = self.has_variable("cache", "cached_key")
      shape = (ids.shape[0], MAX_LEN, 1, D)
      cached_k = self.variable("cache", "cached_key", jnp.zeros, shape)
      cached_v = self.variable("cache", "cached_value", jnp.zeros, shape)
      index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
      if ready:  # HF: "detect if we're initializing by absence of existing cache data"
        start = index.value
        at = (0, start, 0, 0)
        cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k[:, :, None], at)
        cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v[:, :, None], at)
        index.value = start + ids.shape[1]
        keys, values = cached_k.value[:, :, 0], cached_v.value[:, :, 0]
        positions = start + positions
    visible = jnp.arange(keys.shape[1])[None, :] <= positions[:, None]
    logits = jnp.where(visible, q @ keys.transpose(0, 2, 1) / np.sqrt(D), -1e9)
    out = jax.nn.softmax(logits, axis=-1) @ values
    self.sow("intermediates", "last_hidden", out[:, -1])
    return nn.Dense(VOCAB, name="head")(out)


def test_preallocate_with_init_cache_creates_the_cache_and_a_decode_loop_equals_linen():
  # As HF's generate: params from a plain init, then the cache from a call with
  # init_cache=True. lb.preallocate with that call must create the collection (it created
  # nothing, and the decode loop then ran without a cache).
  full = jnp.zeros((B, MAX_LEN), jnp.int32)
  model = lb.ToNNX(HFDecoder(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, full, capacity=1)
  assert "cache" not in lb.linen_variables(model)
  params = jax.tree.map(np.asarray, lb.linen_variables(model)["params"])
  lb.preallocate(model, full, capacity=1, init_cache=True)
  assert jax.tree.all(jax.tree.map(np.array_equal, lb.linen_variables(model)["params"], params))
  want_cache = HFDecoder().init(jax.random.key(0), full, init_cache=True)["cache"]
  got_cache = lb.linen_variables(model)["cache"]
  assert jax.tree.structure(got_cache) == jax.tree.structure(want_cache)
  assert jax.tree.all(jax.tree.map(np.array_equal, got_cache, want_cache))
  lb.preallocate(model, prompt_ids(), capacity=1)
  lb.preallocate(model, full[:, :1], capacity=STEPS)

  # Plain Linen, call by call, from the cache Linen's own init_cache call makes.
  variables = {"params": params, "cache": want_cache}
  hidden, token, want_tokens = [], prompt_ids(), []
  for t in range(STEPS + 1):
    logits, state = HFDecoder().apply(variables, token, mutable=["cache", "intermediates"])
    variables = {"params": params, "cache": state["cache"]}
    hidden.append(state["intermediates"]["last_hidden"][0])
    token = jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)
    if t:
      want_tokens.append(token[:, 0])

  tokens = generate(model, prompt_ids())
  np.testing.assert_array_equal(tokens, np.stack(want_tokens, 1))
  steps = lb.recorded(model, signature=STEP_SIG)["intermediates"]["last_hidden"]
  prompt = lb.recorded(model, signature=PROMPT_SIG)["intermediates"]["last_hidden"]
  np.testing.assert_allclose(prompt[0], hidden[0], rtol=1e-5, atol=1e-6)
  for t in range(STEPS):
    np.testing.assert_allclose(steps[t], hidden[t + 1], rtol=1e-5, atol=1e-6)
  assert int(lb.linen_variables(model)["cache"]["cache_index"]) == P + STEPS


def test_a_new_signature_grows_the_count_vector_and_keeps_the_entries():
  """Every site of every signature has one entry of the wrapper's one count vector: a new
  signature adds entries at declaration, the old ones keep their values, a loop keeps the
  shape."""
  model = lb.ToNNX(MLP(2, 4), rngs=nnx.Rngs(0))
  lb.lazy_init(model, jnp.ones((1, 4)), capacity=4)
  model(jnp.ones((1, 4)))
  model(jnp.ones((1, 4)))
  (vector,) = jax.tree.leaves(nnx.state(model, lb.Count))
  assert vector.tolist() == [2, 2]  # ScanBlock_0/carry, x
  lb.preallocate(model, jnp.ones((3, 4)), capacity=4)
  (vector,) = jax.tree.leaves(nnx.state(model, lb.Count))
  assert vector.tolist() == [2, 2, 0, 0]
  assert sorted((s.slot, s.name, s.count_index) for s in _recorder.sites_of(model) or ()) == [
    (0, "ScanBlock_0/carry", 0),
    (0, "x", 1),
    (1, "ScanBlock_0/carry", 2),
    (1, "x", 3),
  ]

  @nnx.jit
  def run(model, x):
    return nnx.fori_loop(0, 3, lambda i, c: (c[0], c[0](c[1])), (model, x))[1]

  run(model, jnp.ones((3, 4)))
  (vector,) = jax.tree.leaves(nnx.state(model, lb.Count))
  assert vector.tolist() == [2, 2, 3, 3]
  counts = lb.counts(model)["intermediates"]
  assert {k: int(v) for k, v in counts["x"].items()} == {
    "(float32[1,4])": 2,
    "(float32[3,4])": 3,
  }


@pytest.mark.slow
def test_a_second_program_appends_to_each_signature_and_reset_clears_all():
  model = decoding_model()
  generate(model, prompt_ids())
  lb.reset(model)
  counts = lb.counts(model, signature=STEP_SIG)["intermediates"]["last_hidden"]
  assert int(counts) == 0
  assert int(lb.counts(model, signature=PROMPT_SIG)["intermediates"]["last_hidden"]) == 0


def test_one_signature_read_back_is_unchanged():
  """A model declared for one signature reads exactly as before signatures existed."""
  model = lb.ToNNX(MLP(2, 4), rngs=nnx.Rngs(0))
  x = jnp.ones((1, 4))
  lb.lazy_init(model, x, capacity=3)
  model(x)
  got = lb.recorded(model)["intermediates"]
  assert got["x"].shape == (1, 1, 4)
  assert got["ScanBlock_0"]["carry"].shape == (1, 2, 1, 4)
  assert [s.slot for s in lb.sow_sites(model)] == [0, 0]
  # State paths are those of 0.2: no signature key in front of the first signature.
  paths = set()
  for path, _ in jax.tree_util.tree_leaves_with_path(nnx.state(model, lb.Buffer)):
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    # flax 0.12 flattens into the Variable (a last "value" key); 0.10 stops at its state.
    paths.add("/".join(keys[:-1] if keys[-1] == "value" else keys))

  assert paths == {
    "loopbridge__buffers/intermediates/x",
    "loopbridge__buffers/intermediates/ScanBlock_0/carry",
  }


@pytest.mark.slow
def test_openpi_flow_reads_the_signature_that_recorded():
  """lazy_init on one shape, loop on another: the sites read as the loop's records."""
  model = lb.ToNNX(MLP(2, 4), rngs=nnx.Rngs(0))
  lb.lazy_init(model, jnp.ones((1, 4)), capacity=2)
  x = jnp.ones((3, 4))
  lb.preallocate(model, x, capacity=5)
  model(x)
  model(x)
  variables = lb.linen_variables(model)
  _, want = MLP(2, 4).apply(variables, x, mutable=["intermediates"])
  got = lb.recorded(model)["intermediates"]
  assert got["x"].shape == (2, 3, 4)
  np.testing.assert_allclose(
    got["ScanBlock_0"]["carry"][1], want["intermediates"]["ScanBlock_0"]["carry"][0], rtol=1e-6
  )


@pytest.mark.slow
def test_redeclaring_a_signature_keeps_its_records():
  model = lb.ToNNX(MLP(2, 4), rngs=nnx.Rngs(0))
  x = jnp.ones((1, 4))
  lb.lazy_init(model, x, capacity=2)
  model(x)
  lb.preallocate(model, x, capacity=6)  # same signature, larger capacity
  model(x)
  assert lb.recorded(model)["intermediates"]["x"].shape == (2, 1, 4)
  assert {s.capacity for s in lb.sow_sites(model)} == {6}


@pytest.mark.slow
def test_recording_false_leaves_calls_out_and_keeps_caches_running():
  model = decoding_model()
  ids = prompt_ids()
  with lb.recording(False):
    model(ids, mutable=["cache"])  # the prompt, unrecorded
  index = lb.linen_variables(model)["cache"]["attn_0"]["index"]
  assert int(index) == P  # the cache advanced
  counts = lb.counts(model, signature=PROMPT_SIG)["intermediates"]["last_hidden"]
  assert int(counts) == 0
  model(ids[:, :1], mutable=["cache"])
  assert int(lb.counts(model, signature=STEP_SIG)["intermediates"]["last_hidden"]) == 1


def test_recording_false_is_decided_at_trace_time():
  model = lb.ToNNX(MLP(2, 4), rngs=nnx.Rngs(0))
  x = jnp.ones((1, 4))
  lb.lazy_init(model, x, capacity=4)

  @nnx.jit
  def step(m, x):
    return m(x)

  with lb.recording(False):
    step(model, x)
  step(model, x)  # the cached trace: still unrecorded
  assert int(lb.counts(model)["intermediates"]["x"]) == 0
  with lb.recording(False):
    model(x)  # eager calls too
  model(x)
  assert int(lb.counts(model)["intermediates"]["x"]) == 1


def test_recording_requires_a_bool():
  with (
    pytest.raises(TypeError, match=re.escape("lb.recording(enabled) takes a bool")),
    lb.recording("no"),  # pyright: ignore[reportArgumentType]
  ):
    pass


@pytest.mark.slow
def test_an_undeclared_signature_is_refused_naming_the_fix():
  model = decoding_model()
  with pytest.raises(lb.NotDeclaredError, match=r"matches none of its declared call signatures"):
    model(jnp.zeros((B, 5), jnp.int32), mutable=["cache"])
  # Nothing was written by the failed call.
  assert int(lb.counts(model, signature=STEP_SIG)["intermediates"]["last_hidden"]) == 0


@pytest.mark.slow
def test_unknown_signature_label_is_refused_listing_the_labels():
  model = decoding_model()
  with pytest.raises(
    lb.NotDeclaredError, match=re.escape(f"its signatures: '(int32[{B},{MAX_LEN}])'")
  ):
    lb.recorded(model, signature="(int32[9,9])")


@pytest.mark.slow
def test_sow_sites_name_each_signature():
  sites = lb.sow_sites(decoding_model())
  labels = {s.signature for s in sites}
  assert labels == {f"(int32[{B},{MAX_LEN}])", PROMPT_SIG, STEP_SIG}
  assert {s.signature: s.slot for s in sites} == {
    f"(int32[{B},{MAX_LEN}])": 0,
    PROMPT_SIG: 1,
    STEP_SIG: 2,
  }


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(3)(x)
    self.sow("intermediates", "h", h)
    return h


@pytest.mark.slow
def test_a_part_called_with_two_shapes_in_one_call_records_each_apart():
  """0.2 refused this; each call now records into its own signature's buffers."""

  class Twice(nnx.Module):
    def __init__(self):
      self.part = lb.ToNNX(Net(), rngs=nnx.Rngs(0))

    def __call__(self, x):
      self.part(x)
      return self.part(jnp.concatenate([x, x]))

  x = jnp.arange(3.0)[None]
  root = Twice()
  lb.lazy_init(root.part, x, capacity=2)
  lb.preallocate(root, x, capacity=2)
  root(x)
  variables = lb.linen_variables(root.part)
  _, one = Net().apply(variables, x, mutable=["intermediates"])
  _, two = Net().apply(variables, jnp.concatenate([x, x]), mutable=["intermediates"])
  got = lb.recorded(root)["part"]["intermediates"]["h"]
  assert list(got) == ["(float32[1,3])", "(float32[2,3])"]
  np.testing.assert_allclose(got["(float32[1,3])"][0], one["intermediates"]["h"][0], rtol=1e-6)
  np.testing.assert_allclose(got["(float32[2,3])"][0], two["intermediates"]["h"][0], rtol=1e-6)


@pytest.mark.slow
def test_sow_sites_table_has_a_signature_column_only_with_several():
  one = lb.ToNNX(MLP(2, 4), rngs=nnx.Rngs(0))
  lb.lazy_init(one, jnp.ones((1, 4)), capacity=2)
  assert "signature" not in str(lb.sow_sites(one))
  table = str(lb.sow_sites(decoding_model()))
  assert table.splitlines()[1].split()[0] == "signature"
  assert PROMPT_SIG in table and STEP_SIG in table


@pytest.mark.slow
def test_checkpoint_keeps_every_signature(tmp_path):
  def declared():
    model = lb.ToNNX(MLP(2, 4), rngs=nnx.Rngs(0))
    lb.lazy_init(model, jnp.ones((1, 4)), capacity=3)
    lb.preallocate(model, jnp.ones((2, 4)), capacity=3)
    return model

  model = declared()
  model(jnp.ones((1, 4)))
  model(jnp.full((2, 4), 2.0))
  model(jnp.full((2, 4), 3.0))
  lb.checkpoint.save(tmp_path / "ckpt", model)
  restored = lb.checkpoint.restore(tmp_path / "ckpt", declared())
  want = lb.recorded(model)
  got = lb.recorded(restored)
  assert list(got["intermediates"]["x"]) == ["(float32[1,4])", "(float32[2,4])"]
  jax.tree.map(np.testing.assert_array_equal, got, want)
  assert float(got["intermediates"]["x"]["(float32[2,4])"][1, 0, 0]) == 3.0
