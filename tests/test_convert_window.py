"""Converting a decoder whose two sides derive the same things from different inputs.

The pair is written as a real hand port is: the Linen model draws its sliding window from
the integer `positions`, the port from the attention mask's band; the Linen feed-forward
keeps gate and up fused as one `[2, D, F]` array (under its own scope, `nn.share_scope`),
the port as two Linears; the Linen
blocks are `layer_0, ...`, the port's a list `layers`; grouped-query attention and a soft
cap on the logits. Both compute the same on consistent inputs (positions that count the
tokens), so conversion must not check them on random positions, and must decide the fused
arrays layer by layer (the port's einsums, called without an equation, cannot run alone on
the Linen einsums' calls: their attention blocks decide them). The reference is plain Linen
`apply`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb
from loopbridge._checkpoint.convert_probes import make_inputs

from conftest import matmul_tolerance

V, D, F, H, K, HD, WINDOW, LAYERS, T = 32, 8, 12, 4, 2, 4, 3, 3, 6
RTOL, ATOL = matmul_tolerance(1e-5, 1e-5)
CAP = 5.0
init = nn.initializers.normal(0.5)


def _attend(x, positions, mask, query, key_value, out):
  x = x + jnp.sin(positions[..., None] * 0.3)  # positions also move the values
  q, (k, v) = query(x), key_value(x)
  k, v = jnp.repeat(k, H // K, axis=2), jnp.repeat(v, H // K, axis=2)  # grouped queries
  scores = jnp.where(mask[:, None], jnp.einsum("bthk,bshk->bhts", q, k) / HD**0.5, -1e9)
  return out(jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(scores), v))


class Einsum(nn.Module):
  """One weight; the equation is a call argument (so it cannot run alone on the port's)."""

  shape: tuple[int, ...]
  weight_name: str = "w"

  @nn.compact
  def __call__(self, equation, x):
    return jnp.einsum(equation, x, self.param(self.weight_name, init, self.shape))


class LinenAttention(nn.Module):
  @nn.compact
  def __call__(self, x, positions, mask):
    gap = positions[:, :, None] - positions[:, None, :]
    window = (gap >= 0) & (gap < WINDOW)  # the window from positions
    q, kv = Einsum((H, D, HD), name="q_einsum"), Einsum((2, K, D, HD), name="kv_einsum")
    out = Einsum((H, HD, D), name="attn_vec_einsum")
    return _attend(
      x,
      positions,
      mask & window,
      lambda x: q("btd,hdk->bthk", x),
      lambda x: kv("btd,ckdv->cbtkv", x),
      lambda y: out("bthk,hkd->btd", y),
    )


class LinenMlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    gating = Einsum((2, D, F), "gating_einsum")
    nn.share_scope(self, gating)  # its weight directly under `mlp`, as in a checkpoint
    linear = Einsum((F, D), "linear")
    nn.share_scope(self, linear)
    gate, up = gating("btd,cdf->cbtf", x)
    return linear("btf,fd->btd", nn.gelu(gate) * up)


class LinenBlock(nn.Module):
  @nn.compact
  def __call__(self, x, positions, mask):
    x = x + LinenAttention(name="attn")(nn.RMSNorm(name="pre_attn_norm")(x), positions, mask)
    return x + LinenMlp(name="mlp")(nn.RMSNorm(name="pre_mlp_norm")(x))


class LinenDecoder(nn.Module):
  @nn.compact
  def __call__(self, tokens, positions, mask):
    embed = nn.Embed(V, D, name="embedder")
    x = embed(tokens)
    for i in range(LAYERS):
      x = LinenBlock(name=f"layer_{i}")(x, positions, mask)
    logits = embed.attend(nn.RMSNorm(name="final_norm")(x))
    return jnp.tanh(logits / CAP) * CAP


class Attention(nnx.Module):
  def __init__(self, rngs):
    self.q_einsum = nnx.Einsum("btd,hdk->bthk", (H, D, HD), rngs=rngs)
    self.kv_einsum = nnx.Einsum("btd,ckdv->cbtkv", (2, K, D, HD), rngs=rngs)
    self.attn_vec_einsum = nnx.Einsum("bthk,hkd->btd", (H, HD, D), rngs=rngs)

  def __call__(self, x, positions, mask):
    t = mask.shape[-1]  # the window from the mask's band: token index, not position
    band = jnp.triu(jnp.ones((t, t), bool), 1 - WINDOW) & jnp.tril(jnp.ones((t, t), bool))
    kv, out = self.kv_einsum, self.attn_vec_einsum
    return _attend(x, positions, mask & band, self.q_einsum, kv, out)


class Mlp(nnx.Module):
  def __init__(self, rngs):
    self.gate = nnx.Linear(D, F, use_bias=False, rngs=rngs)
    self.up = nnx.Linear(D, F, use_bias=False, rngs=rngs)
    self.down = nnx.Linear(F, D, use_bias=False, rngs=rngs)

  def __call__(self, x):
    return self.down(nnx.gelu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
  def __init__(self, rngs):
    self.pre_attn_norm, self.pre_mlp_norm = nnx.RMSNorm(D, rngs=rngs), nnx.RMSNorm(D, rngs=rngs)
    self.attn, self.mlp = Attention(rngs), Mlp(rngs)

  def __call__(self, x, positions, mask):
    x = x + self.attn(self.pre_attn_norm(x), positions, mask)
    return x + self.mlp(self.pre_mlp_norm(x))


class Decoder(nnx.Module):
  def __init__(self, rngs):
    self.embedder = nnx.Embed(V, D, rngs=rngs)
    blocks = [Block(rngs) for _ in range(LAYERS)]
    self.layers = nnx.List(blocks) if hasattr(nnx, "List") else blocks
    self.final_norm = nnx.RMSNorm(D, rngs=rngs)

  def __call__(self, tokens, positions, mask):
    x = self.embedder(tokens)
    for block in self.layers:
      x = block(x, positions, mask)
    return jnp.tanh(self.embedder.attend(self.final_norm(x)) / CAP) * CAP


# --- the inputs ------------------------------------------------------------------------------


def _inputs(seed, batch=2):
  """Tokens, positions that count them, and a causal mask: what both models agree on."""
  tokens = jax.random.randint(jax.random.key(seed), (batch, T), 1, V)
  positions = jnp.broadcast_to(jnp.arange(T), (batch, T))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (batch, T, T))
  return tokens, positions, mask


def _variables():
  params = LinenDecoder().init(jax.random.key(1), *_inputs(0))
  keys = iter(jax.random.split(jax.random.key(7), 100))  # not an init's: no equal norms
  return jax.tree.map(lambda a: a + 0.3 * jax.random.normal(next(keys), a.shape), params)


def _assert_converted(port, variables):
  for seed in (11, 12):
    given = _inputs(seed, batch=3)
    np.testing.assert_allclose(
      port(*given), LinenDecoder().apply(variables, *given), rtol=RTOL, atol=ATOL
    )
  for i in range(LAYERS):  # each layer's fused gate/up went to its own Linears, in order
    fused = variables["params"][f"layer_{i}"]["mlp"]["gating_einsum"]
    np.testing.assert_array_equal(port.layers[i].mlp.gate.kernel[...], fused[0])
    np.testing.assert_array_equal(port.layers[i].mlp.up.kernel[...], fused[1])


MAPPING = {f"layer_{i}": f"layers/{i}" for i in range(LAYERS)}


@pytest.mark.parametrize("mapping", [None, MAPPING], ids=["automatic", "mapping"])
def test_a_window_from_positions_and_one_from_the_mask_convert(mapping):
  variables = _variables()
  port = Decoder(nnx.Rngs(0))
  report = lb.checkpoint.linen_to_nnx(LinenDecoder(), variables, port, *_inputs(0), mapping=mapping)
  _assert_converted(port, variables)
  # Each layer's fused gate/up was decided by that layer's own feed-forward call, and each
  # square kv kernel (which may be stored transposed) by that layer's attention call.
  for name in ("/mlp", "/kv_einsum"):
    found = [p for p in report.placements if p.linen.endswith(name)]
    assert len(found) == LAYERS and all(p.decided == "module" for p in found), report


def test_the_probes_keep_positions_and_masks_and_draw_token_ids():
  tokens, positions, mask = _inputs(0)
  floats = jax.random.normal(jax.random.key(3), (2, T, D))
  additive = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)
  inputs = make_inputs(
    (tokens, positions, floats),
    {"mask": mask, "bias": additive},
    lambda leaf: V if leaf is tokens else None,
  )
  assert [i.name for i in inputs] == ["sample", "probe 1", "probe 2"]
  for probe in inputs[1:]:
    got_tokens, got_positions, got_floats = probe.args
    np.testing.assert_array_equal(got_positions, positions)  # never random positions
    np.testing.assert_array_equal(probe.kwargs["mask"], mask)
    np.testing.assert_array_equal(probe.kwargs["bias"], additive)  # an additive mask
    assert not np.array_equal(got_tokens, tokens) and not np.array_equal(got_floats, floats)
    assert int(got_tokens.min()) >= 1 and int(got_tokens.max()) < V  # ids, never padding
  assert inputs[1].drawn == "args[0] (token ids), args[2] (floats)"


def test_padding_ids_stay_where_the_sample_pads():
  tokens = jnp.array([[5, 9, 0, 0], [3, 0, 0, 0]])
  (_, probe, _) = make_inputs((tokens,), {}, lambda leaf: V)
  np.testing.assert_array_equal(probe.args[0] == 0, tokens == 0)


def test_nothing_but_structure_gives_no_probes():
  _, positions, mask = _inputs(0)
  assert [i.name for i in make_inputs((positions, mask), {}, lambda leaf: None)] == ["sample"]


def test_probes_that_only_disagree_off_the_sample_are_named():
  variables = _variables()
  port = Decoder(nnx.Rngs(0))
  before = jax.tree.map(np.asarray, nnx.state(port))
  tokens, positions, mask = _inputs(5)
  shuffled = jax.random.permutation(jax.random.key(2), positions, axis=1, independent=True)
  with pytest.raises(lb.checkpoint.CheckpointError) as error:
    lb.checkpoint.linen_to_nnx(
      LinenDecoder(),
      variables,
      port,
      *_inputs(0),
      mapping=MAPPING,
      probes=[((tokens, shuffled, mask), {})],
    )
  message = str(error.value)
  assert "on the sample arguments" in message and "probe 1 (given by probes=)" in message
  assert "probes=0" in message and "no candidate conversion" not in message
  after = jax.tree.map(np.asarray, nnx.state(port))
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
  # The same inputs with the probes off: converted.
  lb.checkpoint.linen_to_nnx(
    LinenDecoder(), variables, port, *_inputs(0), mapping=MAPPING, probes=0
  )
  _assert_converted(port, variables)


def test_a_model_whose_candidates_all_fail_only_on_a_probe_is_named():
  x = jax.random.normal(jax.random.key(3), (2, T, D))
  _, positions, mask = _inputs(0)
  variables = LinenAttention().init(jax.random.key(1), x, positions, mask)
  reversed_positions = positions[:, ::-1]  # not what the mask says: the models need not agree
  with pytest.raises(lb.checkpoint.CheckpointError) as error:
    lb.checkpoint.linen_to_nnx(
      LinenAttention(),
      variables,
      Attention(nnx.Rngs(0)),
      x,
      positions,
      mask,
      probes=[((x, reversed_positions, mask), {})],
    )
  message = str(error.value)
  assert "candidate conversions reproduce the Linen model's output on the sample" in message
  assert "probe 1 (given by probes=)" in message and "probes=0" in message


# --- probes= given by the user ----------------------------------------------------------------


class Gated(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, use_bias=False)(x) * jnp.tanh(nn.Dense(D, use_bias=False)(x))


class GatedPort(nnx.Module):
  """A valid port whose gate is computed first and named otherwise: nothing pairs by name."""

  def __init__(self, rngs):
    self.gate = nnx.Linear(D, D, use_bias=False, rngs=rngs)
    self.value = nnx.Linear(D, D, use_bias=False, rngs=rngs)

  def __call__(self, x):
    g = jnp.tanh(self.gate(x))
    return self.value(x) * g


def test_probes_given_by_the_user_decide_what_the_sample_cannot():
  x = jax.random.normal(jax.random.key(4), (2, T, D))
  variables = Gated().init(jax.random.key(1), x)
  zeros = jnp.zeros((2, T, D))  # every candidate gives zeros
  with pytest.raises(lb.checkpoint.CheckpointError, match="2 different conversions"):
    lb.checkpoint.linen_to_nnx(Gated(), variables, GatedPort(nnx.Rngs(0)), zeros, probes=())
  port = GatedPort(nnx.Rngs(0))
  report = lb.checkpoint.linen_to_nnx(Gated(), variables, port, zeros, probes=[((x,), {})])
  fresh = jax.random.normal(jax.random.key(9), (3, T, D))
  np.testing.assert_allclose(port(fresh), Gated().apply(variables, fresh), rtol=RTOL, atol=ATOL)
  assert any("probe 1" in p.probes for p in report.placements), report


@pytest.mark.parametrize("probes", [-1, True, "x", [(1, 2, 3)], [((1,), [])], 2.0])
def test_probes_of_another_kind_are_refused(probes):
  x = jnp.ones((1, D))
  variables = nn.Dense(D).init(jax.random.key(1), x)
  port = nnx.Linear(D, D, rngs=nnx.Rngs(0))
  with pytest.raises(
    lb.checkpoint.CheckpointError, match=r"probes= takes None .* \(args, kwargs\)"
  ):
    lb.checkpoint.linen_to_nnx(nn.Dense(D), variables, port, x, probes=probes)
