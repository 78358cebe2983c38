"""The tolerance of every check loopbridge runs: the precision both sides run at, and then
`lb.compare`'s default tolerance from each leaf's dtype, the backend and that precision.

Two correct computations of one model differ by what their arithmetic rounds. For float32 on
CPU that is a few float32 ulps of reassociated sums. On an NVIDIA GPU (Ampere and later) XLA
runs float32 matmuls and convolutions in TensorFloat-32 by default (10-bit mantissa, a unit
roundoff of about 5e-4), so outputs differ by ~1e-3 relative. On a TPU (measured on a v5e with
jax 0.10.2):
- float32 matmuls run by default as ONE bfloat16 pass (8-bit mantissa, about 3 significant
  digits); `jax_default_matmul_precision='high'` makes that 3 bfloat16 passes
  (bfloat16_3x, about 5 digits) and 'highest' 6 passes (about 7 digits, float32's own);
- transcendentals (exp, tanh, erf, rsqrt) still differ from a CPU's in the 5th digit, even at
  'highest'.
At a backend's default precision a tolerance wide enough for that noise hides real porting
bugs (a missing bias, a LayerNorm with the wrong epsilon), and one tight enough for a CPU calls
an equal port unequal. So a check (`lb.compare`, the check inside `lb.port.draft`, the evidence
of `lb.checkpoint.linen_to_nnx` / `nnx_to_linen` and `loopbridge convert`) runs both sides under
`jax.default_matmul_precision('highest')` by default (`precision='highest'`, `check_context`),
where every backend computes float32 matmuls in float32, and compares with float32 tolerances
(1e-5; 1e-4 on a TPU for its transcendentals). `precision='model'` runs the models at their own
precision (the user's `jax_default_matmul_precision`, `jax.default_matmul_precision(...)`
blocks included) with the tolerance that goes with it (3e-2 for one bfloat16 pass).

Absolute tolerances are relative to each output's scale: `atol` is a fraction of a robust
scale of the reference leaf (a high percentile of its finite magnitudes, mask values left out:
`compare_elementwise`), never an absolute 3e-2 that a small-init head's whole output fits
inside, nor one that a `finfo.min` mask widens to 3e33. The decision lives in one place,
`check_tolerance` / `default_tolerance`, and the reports say what was chosen and why.

Per-call `precision=` arguments inside the models (e.g. `nn.Dense(precision=...)`) are not
overridden by the context; pass `rtol=`/`atol=` for those.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import typing as tp

import jax
import numpy as np

# (rtol, atol) per floating dtype size in bytes: two implementations of the same math differ
# by a few ulps of the reassociated sums; a porting bug is far above that.
_FLOAT_TOLERANCES = {1: (1e-1, 1e-1), 2: (1e-2, 1e-2), 4: (1e-5, 1e-5), 8: (1e-9, 1e-9)}
_BFLOAT16_TOLERANCES = (1e-2, 1e-2)
_FLOAT16_TOLERANCES = (1e-3, 1e-3)

# What a float32 matmul computes in, -> (rtol, atol) for float32 results. About ten unit
# roundoffs of the input format, as PyTorch's TF32 tests allow (5e-3), so a correct port passes
# with room and a bug of 1% of a value is still found.
FLOAT32 = "float32"
TENSORFLOAT32 = "tensorfloat32"
BFLOAT16_3X = "bfloat16_3x"
BFLOAT16 = "bfloat16"
FLOAT8 = "float8"
_MATMUL_TOLERANCES = {
  FLOAT32: _FLOAT_TOLERANCES[4],
  BFLOAT16_3X: (1e-4, 1e-4),
  TENSORFLOAT32: (5e-3, 5e-3),
  BFLOAT16: (3e-2, 3e-2),
  FLOAT8: (1e-1, 1e-1),
}
_MATMUL_WORDS = {
  FLOAT32: "full float32",
  BFLOAT16_3X: "three bfloat16 passes (bfloat16_3x)",
  TENSORFLOAT32: "TensorFloat-32",
  BFLOAT16: "one bfloat16 pass",
  FLOAT8: "float8",
}

# `jax_default_matmul_precision` values (jax.lax.Precision names and aliases) -> what each
# backend computes float32 matmuls in. XLA:CPU computes float32 whatever the setting (measured
# on jax 0.5.3 and 0.10.2: 'bfloat16', 'tensorfloat32' and 'BF16_BF16_F32' give float32
# results). On GPU, DEFAULT and HIGH use TensorFloat-32 (NVIDIA_TF32_OVERRIDE=0 turns it off).
_PRECISION_NAMES = {
  None: "default",
  "default": "default",
  "fastest": "default",
  "bfloat16": "default",
  "high": "high",
  "tensorfloat32": "high",
  "bfloat16_3x": "high",
  "highest": "highest",
  "float32": "highest",
}
# Differences left at full float32 matmuls: a TPU's transcendentals (exp, tanh, erf, rsqrt)
# agree with float32 to 4-5 digits, so two equal models that compute them in other orders or
# fusions differ by up to ~1e-5 relative, amplified by a norm; elsewhere float32 ulps.
_FLOAT32_FLOOR = {"tpu": (1e-4, 1e-4)}
_BY_BACKEND = {
  "gpu": {"default": TENSORFLOAT32, "high": TENSORFLOAT32, "highest": FLOAT32},
  "tpu": {"default": BFLOAT16, "high": BFLOAT16_3X, "highest": FLOAT32},
}


# What a check runs both models at: `HIGHEST` sets `jax.default_matmul_precision('highest')`
# around both runs (the default); `MODEL` leaves the models' own precision.
HIGHEST = "highest"
MODEL = "model"
PRECISIONS = (HIGHEST, MODEL)
PRECISION_ERROR = (
  "{where}: precision={value!r} is not one of 'highest' (run both models under "
  "jax.default_matmul_precision('highest') and compare with float32 tolerances: the default) "
  "or 'model' (run them at their own precision, with the looser tolerance that goes with it, "
  "e.g. 3e-2 for a TPU's one bfloat16 pass). Fix: precision='highest' or precision='model'."
)


@dataclasses.dataclass(frozen=True)
class ToleranceChoice:
  """The default tolerance a check used for values no `rtol=`/`atol=` was given for.

  Attributes:
    backend: the JAX backend the models ran on (`jax.default_backend()`: 'cpu', 'gpu', 'tpu').
    matmul_precision: `jax_default_matmul_precision` as the models ran ('default' when unset;
      'highest' under the check's default `precision='highest'`).
    float32_matmuls: what the backend computes float32 matmuls in with that setting:
      'float32', 'tensorfloat32', 'bfloat16_3x', 'bfloat16' or 'float8'.
    rtol: the relative tolerance for float32 (and complex64) leaves.
    atol: the absolute tolerance for float32 (and complex64) leaves, as a fraction of each
      leaf's scale (the 99th percentile of its reference's finite magnitudes, mask values such
      as `finfo.min`, -1e9 or infinities equal on both sides left out): a leaf agrees where
      `|candidate - reference| <= atol * scale(reference) + rtol * |reference|` at every entry.
    reason: one sentence saying why.
    precision: what the check ran both models at: 'highest' (under
      `jax.default_matmul_precision('highest')`, the default) or 'model' (their own).

  Other dtypes keep their own defaults (bfloat16 1e-2, float16 1e-3, float64 1e-9, integers
  and bools exact), widened to `rtol`/`atol` where those are larger.
  """

  backend: str
  matmul_precision: str
  float32_matmuls: str
  rtol: float
  atol: float
  reason: str
  precision: str = MODEL

  def for_dtype(self, dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol as a fraction of the leaf's scale) for a leaf of `dtype`."""
    storage = _storage_tolerance(dtype)
    if storage == (0.0, 0.0) or _float_bytes(dtype) >= 8:
      return storage  # exact types; float64 matmuls are never run in a narrower format
    return (max(storage[0], self.rtol), max(storage[1], self.atol))

  def for_pair(self, reference: np.dtype, candidate: np.dtype) -> tuple[float, float]:
    """(rtol, atol as a fraction of the reference's scale) for comparing a leaf of
    `candidate` dtype with one of `reference` dtype: the wider of the two dtypes' tolerances."""
    rtol, atol = self.for_dtype(np.dtype(reference))
    other = self.for_dtype(np.dtype(candidate))
    return max(rtol, other[0]), max(atol, other[1])


def check_precision(value: object, where: str, error: type[Exception]) -> str:
  """`value` if it names a check precision ('highest' or 'model'); else `error` saying so."""
  if not isinstance(value, str) or value not in PRECISIONS:
    raise error(PRECISION_ERROR.format(where=where, value=value))
  return value


def check_context(precision: str) -> tp.ContextManager[object]:
  """What both sides of a check run inside: `jax.default_matmul_precision('highest')` for
  'highest' (every backend then computes float32 matmuls in float32), nothing for 'model'."""
  if precision == HIGHEST:
    return jax.default_matmul_precision(HIGHEST)
  return contextlib.nullcontext()


def is_float(dtype: np.dtype) -> bool:
  """Whether `dtype` is a floating or complex type (bfloat16 and float8 included)."""
  # bfloat16 and the float8 types come from ml_dtypes with kind 'V'; their names say it.
  return dtype.kind in "fc" or dtype.name.startswith(("float", "bfloat"))


def _float_bytes(dtype: np.dtype) -> int:
  return dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize


def _storage_tolerance(dtype: np.dtype) -> tuple[float, float]:
  if not is_float(dtype):
    return (0.0, 0.0)  # integers and bools: exact
  if dtype.name == "bfloat16":
    return _BFLOAT16_TOLERANCES
  if dtype.name == "float16":
    return _FLOAT16_TOLERANCES
  return _FLOAT_TOLERANCES.get(_float_bytes(dtype), _FLOAT_TOLERANCES[1])


def _precision_name(value: object) -> str:
  """The config value as text ('default' when unset); a `jax.lax.Precision` by its name."""
  if value is None:
    return "default"
  name = getattr(value, "name", value)  # a Precision or DotAlgorithmPreset enum member
  return str(name)


def _algorithm_class(name: str) -> str | None:
  """An explicit dot algorithm ('BF16_BF16_F32_X3', 'TF32_TF32_F32', ...): its class, or None."""
  upper = name.upper()
  if "F8" in upper:
    return FLOAT8
  if "BF16" in upper:
    return FLOAT32 if "X6" in upper or "X9" in upper else BFLOAT16_3X if "X3" in upper else BFLOAT16
  if "TF32" in upper:
    return FLOAT32 if "X3" in upper else TENSORFLOAT32
  if upper.startswith(("F32_F32", "F64")):
    return FLOAT32
  return None


def running_backend() -> str:
  """The backend the models run on (`jax.default_backend()`); one place, so a test can
  simulate another backend's arithmetic on a CPU."""
  return jax.default_backend()


def default_tolerance(
  backend: str | None = None,
  matmul_precision: object = dataclasses.MISSING,
  *,
  precision: str = MODEL,
) -> ToleranceChoice:
  """The default tolerance of a check, for a backend and the precision its models ran at.

  Args:
    backend: 'cpu', 'gpu', 'tpu' (or a platform name such as 'cuda'); None for
      `jax.default_backend()`.
    matmul_precision: a `jax_default_matmul_precision` value; left out for the one the models
      ran at: 'highest' for `precision='highest'`, else the current one
      (`jax.config.jax_default_matmul_precision`, which a `jax.default_matmul_precision(...)`
      block sets).
    precision: what the check ran both models at: 'highest' (under `check_context`) or
      'model' (their own precision).

  Returns:
    A `ToleranceChoice` naming the backend, the precision, what float32 matmuls are computed
    in, the float32 (rtol, atol) and why.
  """
  if backend is None:
    backend = running_backend()
  backend = {"cuda": "gpu", "rocm": "gpu"}.get(backend, backend)
  if matmul_precision is dataclasses.MISSING:
    matmul_precision = (
      HIGHEST if precision == HIGHEST else getattr(jax.config, "jax_default_matmul_precision", None)
    )
  setting = _precision_name(matmul_precision)
  shown = "jax_default_matmul_precision " + (repr(setting) if setting != "default" else "unset")
  level = _PRECISION_NAMES.get(setting.lower())
  if backend == "cpu":
    matmuls = FLOAT32
    why = "XLA:CPU computes float32 matmuls in full float32" + (
      f", whatever jax_default_matmul_precision says ({setting!r})" if setting != "default" else ""
    )
  elif backend == "gpu" and os.environ.get("NVIDIA_TF32_OVERRIDE") == "0" and level != "highest":
    matmuls = FLOAT32
    why = f"NVIDIA_TF32_OVERRIDE=0 keeps GPU float32 matmuls in full float32 ({shown})"
  elif backend in _BY_BACKEND and level is not None:
    matmuls = _BY_BACKEND[backend][level]
    why = f"{backend.upper()} float32 matmuls run in {_MATMUL_WORDS[matmuls]} ({shown})"
  elif backend in _BY_BACKEND and (algorithm := _algorithm_class(setting)) is not None:
    matmuls = algorithm
    why = f"float32 matmuls run in {_MATMUL_WORDS[matmuls]} ({shown})"
  elif backend in _BY_BACKEND:
    matmuls = _BY_BACKEND[backend]["default"]
    why = (
      f"{shown} is not a precision loopbridge knows, so {backend.upper()}'s default "
      f"({_MATMUL_WORDS[matmuls]}) is assumed"
    )
  else:
    matmuls = FLOAT32
    why = f"backend {backend!r} is assumed to compute float32 matmuls in full float32 ({shown})"
  rtol, atol = _MATMUL_TOLERANCES[matmuls]
  floor = _FLOAT32_FLOOR.get(backend)
  if floor is not None and matmuls == FLOAT32:
    rtol, atol = max(rtol, floor[0]), max(atol, floor[1])
    why += f"; {backend.upper()} transcendentals (exp, tanh, erf, rsqrt) agree to 4-5 digits"
  ran = (
    "both models ran under jax.default_matmul_precision('highest') (precision='highest', the "
    "default)"
    if precision == HIGHEST
    else "the models ran at their own precision (precision='model')"
  )
  return ToleranceChoice(
    backend=backend,
    matmul_precision=setting,
    float32_matmuls=matmuls,
    rtol=rtol,
    atol=atol,
    reason=f"float32 rtol {rtol:g}, atol {atol:g} of each output's scale: {ran}; {why}",
    precision=precision,
  )
