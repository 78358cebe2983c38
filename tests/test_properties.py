"""Property-based tests (hypothesis): what a jitted loop records equals plain Linen's sows.

Random: capacity, number of steps, sows per call, overflow policy, dtype (float32, bfloat16,
int32, bool), value shape, an optional `nn.scan` (length and the axis Linen stacks sows on),
and the step at which `lb.reset` runs. Reference: the Linen module applied step by step with
`apply(..., mutable=['intermediates'])` (jitted per step, no loopbridge code), whose sow
tuples, concatenated in call order, give every value; the expected record is then the first
`capacity` values ("error"/"drop") or the last `capacity` in order ("wrap").

Comparisons: int32 and bool bit-exact; float32 rtol=atol=1e-6 and bfloat16 rtol=atol=1e-2
(round-off; the values are small integers, so in practice they match exactly). Counts exact.

Example count: the `ci` profile (20 examples) by default; LOOPBRIDGE_HYPOTHESIS_PROFILE=thorough
runs 300 (profiles are registered in conftest.py). Every example compiles its loop once;
lengths and reset points are traced, so both loop segments share one compilation.
"""

from __future__ import annotations

import typing as tp

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import loopbridge as lb

pytestmark = pytest.mark.slow  # hypothesis: many compiled loops; run by `-m slow` (.ci/run)

MAX_STEPS = 6
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "int32": jnp.int32, "bool": jnp.bool_}
TOLERANCE: dict[str, dict[str, tp.Any]] = {
  "float32": dict(rtol=1e-6, atol=1e-6),
  "bfloat16": dict(rtol=1e-2, atol=1e-2),
}


def _shift(x, j):
  """A dtype-preserving, exactly representable change: x + j (bool: x xor odd j)."""
  if x.dtype == jnp.bool_:
    return jnp.logical_xor(x, j % 2 == 1)
  return x + jnp.asarray(j, x.dtype)


class Body(nn.Module):
  """nn.scan body: sows `per_call` values per iteration, then advances the carry."""

  per_call: int

  @nn.compact
  def __call__(self, carry, _):
    for j in range(self.per_call):
      self.sow("intermediates", "v", _shift(carry, j))
    return _shift(carry, 1), None


class Sower(nn.Module):
  """Sows `per_call` values per call at top level, or inside an nn.scan of `scan_length`."""

  per_call: int
  scan_length: int = 0  # 0: no scan
  scan_axis: int = 0  # the axis nn.scan stacks the sown values on

  @nn.compact
  def __call__(self, x):
    if not self.scan_length:
      for j in range(self.per_call):
        self.sow("intermediates", "v", _shift(x, j))
      return x
    carry, _ = nn.scan(
      Body, variable_axes={"intermediates": self.scan_axis}, split_rngs={}, length=self.scan_length
    )(self.per_call)(x, None)
    return carry


@st.composite
def configs(draw):
  dtype = draw(st.sampled_from(sorted(DTYPES)))
  shape = draw(st.sampled_from([(), (2,), (1, 3)]))
  scan_length = draw(st.sampled_from([0, 0, 1, 3]))
  scan_axis = draw(st.integers(0, len(shape))) if scan_length else 0
  return dict(
    dtype=dtype,
    shape=shape,
    per_call=draw(st.integers(1, 3)),
    scan_length=scan_length,
    scan_axis=scan_axis,
    capacity=draw(st.integers(1, 7)),
    overflow=draw(st.sampled_from(["error", "drop", "wrap"])),
    steps=draw(st.integers(0, MAX_STEPS)),
    reset_at=draw(st.integers(0, MAX_STEPS)),
  )


@nnx.jit
def _run(model, xs, lo, hi):
  def body(i, carry):
    model, xs = carry
    model(xs[i])
    return model, xs

  nnx.fori_loop(lo, hi, body, (model, xs))


def _inputs(cfg):
  dtype = DTYPES[cfg["dtype"]]
  steps = np.arange(MAX_STEPS * max(1, int(np.prod(cfg["shape"])))).reshape(
    (MAX_STEPS, *cfg["shape"])
  )
  if dtype == jnp.bool_:
    return jnp.asarray(steps % 3 == 0)
  return jnp.asarray(steps % 50 - 7).astype(dtype)


def _site(tree, cfg):
  """The one sow site: intermediates/v, or intermediates/ScanBody_0/v inside the nn.scan."""
  tree = tree["intermediates"]
  return tree["ScanBody_0"]["v"] if cfg["scan_length"] else tree["v"]


def _linen_values(module, xs, cfg):
  """Every value plain Linen sows, in call order, one list entry per tuple entry."""
  apply = jax.jit(lambda x: module.apply({}, x, mutable=["intermediates"])[1])
  values = []
  for x in xs:
    values.extend(np.asarray(v) for v in _site(apply(x), cfg))
  return values


def _expected(values, capacity, overflow):
  if len(values) <= capacity:
    return values
  return values[-capacity:] if overflow == "wrap" else values[:capacity]


def _check_segment(model, values, cfg):
  count = int(_site(lb.counts(model), cfg))
  assert count == len(values)
  capacity, overflow = cfg["capacity"], cfg["overflow"]
  if overflow == "error" and count > capacity:
    with pytest.raises(lb.BufferOverflowError, match=f"capacity={capacity}"):
      lb.recorded(model)
    # What was kept is the first `capacity` values, readable raw.
    got = np.asarray(_site(lb.buffers(model), cfg))
  else:
    got = np.asarray(_site(lb.recorded(model), cfg))
  want = _expected(values, capacity, overflow)
  assert got.shape[0] == len(want)
  for i, value in enumerate(want):
    if cfg["dtype"] in TOLERANCE:
      np.testing.assert_allclose(
        got[i].astype(np.float32),
        value.astype(np.float32),
        **TOLERANCE[cfg["dtype"]],
        err_msg=f"record {i}",
      )
    else:
      np.testing.assert_array_equal(got[i], value, err_msg=f"record {i}")


@given(configs())
def test_recorded_values_equal_linen_step_by_step(cfg):
  module = Sower(cfg["per_call"], cfg["scan_length"], cfg["scan_axis"])
  xs = _inputs(cfg)
  model = lb.lazy_init(
    lb.ToNNX(module, rngs=nnx.Rngs(0)), xs[0], capacity=cfg["capacity"], overflow=cfg["overflow"]
  )
  values = _linen_values(module, xs, cfg)
  per_step = len(values) // MAX_STEPS
  steps, reset_at = cfg["steps"], min(cfg["reset_at"], cfg["steps"])

  _run(model, xs, 0, reset_at)
  _check_segment(model, values[: reset_at * per_step], cfg)

  lb.reset(model)
  assert int(_site(lb.counts(model), cfg)) == 0
  assert _site(lb.recorded(model), cfg).shape[0] == 0
  assert not np.asarray(_site(lb.buffers(model), cfg)).any()

  _run(model, xs, reset_at, steps)
  _check_segment(model, values[reset_at * per_step : steps * per_step], cfg)
