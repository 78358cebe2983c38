"""Corpus: a decoder-only LM with flax's own decode attention, sampled greedily in an NNX loop.

The shape of flax's lm1b example (written here, tiny): token and position embeddings, pre-norm
blocks with `nn.MultiHeadDotProductAttention(decode=True)` and an MLP, logits. The position
lives in the `cache` collection next to the attention caches, so one token per call is the
whole decoding step. Each block sows its output; the logits layer is recorded through
`capture_intermediates` (the way to record a module that does not sow).

Recipe under test: `lb.lazy_init` on the FULL length (sizes the caches), `lb.preallocate` for
the one-token step, a jitted `nnx.fori_loop` feeding the prompt and then the model's own
argmax. Reference: the model's own Linen decode, one `apply` per token with the cache threaded
by hand, same params. Tokens must be equal; recorded floats agree to atol=1e-5 (float32, jit
vs op-by-op round-off).

A second variant annotates params with `nn.with_logical_partitioning` (lm1b/t5x style) and
runs under a 1-device mesh with logical axis rules; with no mesh, flax 0.12 refuses to create
such params (stock bridge too) and loopbridge says which flag and which fixes.
"""

from __future__ import annotations

import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx import bridge
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import loopbridge as lb
from loopbridge import _compat

# Real-model shapes end to end: each feature they use has its own faster test; CI runs
# these in its `-m slow` pass (tests/conftest.py).
pytestmark = pytest.mark.slow

VOCAB, WIDTH, HEADS, LAYERS, MAX_LEN = 16, 16, 2, 2, 8
STEPS = MAX_LEN - 1
PROMPT = jnp.array([[1, 5, 3], [2, 7, 7]], jnp.int32)
ATOL = 1e-5
RULES = (("batch", "data"), ("vocab", None), ("embed", None), ("mlp", "model"))
EAGER_SHARDING = hasattr(nnx, "use_eager_sharding")  # flax >= 0.12


def _init(partitioned, names, base):
  return nn.with_logical_partitioning(base, names) if partitioned else base


class Block(nn.Module):
  partitioned: bool = False

  @nn.compact
  def __call__(self, x):
    x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS, decode=True)(nn.LayerNorm()(x))
    kernel = _init(self.partitioned, ("embed", "mlp"), nn.initializers.lecun_normal())
    out = _init(self.partitioned, ("mlp", "embed"), nn.initializers.lecun_normal())
    h = nn.gelu(nn.Dense(2 * WIDTH, kernel_init=kernel)(nn.LayerNorm()(x)))
    x = x + nn.Dense(WIDTH, kernel_init=out)(h)
    self.sow("intermediates", "hidden", x)
    return x


class DecoderLM(nn.Module):
  """Token ids (batch, length) -> logits; decode-only (the cache tracks the position)."""

  partitioned: bool = False

  @nn.compact
  def __call__(self, tokens):
    position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
    positions = position.value + jnp.arange(tokens.shape[1])
    if not self.is_initializing():
      position.value = position.value + tokens.shape[1]
    embed = _init(self.partitioned, ("vocab", "embed"), nn.initializers.normal(1.0))
    x = nn.Embed(VOCAB, WIDTH, embedding_init=embed)(tokens)
    x = x + nn.Embed(MAX_LEN, WIDTH, name="pos_embed")(positions)
    for _ in range(LAYERS):
      x = Block(self.partitioned)(x)
    head = _init(self.partitioned, ("embed", "vocab"), nn.initializers.lecun_normal())
    return nn.Dense(VOCAB, kernel_init=head, name="logits")(nn.LayerNorm()(x))


def capture_logits(module, method_name):
  return method_name == "__call__" and module.name == "logits"


def _start_tokens():
  return jnp.zeros((PROMPT.shape[0], MAX_LEN), jnp.int32).at[:, : PROMPT.shape[1]].set(PROMPT)


def _next_token(t, tokens, logits):
  """The prompt's own next token while inside it, the argmax after."""
  proposed = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
  return jnp.where(t + 1 < PROMPT.shape[1], tokens[:, t + 1], proposed)


TRACES = []


@nnx.jit
def generate(model, tokens):
  TRACES.append(1)  # runs only while tracing

  def body(t, carry):
    model, tokens = carry
    logits = model(jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1), mutable=["cache"])
    nxt = _next_token(t, tokens, logits)
    return model, jax.lax.dynamic_update_slice_in_dim(tokens, nxt[:, None], t + 1, axis=1)

  return nnx.fori_loop(0, STEPS, body, (model, tokens))[1]


def linen_decode(module, params):
  """The model's own Linen decode: init on the full length, one apply per token."""
  cache = module.init(jax.random.key(1), _start_tokens())["cache"]  # empty, full length
  # One plain Linen apply per token, jitted only so the steps share one compilation.
  step = jax.jit(
    functools.partial(
      module.apply, mutable=["cache", "intermediates"], capture_intermediates=capture_logits
    )
  )
  tokens = _start_tokens()
  hidden, logits_seen = [], []
  for t in range(STEPS):
    logits, state = step({"params": params, "cache": cache}, tokens[:, t : t + 1])
    cache = state["cache"]
    hidden.append(state["intermediates"][f"Block_{LAYERS - 1}"]["hidden"][0])
    logits_seen.append(state["intermediates"]["logits"]["__call__"][0])
    tokens = tokens.at[:, t + 1].set(_next_token(t, tokens, logits))
  return tokens, jnp.stack(hidden), jnp.stack(logits_seen)


def _build(partitioned=False):
  model = lb.ToNNX(DecoderLM(partitioned), rngs=nnx.Rngs(0), capture_intermediates=capture_logits)
  lb.lazy_init(model, _start_tokens(), capacity=STEPS)  # full length: caches of MAX_LEN
  lb.preallocate(model, _start_tokens()[:, :1], capacity=STEPS)  # the one-token step
  return model


def _params(model):
  # nnx.to_pure_dict is the spelling from flax 0.11 on; 0.10 has only the State method.
  state = nnx.state(model, nnx.Param)
  return nnx.to_pure_dict(state) if hasattr(nnx, "to_pure_dict") else state.to_pure_dict()


def _check_against_linen(model, partitioned=False):
  tokens = generate(model, _start_tokens())
  rec = lb.recorded(model)["intermediates"]
  ref_tokens, ref_hidden, ref_logits = linen_decode(DecoderLM(partitioned), _params(model))
  np.testing.assert_array_equal(tokens, ref_tokens)
  hidden = rec[f"Block_{LAYERS - 1}"]["hidden"]
  assert hidden.shape == (STEPS, PROMPT.shape[0], 1, WIDTH)
  np.testing.assert_allclose(hidden, ref_hidden, atol=ATOL, rtol=0)
  np.testing.assert_allclose(rec["logits"]["__call__"], ref_logits, atol=ATOL, rtol=0)
  return tokens


def test_greedy_tokens_equal_linen_decode_and_a_second_generation_needs_no_retrace():
  model = _build()
  key = _compat.variable_value(model.Block_0["MultiHeadDotProductAttention_0"]["cached_key"])
  assert key.shape == (PROMPT.shape[0], MAX_LEN, HEADS, WIDTH // HEADS)  # full length
  empty_cache = jax.tree.map(jnp.copy, nnx.state(model, nnx.Cache))
  tokens = _check_against_linen(model)
  assert tokens[:, : PROMPT.shape[1]].tolist() == PROMPT.tolist()

  hidden = lb.recorded(model)["intermediates"]["Block_1"]["hidden"]
  lb.reset(model)
  nnx.update(model, empty_cache)
  traces = len(TRACES)
  np.testing.assert_array_equal(generate(model, _start_tokens()), tokens)
  assert len(TRACES) == traces  # same shapes: reset and cache restore need no new trace
  np.testing.assert_array_equal(lb.recorded(model)["intermediates"]["Block_1"]["hidden"], hidden)


# ------------------------------------------------------------------- partitioned params
def _mesh():
  # Mesh(...) has Auto axes on every supported jax (jax.make_mesh defaults to Explicit axes on
  # new jax, under which Linen's own param constraint fails: see the troubleshooting guide).
  return Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))


@contextlib.contextmanager
def _on_mesh(mesh):
  with _compat.mesh_context(mesh), nn.logical_axis_rules(RULES):
    yield


def test_partitioned_params_under_a_mesh_get_their_sharding_and_decode_like_linen():
  mesh = _mesh()
  with _on_mesh(mesh):
    model = _build(partitioned=True)
  kernel = model.Block_0["Dense_0"]["kernel"]
  names, _ = _compat.variable_sharding(kernel)
  assert names == ("embed", "mlp")  # the logical names travel as NNX metadata
  if EAGER_SHARDING:  # flax 0.12 places params on creation; 0.10 leaves that to the user
    value = _compat.variable_value(kernel)
    assert value.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "model")), value.ndim)
  with _on_mesh(mesh):
    _check_against_linen(model, partitioned=True)
  buffer = lb.buffers(model)["intermediates"]["Block_1"]["hidden"]
  # One device: the sown values are replicated on the mesh, so is their buffer. (How buffers
  # follow batch-sharded values over 8 devices is tests/test_sharding.py.)
  assert buffer.sharding.is_equivalent_to(NamedSharding(mesh, P()), buffer.ndim)


@pytest.mark.skipif(not EAGER_SHARDING, reason="flax 0.10 never shards params on creation")
def test_partitioned_params_without_a_mesh_name_the_flag_and_both_fixes():
  # What the stock bridge does, for the record: the same flax error, with no way out named.
  stock = bridge.ToNNX(DecoderLM(partitioned=True), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="An auto mesh context or metadata is required"):
    bridge.lazy_init(stock, _start_tokens())
  model = lb.ToNNX(DecoderLM(partitioned=True), rngs=nnx.Rngs(0))
  with pytest.raises(
    lb.sharding.ShardingError,
    match=r"(?s)lb\.ToNNX\(DecoderLM\) cannot create its "
    r"partition-annotated params.*flax_always_shard_variable.*"
    r"jax\.set_mesh\(mesh\), nn\.logical_axis_rules.*"
    r"nnx\.use_eager_sharding\(False\)",
  ):
    lb.lazy_init(model, _start_tokens(), capacity=STEPS)


def test_partitioned_params_without_a_mesh_work_as_on_flax_0_10_with_eager_sharding_off():
  """The second fix (on flax 0.10 nothing is needed): params unsharded, metadata kept."""
  off = nnx.use_eager_sharding(False) if EAGER_SHARDING else contextlib.nullcontext()
  with off:
    model = _build(partitioned=True)
  names, _ = _compat.variable_sharding(model.Block_0["Dense_0"]["kernel"])
  assert names == ("embed", "mlp")
  _check_against_linen(model, partitioned=True)
