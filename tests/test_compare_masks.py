"""A tolerance that a few extreme entries cannot widen: `lb.compare`, a draft's check and
conversion evidence hold each entry to `atol * scale + rtol * |reference|`, the scale a high
percentile of the reference's finite magnitudes with mask values (infinities, `finfo.min`,
-1e9 equal on both sides) matched exactly and left out.

With the largest magnitude as the scale, logits masked with `jnp.finfo(jnp.float32).min` were
compared at an atol of ~3e33 (with -1e9 at ~1e4): a port that forgets `/ temperature` passed.
The references are plain Linen `apply` runs; the TPU's tolerance is chosen by saying the
backend is a TPU (`running_backend`), the path every check reads it from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb
from loopbridge import _compat
from loopbridge._core.errors import CheckpointError
from loopbridge._diagnostics import compare_tolerance
from loopbridge._diagnostics.compare_elementwise import compare_arrays
from loopbridge._diagnostics.compare_tolerance import default_tolerance

D, V = 8, 12  # hidden width; vocabulary padded to V, the last 3 entries masked
FINFO_MIN = float(jnp.finfo(jnp.float32).min)
MASKS = {"finfo.min": FINFO_MIN, "-1e9": -1e9, "-inf": -float("inf")}


class MaskedHead(nn.Module):
  """Logits of a padded vocabulary, scaled by a temperature, the padding masked."""

  mask: float
  temperature: float = 2.0

  @nn.compact
  def __call__(self, h, valid):
    logits = nn.Dense(V, name="head")(h) / self.temperature
    return jnp.where(valid, logits, self.mask)


class HeadPort(nnx.Module):
  """MaskedHead's port; `divides=False` forgets `/ temperature`; `mask` may be another one.
  The correct port multiplies by 1/temperature: equal math, another rounding."""

  def __init__(self, mask: float, *, divides: bool = True, temperature: float = 2.0):
    self.head = nnx.Linear(D, V, rngs=nnx.Rngs(0))
    self.mask, self.divides, self.temperature = mask, divides, temperature

  def __call__(self, h, valid):
    logits = self.head(h)
    if self.divides:
      logits = logits * (1.0 / self.temperature)
    return jnp.where(valid, logits, self.mask)


@pytest.fixture(scope="module")
def inputs():
  h = jax.random.normal(jax.random.key(0), (4, D))
  valid = jnp.arange(V) < V - 3
  return h, valid


@pytest.fixture(params=["cpu", "tpu"])
def backend(request, monkeypatch):
  """The tolerance of the backend named: the CPU's float32 one (1e-5) or a TPU's (1e-4)."""
  if request.param != "cpu":
    monkeypatch.setattr(compare_tolerance, "running_backend", lambda: request.param)
  return request.param


def loaded(port: HeadPort, variables) -> HeadPort:
  params = variables["params"]["head"]
  _compat.set_variable_value(port.head.kernel, params["kernel"])
  _compat.set_variable_value(port.head.bias, params["bias"])
  return port


def valid_error(model, variables, port, h, valid) -> float:
  """The largest difference on the valid logits, from plain Linen."""
  keep = np.asarray(valid)
  want = np.asarray(model.apply(variables, h, valid))[:, keep]
  got = np.asarray(port(h, valid))[:, keep]
  return float(np.max(np.abs(want - got)))


@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
def test_a_port_that_forgets_the_temperature_is_found_beside_a_mask(inputs, backend, mask):
  h, valid = inputs
  model = MaskedHead(MASKS[mask])
  variables = model.init(jax.random.key(1), h, valid)
  port = loaded(HeadPort(MASKS[mask], divides=False), variables)
  assert valid_error(model, variables, port, h, valid) > 0.1  # the bug is real
  report = lb.compare((model, variables), port, h, valid)
  assert report.default_tolerance is not None and report.default_tolerance.backend == backend
  assert not report.ok, str(report)
  divergence = report.first_divergence
  assert divergence is not None and divergence.reference_path == "", str(report)
  # The report says what the atol was a fraction of, and how many masks it left out.
  assert divergence.masked == 4 * 3 and divergence.scale is not None
  assert 0.1 < divergence.scale < 10 and divergence.atol is not None and divergence.atol < 1e-3
  assert "mask value(s) matched exactly and left out" in str(report), str(report)


@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
def test_an_equal_port_with_masks_still_passes(inputs, backend, mask):
  h, valid = inputs
  model = MaskedHead(MASKS[mask])
  variables = model.init(jax.random.key(1), h, valid)
  port = loaded(HeadPort(MASKS[mask]), variables)
  np.testing.assert_allclose(port(h, valid), model.apply(variables, h, valid), rtol=1e-6)
  report = lb.compare((model, variables), port, h, valid)
  assert report.ok, str(report)
  top = next(p for p in report.pairs if p.reference_path == "")
  assert top.leaves[0].masked == 4 * 3 and top.leaves[0].scale is not None
  assert "99th percentile of the reference's finite magnitudes" in str(report)


def test_another_mask_value_is_a_difference(inputs):
  # Masks are matched exactly: -1e9 where Linen writes finfo.min is not Linen's output.
  h, valid = inputs
  model = MaskedHead(FINFO_MIN)
  variables = model.init(jax.random.key(1), h, valid)
  report = lb.compare((model, variables), loaded(HeadPort(-1e9), variables), h, valid)
  assert not report.ok, str(report)


class Spiked(nn.Module):
  """A Dense whose output holds one entry of 1e6 (an outlier, or a sentinel)."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(16, name="proj")(x).at[0, 0].set(1e6)


class SpikedPort(nnx.Module):
  def __init__(self, *, shift: float = 0.0, spike_shift: float = 0.0):
    self.proj = nnx.Linear(D, 16, rngs=nnx.Rngs(0))
    self.shift, self.spike_shift = shift, spike_shift

  def __call__(self, x):
    out = self.proj(x) + self.shift
    return out.at[0, 0].set(1e6 + self.spike_shift)


@pytest.mark.parametrize("spike_shift", [0.0, 0.5], ids=["spike-equal", "spike-shifted"])
def test_a_shift_hidden_beside_one_large_entry_is_found(backend, spike_shift):
  x = jax.random.normal(jax.random.key(2), (4, D))
  variables = Spiked().init(jax.random.key(3), x)

  def port_of(**shifts) -> SpikedPort:
    port = SpikedPort(**shifts)
    _compat.set_variable_value(port.proj.kernel, variables["params"]["proj"]["kernel"])
    _compat.set_variable_value(port.proj.bias, variables["params"]["proj"]["bias"])
    return port

  shifted = port_of(shift=0.5, spike_shift=spike_shift)
  want = np.asarray(Spiked().apply(variables, x))
  assert np.max(np.abs(np.asarray(shifted(x)) - want)[1:]) == pytest.approx(0.5, rel=1e-3)
  report = lb.compare((Spiked(), variables), shifted, x)
  assert not report.ok, str(report)
  assert lb.compare((Spiked(), variables), port_of(), x).ok


def test_the_scale_is_a_percentile_that_one_entry_cannot_move():
  cpu = default_tolerance("cpu", precision="highest")
  reference = np.linspace(-1.0, 1.0, 1000).astype(np.float32)
  reference[7] = 1e6
  candidate = reference + np.float32(1e-3)
  candidate[7] = reference[7]
  result = compare_arrays(reference, candidate, cpu)
  assert not result.within and result.masked == 1 and result.scale == pytest.approx(0.99, abs=0.01)
  # Integers and bools stay exact, their scale 1.
  ints = compare_arrays(np.arange(4), np.arange(4) + 1, cpu)
  assert not ints.within and ints.atol == 0.0
  # NaN in the same places is equal; an infinity matches only the same infinity.
  nan = np.array([np.nan, 1.0, -np.inf], np.float32)
  assert compare_arrays(nan, nan.copy(), cpu).within
  assert not compare_arrays(nan, np.array([np.nan, 1.0, FINFO_MIN], np.float32), cpu).within


def test_a_drafts_check_passes_its_masked_port(inputs):
  h, valid = inputs
  draft = lb.port.draft(MaskedHead(FINFO_MIN), h, valid)
  assert draft.ok, draft.report()


def test_conversion_refuses_a_port_that_forgets_the_temperature(inputs, backend):
  h, valid = inputs
  model = MaskedHead(FINFO_MIN)
  variables = model.init(jax.random.key(1), h, valid)
  with pytest.raises(CheckpointError, match=r"does not reproduce the Linen model.s output"):
    lb.checkpoint.linen_to_nnx(model, variables, HeadPort(FINFO_MIN, divides=False), h, valid)
  port = HeadPort(FINFO_MIN)
  lb.checkpoint.linen_to_nnx(model, variables, port, h, valid)
  np.testing.assert_allclose(port(h, valid), model.apply(variables, h, valid), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16, np.float32], ids=str)
def test_a_mask_of_each_float_dtype_is_left_out(dtype):
  cpu = default_tolerance("cpu", precision="highest")
  reference = np.linspace(-1.0, 1.0, 8).astype(dtype)
  reference[3] = jnp.finfo(dtype).min
  doubled, valid = reference.copy(), np.arange(8) != 3
  doubled[valid] = reference[valid] * np.asarray(2, dtype)
  result = compare_arrays(reference, doubled, cpu)
  assert result.masked == 1 and result.scale < 2 and not result.within
  assert compare_arrays(reference, reference.copy(), cpu).within
