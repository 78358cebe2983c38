"""`lb.port.draft` of layers `setup` builds in a list comprehension over a tuple of widths
(`self.layers = [nn.Dense(size) for size in self.hidden_dims]`): each layer's input width is
the previous layer's output, which a comprehension cannot name. The class is read as the loop
that builds the same list, and the report still names the comprehension's line.

The reference is Linen's own `init` and `apply` at tuples of other lengths and input widths.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest
from symbolic_port_helpers import assert_equal_at, load

import loopbridge as lb
from loopbridge._port.plan.source import read_class

pytest.importorskip("libcst")

SOURCE = """
import flax.linen as nn


class MLP(nn.Module):
  hidden_dims: tuple

  def setup(self):
    self.layers = [nn.Dense(size + 0 * i) for i, size in enumerate(self.hidden_dims)]

  def __call__(self, x):
    for layer in self.layers:
      x = nn.relu(layer(x))
    return x


class Tower(nn.Module):
  widths: tuple
  depth: int = 2

  def setup(self):
    blocks = [nn.Dense(w) for w in self.widths]
    self.blocks = blocks
    self.same = [nn.Dense(3) for _ in range(self.depth)]

  def __call__(self, x):
    for block in self.blocks:
      x = nn.relu(block(x))
    return sum(layer(x) for layer in self.same)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("comprehension_loops"), "comprehension_models", SOURCE)


def _x(width: int) -> jax.Array:
  return jax.random.normal(jax.random.key(0), (2, width))


def _with_input(draft: lb.port.Draft, width: int) -> lb.port.Draft:
  return dataclasses.replace(draft, init_kwargs={**draft.init_kwargs, "x_features": width})


def test_the_class_reads_as_the_loop(models):
  src = read_class(models.MLP)
  assert "layers = []" in src.text
  assert "for i, size in enumerate(self.hidden_dims):" in src.text
  assert "[nn.Dense" not in src.text
  # Every line of the loop is the comprehension's line of the file.
  first = src.text.splitlines().index("    layers = []") + 1
  assert {src.line(first + k) for k in range(4)} == {src.line(first)}
  assert src.line(len(src.text.splitlines())) == src.first_line + 9  # the class's last line


@pytest.mark.parametrize(("dims", "width"), [((6, 5, 7), 4), ((3, 9), 11), ((8, 2, 5, 4), 6)])
def test_the_port_computes_linen_at_other_tuples(models, tmp_path, dims, width):
  draft = lb.port.draft(models.MLP((6, 5, 7)), _x(4))
  assert draft.ok, draft.report()
  assert not draft.todos
  lines = {ch.line for ch in draft.changes if "nnx.Linear" in ch.new}
  assert lines == {read_class(models.MLP).first_line + 4}, lines
  assert_equal_at(_with_input(draft, width), tmp_path, models.MLP(dims), _x(width))


def test_a_local_list_and_a_range_comprehension(models, tmp_path):
  # The comprehension over range is left as written (read by its index, as before).
  assert "self.same = [nn.Dense(3) for _ in range(self.depth)]" in read_class(models.Tower).text
  draft = lb.port.draft(models.Tower((6, 5)), _x(4))
  assert draft.ok, draft.report()
  other = models.Tower((3, 7, 2), depth=3)
  assert_equal_at(_with_input(draft, 9), tmp_path, other, _x(9))
