"""Helpers of the symbolic-width tests: a Linen source written to a file and imported (the
drafter reads a class's source), and a draft's port checked against Linen's own `apply` at
another configuration than the one drafted."""

from __future__ import annotations

import importlib
import sys
import textwrap
import typing as tp

import jax
import numpy as np
from flax import nnx

import loopbridge as lb

from conftest import matmul_tolerance

RTOL, ATOL = matmul_tolerance(1e-5, 1e-5)


def load(directory: tp.Any, name: str, source: str) -> tp.Any:
  path = directory / f"{name}.py"
  path.write_text(textwrap.dedent(source))
  spec = importlib.util.spec_from_file_location(name, path)
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def port_error_at(draft: lb.port.Draft, directory: tp.Any, other: tp.Any, x: jax.Array) -> float:
  """The largest difference between Linen's `apply` of `other` (a fresh init) and the draft's
  port built with `other`'s fields and holding those variables (the draft's added arguments,
  as input widths, keep their values: `x` keeps the sample's shape)."""
  name = f"{draft.root.lower()}_port_{abs(hash(draft.source))}"
  module = load(directory, name, draft.source)
  kwargs = {k: getattr(other, k, v) for k, v in draft.init_kwargs.items()}
  port = getattr(module, draft.root)(**kwargs, rngs=nnx.Rngs(0))
  variables = other.init(jax.random.key(1), x)
  lb.checkpoint.linen_to_nnx(other, variables, port, x)
  x2 = jax.random.normal(jax.random.key(7), (3, *x.shape[1:]))
  want, got = other.apply(variables, x2), port(x2)
  return float(np.max(np.abs(np.asarray(want, np.float64) - np.asarray(got, np.float64))))


def assert_equal_at(draft: lb.port.Draft, directory: tp.Any, other: tp.Any, x: jax.Array) -> None:
  err = port_error_at(draft, directory, other, x)
  assert err <= ATOL + 1e-4, (err, draft.source)
