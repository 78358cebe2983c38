"""The conversion's evidence runs compiled where it can, eagerly where it cannot.

Both models' evidence runs (the sample and the probes) go through `jax.jit`, so nothing but
their outputs and the recorded calls is materialized (an eager run holds copies the hand
path never makes: `benchmarks/bench_convert.py` measures them). A module holding a list or a
config object cannot be a jit static argument, and a Python branch on a value cannot be
traced: those run eagerly, and convert the same. References are Linen's own `apply` (its
`capture_intermediates` for what each module computed), never the converter.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb
from loopbridge._checkpoint import convert_evidence
from loopbridge._checkpoint.convert_align import flatten

from conftest import matmul_tolerance

D = 4
RTOL, ATOL = matmul_tolerance(1e-5, 1e-5)
TRACES: list[object] = []  # one entry per Python run of `Model.__call__`


def _trained_like(variables):
  """Variables that are not an init's (so no test passes by two equal inits)."""
  keys = iter(jax.random.split(jax.random.key(7), 100))
  return jax.tree.map(lambda a: a + jax.random.normal(next(keys), a.shape, a.dtype), variables)


@dataclasses.dataclass
class Config:
  """A config object as models carry them: a plain dataclass, so it cannot be hashed."""

  width: int


def _width(config: tp.Any) -> int:
  if isinstance(config, Config):
    return config.width
  return config[0]


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return nn.Dense(D)(x), None


class Split(nn.Module):
  """Returns a tuple (as attention with weights, or a ViT block, does)."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, name="a")(x), nn.Dense(D, name="b")(x)


class Model(nn.Module):
  config: tp.Any

  @nn.compact
  def __call__(self, x, train: bool = False):
    TRACES.append(None)
    x = nn.Dense(_width(self.config), name="inp")(x)
    stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
    x = stack(name="stack")(x, None)[0]
    a, b = Split(name="split")(x)
    return nn.Dense(D, name="out")(a * b if train else a + b)


def _captured(tree: tp.Mapping, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
  """Linen's `capture_intermediates` as {module path: its `__call__` output}."""
  found: dict[tuple[str, ...], object] = {}
  for key, value in tree.items():
    if key == "__call__":
      found[prefix] = value[0]
    else:
      found |= _captured(value, (*prefix, key))
  return found


@pytest.mark.parametrize(
  "config, compiled",
  [((D,), True), ([D], False), (Config(D), False)],
  ids=["tuple", "list", "config-object"],
)
def test_the_linen_run_is_compiled_where_the_module_can_be_hashed(config, compiled):
  module = Model(config)
  if not compiled:  # the case that cannot be a jit static argument
    with pytest.raises(TypeError):
      hash(module)
  x = jax.random.normal(jax.random.key(0), (2, 3, D))
  variables = _trained_like(module.init(jax.random.key(1), x))
  runs = 0  # Python runs of the model's body inside `linen_run`
  for seed in (2, 3, 4):  # the sample and two probes: same shapes, other values
    x = jax.random.normal(jax.random.key(seed), (2, 3, D))
    before = len(TRACES)
    out, records = convert_evidence.linen_run(module, flatten(variables), (x,), {"train": False})
    runs += len(TRACES) - before
    want, state = module.apply(
      variables, x, train=False, capture_intermediates=True, mutable=["intermediates"]
    )
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)
    captured = _captured(state["intermediates"])
    # Every module called outside the scan, as Linen captures it (the scan's body is not).
    assert set(records) == set(captured)
    for path, value in captured.items():
      for got, ref in zip(jax.tree.leaves(records[path].out), jax.tree.leaves(value), strict=True):
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL, err_msg=str(path))
      assert records[path].kwargs == ({"train": False} if path == () else {})
  # Compiled: traced once for the three inputs; eager: the Python body runs every time.
  assert runs == (1 if compiled else 3)


# --- whole conversions with what cannot be compiled -----------------------------------------


class Small(nn.Module):
  config: tp.Any

  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, name="out")(nn.relu(nn.Dense(_width(self.config), name="inp")(x)))


class SmallPort(nnx.Module):
  def __init__(self, config: tp.Any, rngs: nnx.Rngs):
    self.config = config  # unhashable too, where the Linen one is
    self.inp = nnx.Linear(D, _width(config), rngs=rngs)
    self.out = nnx.Linear(_width(config), D, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.relu(self.inp(x)))


@pytest.mark.parametrize("config", [[D, D], Config(D)], ids=["list", "config-object"])
def test_models_holding_unhashable_values_convert_both_ways(config):
  linen = Small(config)
  with pytest.raises(TypeError):
    hash(linen)
  x = jax.random.normal(jax.random.key(0), (2, D))
  variables = _trained_like(linen.init(jax.random.key(1), x))
  port = SmallPort(config, nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  fresh = jax.random.normal(jax.random.key(3), (2, D))
  np.testing.assert_allclose(port(fresh), linen.apply(variables, fresh), rtol=RTOL, atol=ATOL)
  back = lb.checkpoint.nnx_to_linen(port, Small(config), x)
  for got, ref in zip(jax.tree.leaves(back), jax.tree.leaves(variables), strict=True):
    np.testing.assert_array_equal(got, ref)


class Gated(nn.Module):
  """Reads a value in Python: runs eagerly, cannot be traced by `jax.jit`."""

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(D, name="dense")(x)
    return y if float(jnp.max(jnp.abs(x))) < 1e6 else jnp.zeros_like(y)


def test_a_linen_call_that_cannot_be_traced_runs_eagerly():
  x = jax.random.normal(jax.random.key(0), (2, D))
  variables = _trained_like(Gated().init(jax.random.key(1), x))
  with pytest.raises(jax.errors.ConcretizationTypeError):  # the case: jit refuses it
    jax.jit(Gated().apply)(variables, x)
  out, records = convert_evidence.linen_run(Gated(), flatten(variables), (x,))
  want, state = Gated().apply(variables, x, capture_intermediates=True, mutable=["intermediates"])
  np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)
  captured = _captured(state["intermediates"])
  assert set(records) == set(captured)
  for path, value in captured.items():
    np.testing.assert_allclose(records[path].out, value, rtol=RTOL, atol=ATOL)
