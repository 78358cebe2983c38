"""Drafting a Linen `setup` that keeps a constant array as an attribute (HF's causal masks,
sinusoidal position tables, `position_ids`), on every supported flax.

flax 0.10's NNX keeps no array attribute ("Arrays leaves are not supported" when the port is
split), so there the draft recomputes such an attribute in a read-only property; flax 0.11 and
later keep the attribute, and the draft keeps the assignment. What a property cannot recompute
(an rng draw, a param) is a TODO naming the attribute and the fix. The reference is Linen's own
`apply`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import typing as tp

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge import _compat

pytest.importorskip("libcst")

# Where the installed flax refuses array attributes, the draft writes properties.
PROPERTIES = not _compat.nnx_keeps_array_attributes()


def sinusoidal_positions(n_pos: int, dim: int) -> jax.Array:
  """A sinusoidal position table built with numpy, as HF's Pegasus and RoFormer build theirs."""
  inv = 1.0 / (10000 ** (np.arange(0, dim, 2) / dim))
  angles = np.arange(n_pos)[:, None] * inv[None, :]
  return jnp.asarray(np.concatenate([np.sin(angles), np.cos(angles)], axis=-1), jnp.float32)


class ConstantArrays(nn.Module):
  """HF's idioms: a causal mask made from a field under an `if` (GPT-2), a position table made
  from setup locals (Pegasus), and `position_ids` from `jnp.arange` (CLIP)."""

  features: int = 8
  max_length: int = 16
  causal: bool = True

  def setup(self):
    self.proj = nn.Dense(self.features)
    embed_dim = self.features
    scale = 1.0 / embed_dim
    if self.causal:
      self.causal_mask = nn.make_causal_mask(
        jnp.ones((1, self.max_length), dtype="bool"), dtype="bool"
      )
    self.positions = sinusoidal_positions(self.max_length, embed_dim) * scale
    self.position_ids = jnp.expand_dims(jnp.arange(self.max_length, dtype="i4"), axis=0)

  def __call__(self, x):
    length = x.shape[1]
    h = self.proj(x) + self.positions[self.position_ids[0, :length]]
    scores = h @ h.swapaxes(-1, -2)
    if self.causal:
      scores = jnp.where(self.causal_mask[0, 0, :length, :length], scores, -1e9)
    return jax.nn.softmax(scores) @ h


@dataclasses.dataclass(frozen=True)
class MaskConfig:
  max_position_embeddings: int = 16


class ConfiguredMask(nn.Module):
  """HF's Llama: setup binds the local `config` (the name of the field it reads) first."""

  config: MaskConfig = MaskConfig()

  def setup(self):
    config = self.config
    self.causal_mask = nn.make_causal_mask(
      jnp.ones((1, config.max_position_embeddings), dtype="bool"), dtype="bool"
    )

  def __call__(self, x):
    length = x.shape[1]
    scores = jnp.where(self.causal_mask[0, 0, :length, :length], x @ x.swapaxes(-1, -2), 0.0)
    return scores @ x


class WindowedMask(nn.Module):
  """HF's GPT-Neo: the mask bound, then bound again from itself under a setting (a local
  attention window)."""

  max_length: int = 16
  attention_type: str = "local"
  window_size: int = 3

  def setup(self):
    self.causal_mask = nn.make_causal_mask(
      jnp.ones((1, self.max_length), dtype="bool"), dtype="bool"
    )
    if self.attention_type == "local":
      self.causal_mask = self.causal_mask ^ jnp.tril(self.causal_mask, -self.window_size)

  def __call__(self, x):
    length = x.shape[1]
    scores = jnp.where(self.causal_mask[0, 0, :length, :length], x @ x.swapaxes(-1, -2), 0.0)
    return scores @ x


class ReboundWithLocals(nn.Module):
  """Bound three times, in both branches of an `if`, from locals bound before and inside."""

  features: int = 8
  shifted: bool = True

  def setup(self):
    base = jnp.arange(self.features)
    self.ids = base * 2
    if self.shifted:
      offset = 3
      self.ids = self.ids + offset
    else:
      self.ids = self.ids - 1

  def __call__(self, x):
    return x + self.ids[: x.shape[-1]]


class RandomConstant(nn.Module):
  """A setup array drawn from an rng stream: no property can draw the same numbers."""

  features: int = 8

  def setup(self):
    self.offsets = jax.random.normal(self.make_rng("params"), (self.features,))

  def __call__(self, x):
    return x + self.offsets


class ScaledParam(nn.Module):
  """Dinov2's layer scale: a param times a constant kept as the attribute (a param, not a
  constant: never a property that would lose the param)."""

  features: int = 8

  def setup(self):
    self.lambda1 = 0.5 * self.param("lambda1", nn.initializers.ones, (self.features,))

  def __call__(self, x):
    return self.lambda1 * x


class ScaledParamTwice(nn.Module):
  """Dinov2's own lines: the attribute bound twice, from a param."""

  features: int = 8

  def setup(self):
    self.lambda1 = 0.5 * self.param("lambda1", nn.initializers.ones, (self.features,))
    self.lambda1 = self.lambda1 * 2.0

  def __call__(self, x):
    return self.lambda1 * x


class BranchLocal(nn.Module):
  """A constant array made from a local that setup binds in a branch."""

  features: int = 8
  long: bool = False

  def setup(self):
    if self.long:
      length = 2 * self.features
    else:
      length = self.features
    self.ids = jnp.arange(length)

  def __call__(self, x):
    return x + self.ids[: x.shape[-1]]


def _x() -> jax.Array:
  return jax.random.normal(jax.random.key(0), (2, 5, 8))


def _assigned(source: str, attr: str) -> bool:
  """Whether a line of the drafted code (not a comment) assigns `self.<attr>`."""
  return any(ln.strip().startswith(f"self.{attr} = ") for ln in source.splitlines())


def _imported(draft, tmp_path, name: str):
  """The drafted source, written and imported as a user would."""
  path = draft.write(tmp_path / f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize(
  ("module", "attrs"),
  [
    (ConstantArrays(), ("causal_mask", "positions", "position_ids")),
    (ConfiguredMask(), ("causal_mask",)),
    (WindowedMask(), ("causal_mask",)),
  ],
  ids=["field-and-locals", "config-local", "bound-again-under-an-if"],
)
def test_constant_array_attributes_draft_equal_to_linen(module, attrs):
  """Before: on flax 0.10 the port did not build (`Arrays leaves are not supported, at
  'causal_mask'`)."""
  x = _x()
  draft = lb.port.draft(module, x)
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  want = module.apply(variables, x)
  np.testing.assert_allclose(port(x), want, rtol=1e-5, atol=1e-5)
  for attr in attrs:
    assert _assigned(draft.source, attr) != PROPERTIES, draft.source
    assert (f"def {attr}(self)" in draft.source) == PROPERTIES, draft.source


def test_the_property_keeps_setups_branch(tmp_path):
  """The port of the class at `causal=False` (a configuration the draft did not trace) computes
  what Linen computes there, and has no mask, as Linen's module has none."""
  draft = lb.port.draft(ConstantArrays(), _x())
  assert draft.ok, draft.report()
  module = _imported(draft, tmp_path, "constant_arrays_nnx")
  x = jax.random.normal(jax.random.key(1), (3, 4, 8))
  linen = ConstantArrays(causal=False)
  variables = linen.init(jax.random.key(2), x)
  port = module.ConstantArrays(causal=False, rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  np.testing.assert_allclose(port(x), linen.apply(variables, x), rtol=1e-5, atol=1e-5)
  assert not hasattr(port, "causal_mask")
  causal = module.ConstantArrays(rngs=nnx.Rngs(0))
  assert causal.causal_mask.shape == (1, 1, 16, 16)


def test_an_attribute_bound_again_under_an_if_follows_the_setting(tmp_path):
  """GPT-Neo's windowed mask: at `attention_type="global"` (not traced) the port's mask is
  the plain causal one, as Linen's; at "local" it has the window (the window changes the
  output on the sample, so a property that dropped the second line would fail the check)."""
  draft = lb.port.draft(WindowedMask(), _x())
  assert draft.ok, draft.report()
  module = _imported(draft, tmp_path, "windowed_mask_nnx")
  x = jax.random.normal(jax.random.key(1), (3, 6, 8))
  for setting in ("global", "local"):
    linen = WindowedMask(attention_type=setting)
    variables = linen.init(jax.random.key(2), x)
    port = module.WindowedMask(attention_type=setting, rngs=nnx.Rngs(0))
    lb.checkpoint.linen_to_nnx(linen, variables, port, x)
    np.testing.assert_allclose(port(x), linen.apply(variables, x), rtol=1e-5, atol=1e-5)
  plain = WindowedMask(attention_type="global").apply({}, x)
  assert not np.allclose(plain, WindowedMask().apply({}, x))  # the window matters here


@pytest.mark.parametrize("shifted", [True, False])
def test_an_attribute_bound_in_both_branches_reads_the_locals_of_each(tmp_path, shifted):
  draft = lb.port.draft(ReboundWithLocals(), _x())
  assert draft.ok, draft.report()
  module = _imported(draft, tmp_path, f"rebound_locals_nnx_{shifted}")
  linen = ReboundWithLocals(shifted=shifted)
  port = module.ReboundWithLocals(shifted=shifted, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(port(_x()), linen.apply({}, _x()))


def _array_todos(draft, attr: str) -> list[lb.port.Todo]:
  return [t for t in draft.todos if f"self.{attr}" in t.reason]


@pytest.mark.parametrize(
  ("module", "attr", "what", "fix"),
  [
    (RandomConstant(), "offsets", "rng", "nnx.Variable"),
    (BranchLocal(), "ids", "length", "nnx.Variable"),
  ],
  ids=["rng", "branch-local"],
)
def test_what_a_property_cannot_recompute(module, attr, what, fix):
  """Where flax refuses array attributes, a TODO naming the attribute, what it reads and the
  fix (never a property, never a port that fails to build); elsewhere the draft is as before:
  the assignment kept, no TODO about it."""
  draft = lb.port.draft(module, _x())  # never a raw exception
  assert f"def {attr}(self)" not in draft.source, draft.source
  todos = _array_todos(draft, attr)
  if PROPERTIES:
    assert len(todos) == 1, draft.report()
    assert what in todos[0].reason and fix in todos[0].reason, todos[0].reason
    assert not _assigned(draft.source, attr), draft.source  # every binding is in the TODO
    assert not draft.ok
    assert "NotImplementedError" in tp.cast(lb.port.Check, draft.check).error
  else:
    assert todos == [], draft.report()
    assert _assigned(draft.source, attr), draft.source


@pytest.mark.parametrize("module", [ScaledParam(), ScaledParamTwice()], ids=["once", "twice"])
def test_a_param_setup_computes_an_attribute_from_is_no_constant_array(module):
  """Dinov2's layer scale is a kept Param and a property over it (`computed_params.py`) on
  every flax: no array attribute for flax 0.10 to refuse, no TODO about one."""
  draft = lb.port.draft(module, _x())
  assert draft.ok, draft.report()
  assert _array_todos(draft, "lambda1") == []
  assert "def lambda1_value(self)" in draft.source
