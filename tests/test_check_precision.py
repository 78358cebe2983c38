"""Checks at full precision: `lb.compare`, a draft's check and conversion's evidence run both
models under `jax.default_matmul_precision('highest')` by default, so their verdicts mean on a
TPU what they mean on a CPU.

A TPU is simulated on the CPU, honestly: `running_backend` says 'tpu' (what the tolerance is
chosen from), and every matmul of both models goes through `tpu_dot`, which rounds float32
operands to bfloat16 (one pass, a TPU's default) unless `jax_default_matmul_precision` asks
for 'highest' (six passes: float32's own). The references are plain Linen `apply` runs.
"""

from __future__ import annotations

import typing as tp

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge import _compat
from loopbridge._diagnostics import compare_tolerance
from loopbridge._diagnostics.compare_tolerance import HIGHEST, MODEL, default_tolerance

D, H = 8, 32
# jax_default_matmul_precision values under which a TPU runs one bfloat16 pass per matmul.
ONE_PASS = {"default", "fastest", "bfloat16"}


def tpu_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
  """`lax.dot_general` as a TPU computes float32: operands rounded to bfloat16 in one pass at
  the default precision, float32's own under 'highest' (read at trace time, as XLA does)."""
  setting = precision if precision is not None else jax.config.jax_default_matmul_precision
  name = str(getattr(setting, "name", setting)).lower() if setting is not None else "default"
  if name in ONE_PASS:
    lhs, rhs = (jax.lax.reduce_precision(v, exponent_bits=8, mantissa_bits=7) for v in (lhs, rhs))
  return jax.lax.dot_general(
    lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type
  )


@pytest.fixture
def simulated_tpu(monkeypatch):
  """The tolerance is chosen for a TPU (the matmuls round like one through `tpu_dot`)."""
  monkeypatch.setattr(compare_tolerance, "running_backend", lambda: "tpu")


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(H, dot_general=tpu_dot)(x)  # Dense_0
    h = nn.LayerNorm(epsilon=1e-6)(nn.gelu(h))  # LayerNorm_0
    return nn.Dense(D, dot_general=tpu_dot)(h)  # Dense_1


class ScaledLinear(nnx.Linear):
  """`nnx.Linear` that moves a factor of 3 from its kernel onto its input (as ports that
  pre-scale attention queries do): equal math, other operands for the matmul to round."""

  def __call__(self, x):  # pyright: ignore[reportIncompatibleMethodOverride]
    kernel = _compat.variable_value(self.kernel) / 3.0
    bias = _compat.variable_value(self.bias)
    return tpu_dot(x * 3.0, kernel, (((x.ndim - 1,), (0,)), ((), ()))) + bias


class Port(nnx.Module):
  """Net's port: equal math, computed in another order (`ScaledLinear`, and a LayerNorm whose
  variance takes two passes where Linen's takes one)."""

  def __init__(self, rngs, *, epsilon=1e-6, use_bias=True):
    self.Dense_0 = ScaledLinear(D, H, rngs=rngs)
    self.LayerNorm_0 = nnx.LayerNorm(H, epsilon=epsilon, use_fast_variance=False, rngs=rngs)
    self.Dense_1 = nnx.Linear(H, D, use_bias=use_bias, dot_general=tpu_dot, rngs=rngs)

  def __call__(self, x):
    return self.Dense_1(self.LayerNorm_0(nnx.gelu(self.Dense_0(x))))


@pytest.fixture(scope="module")
def setup():
  x = jax.random.normal(jax.random.key(1), (64, D))
  variables = Net().init(jax.random.key(0), x)
  # A bias of ~1% of the output: a real bug, inside one bfloat16 pass's 3e-2 tolerance.
  params = variables["params"]
  params = {
    **params,
    "Dense_1": {**params["Dense_1"], "bias": 0.01 * jax.random.normal(jax.random.key(2), (D,))},
  }
  return x, {"params": params}


def port_of(variables, **options):
  port = Port(nnx.Rngs(0), **options)
  for name in ("Dense_0", "LayerNorm_0", "Dense_1"):
    module = getattr(port, name)
    for leaf, value in variables["params"][name].items():
      variable = getattr(module, leaf, None)
      if variable is not None and _compat.variable_value(variable) is not None:
        _compat.set_variable_value(variable, jnp.asarray(value))
  return port


def linen_full(variables, x):
  """Plain Linen at full precision, optionally with a changed parameter (the independent
  measure of how large a planted bug is)."""
  with jax.default_matmul_precision("highest"):
    return np.asarray(Net().apply(variables, x))


def first_differing(report) -> str | None:
  return None if report.first_divergence is None else report.first_divergence.candidate_path


# ------------------------------------------------------------------------- the simulation
def test_the_simulated_tpu_rounds_like_one_bfloat16_pass_until_highest():
  x = jax.random.normal(jax.random.key(3), (4, 64))
  w = jax.random.normal(jax.random.key(4), (64, 16))
  dims = (((1,), (0,)), ((), ()))
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  scale = np.abs(exact).max()
  one_pass = np.abs(np.asarray(tpu_dot(x, w, dims)) - exact).max() / scale
  with jax.default_matmul_precision("highest"):
    full = np.abs(np.asarray(tpu_dot(x, w, dims)) - exact).max() / scale
  assert 1e-3 < one_pass < 3e-2  # about 3 significant digits, as measured on a TPU v5e
  assert full < 1e-6


# ----------------------------------------------------------------------------- lb.compare
def test_on_a_simulated_tpu_the_default_runs_at_highest_and_finds_the_planted_bugs(
  setup, simulated_tpu
):
  x, variables = setup
  ok = lb.compare((Net(), variables), port_of(variables), x)
  no_bias = lb.compare((Net(), variables), port_of(variables, use_bias=False), x)
  eps = lb.compare((Net(), variables), port_of(variables, epsilon=2e-3), x)
  assert ok.ok, str(ok)
  assert first_differing(no_bias) == "Dense_1", str(no_bias)
  assert first_differing(eps) == "LayerNorm_0", str(eps)
  choice = ok.default_tolerance
  assert choice is not None and choice == default_tolerance("tpu", precision=HIGHEST)
  assert (choice.backend, choice.precision, choice.matmul_precision) == ("tpu", HIGHEST, HIGHEST)
  assert (choice.float32_matmuls, choice.rtol, choice.atol) == ("float32", 1e-4, 1e-4)
  assert "jax.default_matmul_precision('highest')" in str(ok)
  assert "transcendentals" in choice.reason


def test_the_planted_bugs_are_real_and_one_bfloat16_pass_hides_them(setup, simulated_tpu):
  """Can fail: the same checks at the model's own precision, as they ran on a TPU before."""
  x, variables = setup
  want = linen_full(variables, x)
  scale = np.abs(want).max()
  with jax.default_matmul_precision("highest"):
    no_bias = np.asarray(port_of(variables, use_bias=False)(x))
    eps = np.asarray(port_of(variables, epsilon=2e-3)(x))
  # Independent of lb.compare: each bug moves the output by more than 0.1% of its scale,
  # and by less than one bfloat16 pass's 3e-2.
  for got in (no_bias, eps):
    assert 1e-3 * scale < np.abs(got - want).max() < 3e-2 * scale
  model = {"precision": MODEL}
  assert lb.compare((Net(), variables), port_of(variables, use_bias=False), x, **model).ok
  assert lb.compare((Net(), variables), port_of(variables, epsilon=2e-3), x, **model).ok
  # ... and an equal port is unequal at the model's precision with the full-precision
  # tolerance: its other operands round to other bfloat16 values.
  tight = lb.compare((Net(), variables), port_of(variables), x, rtol=1e-4, atol=1e-4, **model)
  assert not tight.ok, str(tight)


def test_precision_model_uses_the_looser_tolerance_and_says_so(setup, simulated_tpu):
  x, variables = setup
  report = lb.compare((Net(), variables), port_of(variables), x, precision="model")
  assert report.ok, str(report)
  choice = report.default_tolerance
  assert choice is not None and (choice.precision, choice.float32_matmuls) == (MODEL, "bfloat16")
  assert (choice.rtol, choice.atol) == (3e-2, 3e-2)
  assert "the models ran at their own precision (precision='model')" in str(report)


def test_a_bad_precision_is_refused():
  with pytest.raises(lb.CompareError, match=r"precision='fast' is not one of 'highest'"):
    lb.compare(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Linear(2, 2, rngs=nnx.Rngs(0)), 0,
               precision="fast")  # fmt: skip


# ---------------------------------------------------- atol follows each output's own scale
class SmallHead(nn.Module):
  """A small-init head: outputs of ~5e-3, far below an absolute 3e-2."""

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (D, D))
    return 0.005 * tpu_dot(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


class HeadNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    return SmallHead(name="head")(nn.gelu(nn.Dense(D, dot_general=tpu_dot)(x)))


class TorchHead(nnx.Module):
  """The port's head stores its square kernel as (out, in), as PyTorch does."""

  def __init__(self, rngs):
    self.weight = nnx.Param(jax.random.normal(rngs.params(), (D, D)))

  def __call__(self, x):
    weight = _compat.variable_value(self.weight)
    return 0.005 * tpu_dot(x, weight, (((x.ndim - 1,), (1,)), ((), ())))


class HeadPort(nnx.Module):
  def __init__(self, rngs):
    self.Dense_0 = nnx.Linear(D, D, dot_general=tpu_dot, rngs=rngs)
    self.head = TorchHead(rngs)

  def __call__(self, x):
    return self.head(nnx.gelu(self.Dense_0(x)))


@pytest.mark.parametrize("precision", [HIGHEST, MODEL])
def test_conversion_finds_a_small_heads_transposed_square_kernel(simulated_tpu, precision):
  x = jax.random.normal(jax.random.key(1), (16, D))
  variables = HeadNet().init(jax.random.key(0), x)
  kernel = np.asarray(variables["params"]["head"]["kernel"])
  with jax.default_matmul_precision("highest"):
    want = np.asarray(HeadNet().apply(variables, x))
    port = HeadPort(nnx.Rngs(0))
    lb.layers.load_params([variables["params"]["Dense_0"]], [port.Dense_0])
    port.head.weight = nnx.Param(jnp.asarray(kernel))  # what a rename writes: not transposed
    wrong = np.asarray(port(x))
  scale = np.abs(want).max()
  # Can fail: the untransposed kernel is wrong by about its whole output, yet inside an
  # absolute 3e-2, the tolerance a TPU's default precision used to get whatever the scale.
  assert np.abs(wrong - want).max() > 0.5 * scale
  assert np.allclose(wrong, want, rtol=3e-2, atol=3e-2)
  port = HeadPort(nnx.Rngs(0))
  report = lb.checkpoint.linen_to_nnx(HeadNet(), variables, port, x, precision=precision)
  with jax.default_matmul_precision("highest"):
    got = np.asarray(port(x))
  assert np.abs(got - want).max() <= 1e-5 * scale, str(report)
  assert np.array_equal(np.asarray(_compat.variable_value(port.head.weight)), kernel.T)
  assert report.tolerance is not None and report.tolerance.precision == precision
  assert f"precision={precision!r}" in str(report)


def test_conversion_refuses_a_bad_precision():
  x = jnp.ones((1, 2))
  variables = nn.Dense(2).init(jax.random.key(0), x)
  with pytest.raises(lb.checkpoint.CheckpointError, match=r"precision='low' is not one of"):
    lb.checkpoint.linen_to_nnx(
      nn.Dense(2),
      variables,
      nnx.Linear(2, 2, rngs=nnx.Rngs(0)),
      x,
      precision=tp.cast(tp.Any, "low"),
    )


# ------------------------------------------------ a draft's report says what its check ran at
class Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.relu(nn.Dense(4)(x)))


@pytest.mark.parametrize("backend", ["cpu", "tpu"])
@pytest.mark.parametrize("precision", [HIGHEST, MODEL])
def test_a_drafts_report_names_its_check_precision_and_tolerance(monkeypatch, backend, precision):
  monkeypatch.setattr(compare_tolerance, "running_backend", lambda: backend)
  x = jax.random.normal(jax.random.key(0), (3, 5))
  draft = lb.port.draft(Mlp(), x, check_precision=precision)
  assert draft.ok, draft.report()
  chosen = default_tolerance(backend, precision=precision)
  lines = draft.report().splitlines()
  verdict = next(i for i, line in enumerate(lines) if line.startswith("Verdict"))
  assert f"check_precision={precision!r}" in lines[verdict]
  assert lines[verdict - 1] == f"Tolerance: {chosen.reason}."
  assert f"rtol {chosen.rtol:g}, atol {chosen.atol:g}" in lines[verdict - 1]
  assert lines[-1] == lines[verdict]  # the report ends with the verdict
