"""`lb.port.draft` of a block that builds a norm of its input's width only behind a flag
(gemma's `Block`: `if self.use_post_attn_norm`), where Linen ties that width to a setting (the
block adds its input to a layer `embed_dim` wide). The branch configuration traces the norm at
the sample's sizes only, so matching values could not tell `embed_dim` from the sample's 8: the
symbolic trace is made again at the branch, and the tied check runs there too.

The reference is Linen's own `init` and `apply` at widths and flags the draft never saw.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest
from symbolic_port_helpers import assert_equal_at, load

import loopbridge as lb
from loopbridge._port.check import tied_sizes

pytest.importorskip("libcst")

SOURCE = """
import flax.linen as nn
import jax.numpy as jnp


class Norm(nn.Module):
  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.zeros_init(), (x.shape[-1],))
    return x * (1 + scale) / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


class Block(nn.Module):
  embed_dim: int
  hidden_dim: int
  use_post_norm: bool

  def setup(self):
    self.pre = Norm()
    self.up = nn.Dense(self.hidden_dim)
    self.down = nn.Dense(self.embed_dim)
    self.post = None
    if self.use_post_norm:
      self.post = Norm()

  def __call__(self, x):
    h = self.down(nn.gelu(self.up(self.pre(x))))
    if self.post is not None:
      h = self.post(h)
    return x + h
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("branch_tied"), "branch_tied_models", SOURCE)


def _x(width: int) -> jax.Array:
  return jax.random.normal(jax.random.key(0), (2, 3, width))


@pytest.fixture(scope="module")
def draft(models):
  return lb.port.draft(models.Block(8, 12, False), _x(8))


def test_the_branch_only_norm_reads_the_setting(draft):
  assert draft.ok, draft.report()
  assert "self.post = Norm(scale_shape=(self.embed_dim,)" in draft.source
  assert "(8,)" not in draft.source
  assert any("at use_post_norm=True" in c for c in draft.check.checked), draft.check.checked


@pytest.mark.parametrize(("embed", "hidden"), [(16, 12), (6, 20)])
def test_the_port_computes_linen_with_the_flag_on(models, draft, tmp_path, embed, hidden):
  other = models.Block(embed, hidden, True)
  assert_equal_at(draft, tmp_path, other, _x(embed))


def test_the_tied_check_at_the_branch_refuses_the_samples_number(models, draft):
  """The port with the sample's 8 written for the norm's width passes every check at the
  sample's configuration and at the branch's sample sizes; the tied check at the branch
  fails it, naming the configuration."""
  wrong = draft.source.replace(
    "self.post = Norm(scale_shape=(self.embed_dim,)", "self.post = Norm(scale_shape=(8,)"
  )
  assert wrong != draft.source
  result = dataclasses.replace(draft, source=wrong)
  verdict = tied_sizes.at_tied_sizes(result, dataclasses.replace(draft.check, equal=True))
  assert not verdict.equal
  assert any("at use_post_norm=True" in c for c in verdict.checked), verdict.checked


def test_a_branch_only_width_matched_by_value_is_named(models, monkeypatch):
  """Without the symbolic trace at the branch, the norm's width is matched by value: the
  draft names it among its literals, with the sample's number, and is not `ok`."""
  import loopbridge._port.draft as draft_module

  monkeypatch.setattr(draft_module, "at_branches", lambda view, *args: (view, []))
  found = lb.port.draft(models.Block(8, 12, False), _x(8))
  assert [(b.hint, b.expression) for b in found.literals] == [("post_scale_shape", "(8,)")]
  assert not found.ok
