"""Sample inputs: `--arg DTYPE[DIMS]` specs, and the arrays a command calls the model on."""

from __future__ import annotations

import dataclasses
import math
import re
import typing as tp
import warnings

import jax
from jax import numpy as jnp

from .._core.errors import first_line
from .errors import USAGE_ERROR, CliError

_MAX_ARRAY_SIZE = 2**63 - 1  # array dimensions and sizes are int64 in JAX
_ARG_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[\s*([0-9,\s]*)\]\s*$")
NO_INPUTS_HINT = "; pass its inputs with --arg, e.g. --arg 'float32[1,16]'"


@dataclasses.dataclass(frozen=True)
class ArgSpec:
  """One `--arg`: a dtype name and a shape.

  Examples:
    >>> str(ArgSpec('float32', (1, 100)))
    'float32[1,100]'
  """

  dtype: str
  shape: tuple[int, ...]

  def __str__(self) -> str:
    return f"{self.dtype}[{','.join(map(str, self.shape))}]"


def parse_arg_spec(text: str) -> ArgSpec:
  """Read one `--arg` value.

  Args:
    text: `DTYPE[DIM,...]`, e.g. `'float32[1,100]'`, `'bool[]'` (a scalar).

  Returns:
    The dtype's canonical name and the shape.

  Raises:
    CliError: (usage) malformed text, an unknown dtype or one JAX arrays cannot have, a 64-bit
      type without `JAX_ENABLE_X64`, an empty dimension, or more elements than int64 counts.

  Examples:
    >>> parse_arg_spec('float32[1,100]')
    ArgSpec(dtype='float32', shape=(1, 100))
  """
  match = _ARG_RE.match(text)
  if match is None:
    raise CliError(
      f"--arg {text!r}: expected DTYPE[DIM,...] such as 'float32[1,100]', 'int32[1,16]' "
      "or 'bool[]' (a scalar)",
      USAGE_ERROR,
    )
  name, dims = match.groups()
  try:
    dtype = jnp.dtype(name)
  except TypeError:
    raise CliError(
      f"--arg {text!r}: unknown dtype {name!r}; use a NumPy/JAX dtype name such as "
      "float32, bfloat16, int32 or bool",
      USAGE_ERROR,
    ) from None
  if dtype.itemsize == 8 and dtype.kind in "fiuc" and not jax.config.read("jax_enable_x64"):
    raise CliError(
      f"--arg {text!r}: {name} needs 64-bit JAX (set JAX_ENABLE_X64=1), or use the 32-bit type",
      USAGE_ERROR,
    )
  try:  # e.g. object, str, datetime: NumPy dtypes no JAX array can have
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      jnp.zeros((0,), dtype)
  except TypeError as e:
    raise CliError(
      f"--arg {text!r}: JAX arrays cannot have dtype {name!r} ({first_line(e)}); use a "
      "number or bool dtype such as float32, bfloat16, int32 or bool",
      USAGE_ERROR,
    ) from None
  pieces = [d.strip() for d in dims.split(",")] if dims.strip() else []
  if any(not p for p in pieces):
    raise CliError(f"--arg {text!r}: empty dimension; write e.g. 'float32[1,100]'", USAGE_ERROR)
  shape = tuple(int(p) for p in pieces)
  # JAX sizes arrays with int64: beyond it, jax fails with an unreadable binding error.
  if any(d > _MAX_ARRAY_SIZE for d in shape) or math.prod(shape) > _MAX_ARRAY_SIZE:
    raise CliError(
      f"--arg {text!r}: {math.prod(shape)} elements, more than a JAX array can hold "
      f"({_MAX_ARRAY_SIZE}, the int64 limit); give the shape a sample input of the model has, "
      "e.g. 'float32[1,100]'",
      USAGE_ERROR,
    )
  return ArgSpec(dtype.name, shape)


def sample_inputs(specs: tp.Sequence[ArgSpec], seed: int) -> list[jax.Array]:
  """Arrays for the specs: floats standard normal (seeded), integers zeros, bools True.

  Examples:
    >>> [x.shape for x in sample_inputs([ArgSpec('int32', (2, 3))], seed=0)]
    [(2, 3)]
  """
  key = jax.random.key(seed)
  values = []
  for spec in specs:
    key, sub = jax.random.split(key)
    dtype = jnp.dtype(spec.dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
      values.append(jax.random.normal(sub, spec.shape, dtype))
    elif dtype == jnp.bool_:
      values.append(jnp.ones(spec.shape, dtype))
    else:
      values.append(jnp.zeros(spec.shape, dtype))
  return values


def describe(specs: tp.Sequence[ArgSpec]) -> str:
  """The inputs as a message names them: `--arg float32[1,4] --arg bool[]`, or `no inputs`."""
  return " ".join(f"--arg {s}" for s in specs) or "no inputs"
