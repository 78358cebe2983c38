"""`plot_report` (`loopbridge compare --plot`): the drawn points are the report's errors in call
order, the first divergence (a planted bug whose module the test knows) is marked; clear errors
for a wrong report, an unknown image suffix and a missing matplotlib."""

from __future__ import annotations

import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge._diagnostics.compare_plot import plot_report


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(8, name="Dense_0")(x))
    h = nn.Dense(8, name="Dense_1")(h)
    return nn.Dense(3, name="Dense_2")(h)


class Port(nnx.Module):
  def __init__(self, rngs, act=nnx.relu):
    self.Dense_0 = nnx.Linear(4, 8, rngs=rngs)
    self.Dense_1 = nnx.Linear(8, 8, rngs=rngs)
    self.Dense_2 = nnx.Linear(8, 3, rngs=rngs)
    self.act = act

  def __call__(self, x):
    return self.Dense_2(self.Dense_1(self.act(self.Dense_0(x))))


def report_for(act):
  x = jax.random.normal(jax.random.key(1), (2, 4))
  variables = MLP().init(jax.random.key(0), x)
  port = Port(nnx.Rngs(0), act=act)
  lb.layers.load_params([variables["params"]], [port])
  return lb.compare((MLP(), variables), port, x)


def drawn_points(figure):
  axes = figure.axes[0]
  points = {}
  for collection in axes.collections:
    for x, y in collection.get_offsets():
      points[round(float(x))] = float(y)
  return axes, points


def test_points_are_the_errors_and_the_first_divergence_is_marked(tmp_path):
  pytest.importorskip("matplotlib")
  report = report_for(nnx.gelu)  # planted bug: the activation after Dense_0, seen at Dense_1
  order = [p.reference_path for p in report.pairs]
  assert order == ["Dense_0", "Dense_1", "Dense_2", ""]
  path = tmp_path / "errors.png"
  figure = plot_report(report, path)
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  axes, points = drawn_points(figure)
  assert axes.get_yscale() == "log"
  errors = [p.max_abs_err for p in report.pairs]
  assert None not in errors
  errors = [e for e in errors if e is not None]  # for the type checker: checked just above
  assert errors[0] == 0 and all(e > 1e-3 for e in errors[1:])  # Dense_0 agrees exactly
  bottom = axes.get_ylim()[0]
  assert points[0] < min(errors[1:]) and points[0] > bottom  # an exact match at the floor
  for i in (1, 2, 3):
    np.testing.assert_allclose(points[i], errors[i], rtol=1e-6)
  marks = [line.get_xdata()[0] for line in axes.lines if line.get_linestyle() == "--"]
  assert marks == [1]  # Dense_1, where the gelu first shows
  assert any("first divergence: Dense_1 ~ Dense_1" in t.get_text() for t in axes.texts)


def test_agreeing_report_is_drawn_without_a_mark(tmp_path):
  pytest.importorskip("matplotlib")
  report = report_for(nnx.relu)
  assert report.ok
  figure = plot_report(report, tmp_path / "errors.svg")
  assert (tmp_path / "errors.svg").read_text().lstrip().startswith("<?xml")
  axes, _ = drawn_points(figure)
  assert not [line for line in axes.lines if line.get_linestyle() == "--"]
  assert "agree" in axes.get_title()


def test_bad_inputs(tmp_path, monkeypatch):
  report = report_for(nnx.relu)
  with pytest.raises(TypeError, match=r"takes the ParityReport lb.compare returns, not a dict"):
    plot_report(report.to_dict(), tmp_path / "e.png")  # pyright: ignore[reportArgumentType]
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
  monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
  monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
  with pytest.raises(ImportError, match=r"needs matplotlib.*pip install loopbridge\[plot\]"):
    plot_report(report, tmp_path / "e.png")


def test_unknown_image_suffix(tmp_path):
  pytest.importorskip("matplotlib")
  with pytest.raises(ValueError, match=r"suffix '\.txt' names no image format; use one of .*png"):
    plot_report(report_for(nnx.relu), tmp_path / "e.txt")
  assert not (tmp_path / "e.txt").exists()
