"""`lb.compare`'s default tolerance follows the backend's float32 matmul precision.

On CPU every `jax_default_matmul_precision` still computes float32 (measured), so the CPU
default stays tight under each. What a GPU (TensorFloat-32) or TPU (one bfloat16 pass) computes
is emulated on CPU with `jax.lax.reduce_precision` on every matmul's operands in the port: with
that backend's default tolerance a correct port compares equal, and a small planted bug is
still reported at the module that has it. The reference is always plain Linen.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb
from loopbridge import _compat
from loopbridge._diagnostics.compare_elementwise import compare_arrays
from loopbridge._diagnostics.compare_tolerance import FLOAT32, ToleranceChoice, default_tolerance

D, H = 16, 32
# The mantissa bits a backend's float32 matmul keeps of its operands.
MANTISSA = {"tensorfloat32": 10, "bfloat16": 7}


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(H)(nn.LayerNorm(epsilon=1e-6)(x))  # LayerNorm_0, Dense_0
    h = nn.Dense(D)(nn.gelu(h))  # Dense_1
    # A small-variance activation: the epsilon of the next norm decides its output.
    h = nn.LayerNorm(epsilon=1e-6)(h * 1e-3)  # LayerNorm_1
    return nn.Dense(D)(h)  # Dense_2


class Linear(nnx.Linear):
  """`nnx.Linear` whose matmul sees its operands rounded as a narrower backend rounds them."""

  def __init__(self, *args, mantissa: int | None = None, bias_shift: float = 0.0, **kwargs):
    super().__init__(*args, **kwargs)
    self.mantissa = mantissa
    self.bias_shift = bias_shift

  def __call__(self, x):  # pyright: ignore[reportIncompatibleMethodOverride]
    kernel = _compat.variable_value(self.kernel)
    bias = _compat.variable_value(self.bias) + self.bias_shift
    if self.mantissa is not None:
      x, kernel = (
        jax.lax.reduce_precision(v, exponent_bits=8, mantissa_bits=self.mantissa)
        for v in (x, kernel)
      )
    return x @ kernel + bias


class Port(nnx.Module):
  def __init__(self, rngs, *, mantissa=None, epsilon=1e-6, bias_shift=0.0):
    self.LayerNorm_0 = nnx.LayerNorm(D, epsilon=1e-6, rngs=rngs)
    self.Dense_0 = Linear(D, H, mantissa=mantissa, rngs=rngs)
    self.Dense_1 = Linear(H, D, mantissa=mantissa, rngs=rngs)
    self.LayerNorm_1 = nnx.LayerNorm(D, epsilon=epsilon, rngs=rngs)
    self.Dense_2 = Linear(D, D, mantissa=mantissa, bias_shift=bias_shift, rngs=rngs)

  def __call__(self, x):
    h = self.Dense_0(self.LayerNorm_0(x))
    h = self.Dense_1(nnx.gelu(h))
    return self.Dense_2(self.LayerNorm_1(h * 1e-3))


@pytest.fixture(scope="module")
def setup():
  x = jax.random.normal(jax.random.key(1), (8, D))
  return x, Net().init(jax.random.key(0), x)


def port_of(variables, **options):
  port = Port(nnx.Rngs(0), **options)
  lb.layers.load_params([variables["params"]], [port])
  return port


def first_differing(report) -> str | None:
  divergence = report.first_divergence
  return None if divergence is None else divergence.candidate_path


# ------------------------------------------------------------------- the decision, one table
@pytest.mark.parametrize(
  "backend,precision,matmuls,rtol",
  [
    ("cpu", None, "float32", 1e-5),
    ("cpu", "bfloat16", "float32", 1e-5),
    ("cpu", "tensorfloat32", "float32", 1e-5),
    ("gpu", None, "tensorfloat32", 5e-3),
    ("cuda", "bfloat16", "tensorfloat32", 5e-3),
    ("gpu", "tensorfloat32", "tensorfloat32", 5e-3),
    ("gpu", "highest", "float32", 1e-5),
    ("gpu", jax.lax.Precision.HIGHEST, "float32", 1e-5),
    ("gpu", "BF16_BF16_F32", "bfloat16", 3e-2),
    ("tpu", None, "bfloat16", 3e-2),
    ("tpu", "high", "bfloat16_3x", 1e-4),
    # float32 matmuls, but a TPU's transcendentals agree to 4-5 digits
    ("tpu", "float32", "float32", 1e-4),
    ("tpu", "highest", "float32", 1e-4),
  ],
)
def test_the_default_follows_backend_and_matmul_precision(backend, precision, matmuls, rtol):
  choice = default_tolerance(backend, precision)
  assert (choice.float32_matmuls, choice.rtol, choice.atol) == (matmuls, rtol, rtol)
  assert choice.reason.startswith(f"float32 rtol {rtol:g}, atol {rtol:g} of each output's scale: ")


@pytest.mark.parametrize("backend,rtol", [("cpu", 1e-5), ("gpu", 1e-5), ("tpu", 1e-4)])
def test_a_check_at_highest_has_float32_tolerances_on_every_backend(backend, rtol):
  choice = default_tolerance(backend, precision="highest")
  assert (choice.matmul_precision, choice.float32_matmuls) == ("highest", "float32")
  assert (choice.rtol, choice.atol, choice.precision) == (rtol, rtol, "highest")
  assert "jax.default_matmul_precision('highest') (precision='highest'" in choice.reason


def test_atol_is_relative_to_each_outputs_scale():
  choice = default_tolerance("tpu", None)  # one bfloat16 pass: 3e-2
  # Of 100 entries or fewer the scale is the second largest magnitude (the 99th percentile's
  # lower neighbour), so one extreme entry cannot set it.
  small = np.array([0.004, -0.005, 0.001, 0.0045], np.float32)
  result = compare_arrays(small, small, choice)
  assert (result.rtol, result.atol) == (3e-2, pytest.approx(3e-2 * 0.0045))
  zeros = np.zeros(3, np.float32)
  assert (compare_arrays(zeros, zeros, choice).atol, compare_arrays(zeros, zeros, choice).rtol) == (
    0.0,
    3e-2,
  )
  ints = np.array([1, 2], np.int32)
  assert (compare_arrays(ints, ints, choice).rtol, compare_arrays(ints, ints, choice).atol) == (
    0.0,
    0.0,
  )


def test_an_unknown_precision_assumes_the_backends_default_and_says_so():
  choice = default_tolerance("gpu", "SOMETHING_NEW")
  assert choice.float32_matmuls == "tensorfloat32"
  assert "'SOMETHING_NEW' is not a precision loopbridge knows" in choice.reason


def test_nvidia_tf32_override_keeps_gpu_matmuls_in_float32(monkeypatch):
  monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
  assert default_tolerance("gpu", None).float32_matmuls == "float32"


def test_other_dtypes_keep_their_own_default_widened_to_the_matmul_one():
  tf32 = default_tolerance("gpu", None)
  assert tf32.for_dtype(np.dtype("float64")) == (1e-9, 1e-9)
  assert tf32.for_dtype(np.dtype("int32")) == (0.0, 0.0)
  assert tf32.for_dtype(jnp.dtype(jnp.bfloat16)) == (1e-2, 1e-2)
  assert tf32.for_dtype(np.dtype("float16")) == (5e-3, 5e-3)
  cpu = default_tolerance("cpu", None)
  assert cpu.for_dtype(np.dtype("float32")) == (1e-5, 1e-5)
  assert cpu.for_dtype(np.dtype("float16")) == (1e-3, 1e-3)


# ------------------------------------------------------------- the report says what it used
def test_the_report_says_which_tolerance_it_used_and_why(setup):
  x, variables = setup
  with jax.default_matmul_precision("bfloat16"):
    report = lb.compare((Net(), variables), port_of(variables), x, precision="model")
    full = lb.compare((Net(), variables), port_of(variables), x)
  assert report.ok and full.ok, str(report)
  choice = report.default_tolerance
  assert isinstance(choice, ToleranceChoice)
  assert (choice.backend, choice.matmul_precision) == (jax.default_backend(), "bfloat16")
  assert choice.precision == "model" and "(precision='model')" in choice.reason
  # the default overrides the user's setting for the check, and says so
  assert full.default_tolerance is not None
  assert (full.default_tolerance.matmul_precision, full.default_tolerance.precision) == (
    "highest",
    "highest",
  )
  assert "jax.default_matmul_precision('highest')" in str(full)
  data = json.loads(json.dumps(report.to_dict()))
  assert data["default_tolerance"]["reason"] == choice.reason
  assert choice.reason in str(report)
  given = lb.compare((Net(), variables), port_of(variables), x, rtol=1e-4)
  assert "rtol 0.0001, atol per dtype" in str(given) and given.default_tolerance is not None


# ------------------------------------------- CPU under each matmul precision: still exact
@pytest.mark.parametrize("precision", [None, "bfloat16", "tensorfloat32"])
def test_on_cpu_each_precision_keeps_a_tight_default_that_finds_small_bugs(setup, precision):
  if jax.default_backend() != "cpu":
    pytest.skip("what CPU computes under each precision")
  x, variables = setup
  model = {"precision": "model"}  # the models at the precision set here
  with jax.default_matmul_precision(precision):
    ok = lb.compare((Net(), variables), port_of(variables), x, **model)
    # PyTorch's default epsilon, and a bias 1e-3 off: both inside any widened tolerance.
    eps = lb.compare((Net(), variables), port_of(variables, epsilon=1e-5), x, **model)
    bias = lb.compare((Net(), variables), port_of(variables, bias_shift=1e-3), x, **model)
  assert ok.ok, str(ok)
  assert ok.default_tolerance is not None and ok.default_tolerance.rtol == 1e-5
  assert first_differing(eps) == "LayerNorm_1", str(eps)
  assert first_differing(bias) == "Dense_2", str(bias)


# ---------------------------------------- narrower backends, emulated: noise passes, bugs don't
# (backend, matmul format, the smallest planted bias error this test claims is found)
NARROW = [("gpu", "tensorfloat32", 0.05), ("tpu", "bfloat16", 0.3)]


@pytest.mark.parametrize("backend,fmt,shift", NARROW, ids=[b for b, _, _ in NARROW])
def test_emulated_backend_noise_passes_and_planted_bugs_are_found(setup, backend, fmt, shift):
  if default_tolerance().float32_matmuls != FLOAT32:
    # The emulation is noise only next to a reference computed in float32; on a GPU the
    # reference's own matmuls round the same way (test_this_backends_default_... below).
    pytest.skip("emulates a narrower backend next to a float32 one (CPU)")
  x, variables = setup
  choice = default_tolerance(backend, None)
  assert choice.float32_matmuls == fmt
  tol = {"rtol": choice.rtol, "atol": choice.atol}
  mantissa = MANTISSA[fmt]
  noisy = lb.compare((Net(), variables), port_of(variables, mantissa=mantissa), x, **tol)
  assert noisy.ok, str(noisy)
  # Can fail: the emulated rounding is real noise, which CPU's tolerance calls a divergence.
  strict = lb.compare((Net(), variables), port_of(variables, mantissa=mantissa), x)
  assert not strict.ok and first_differing(strict) == "Dense_0", str(strict)
  eps = lb.compare(
    (Net(), variables), port_of(variables, mantissa=mantissa, epsilon=1e-5), x, **tol
  )
  assert first_differing(eps) == "LayerNorm_1", str(eps)
  bias = lb.compare(
    (Net(), variables), port_of(variables, mantissa=mantissa, bias_shift=shift), x, **tol
  )
  assert first_differing(bias) == "Dense_2", str(bias)


def test_this_backends_default_passes_a_correct_port_and_finds_small_bugs(setup):
  # Whatever backend runs the suite (CPU here, a TPU or GPU elsewhere): no emulation, both
  # models computed as that backend computes them at the check's default full precision, so
  # a bias 1e-3 off is found on every backend.
  x, variables = setup
  choice = default_tolerance(precision="highest")
  shift = 1e-3
  ok = lb.compare((Net(), variables), port_of(variables), x)
  eps = lb.compare((Net(), variables), port_of(variables, epsilon=1e-5), x)
  bias = lb.compare((Net(), variables), port_of(variables, bias_shift=shift), x)
  assert ok.ok and ok.default_tolerance == choice, str(ok)
  assert first_differing(eps) == "LayerNorm_1", str(eps)
  assert first_differing(bias) == "Dense_2", str(bias)
