"""`loopbridge compare --plot FILE`: the error of each aligned call along the network, drawn.

matplotlib is optional (`pip install loopbridge[plot]`) and imported only here, when a plot
is asked for. The figure is built with `matplotlib.figure.Figure`, not `pyplot`, so no global
backend or figure state is touched.
"""

from __future__ import annotations

import math
import os
import typing as tp

if tp.TYPE_CHECKING:
  from matplotlib.figure import Figure

from .compare_report import OK, ParityReport

_MISSING = (
  "plotting a compare report needs matplotlib, which is not installed: "
  "run `pip install loopbridge[plot]` (or `pip install matplotlib`)"
)


def plot_report(report: ParityReport, path: str | os.PathLike[str]) -> Figure:
  """Draw the max abs error of each aligned call, in call order, to an image file.

  x: the aligned calls in reference call order (labelled with the reference paths when
  there are few enough to read); y: the max abs error, log scale (an exact match is drawn
  at the bottom edge, a call with no numeric output is left out). The first divergence is
  marked and named. The format follows the file's suffix (`.png`, `.svg`, `.pdf`, ...).

  Args:
    report: what `lb.compare` returned.
    path: the image file to write.

  Returns:
    The matplotlib `Figure` written (to show, or to restyle and save again).

  Raises:
    TypeError: `report` is not a `ParityReport`.
    ValueError: the suffix names no image format matplotlib writes.
    ImportError: matplotlib is not installed (`pip install loopbridge[plot]`).

  Examples:
    >>> import jax.numpy as jnp, flax.linen as nn, jax
    >>> import loopbridge as lb
    >>> from loopbridge._diagnostics.compare_plot import plot_report
    >>> x = jnp.ones((1, 2))
    >>> variables = nn.Dense(3).init(jax.random.key(0), x)
    >>> report = lb.compare((nn.Dense(3), variables), (nn.Dense(3), variables), x)
    >>> figure = plot_report(report, "report.png")  # doctest: +SKIP
  """
  if not isinstance(report, ParityReport):
    raise TypeError(
      f"plot_report takes the ParityReport lb.compare returns, not a {type(report).__name__}: "
      "report = lb.compare((linen_module, variables), port, *inputs); "
      "plot_report(report, 'errors.png')"
    )
  try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
  except ImportError as e:
    raise ImportError(_MISSING) from e
  figure = Figure(figsize=(max(6.0, min(24.0, 0.3 * len(report.pairs) + 3)), 4.5))
  canvas = FigureCanvasAgg(figure)
  suffix = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
  formats = canvas.get_supported_filetypes()
  if suffix not in formats:
    given = f".{suffix}" if suffix else "(none)"
    raise ValueError(
      f"plot_report cannot write {os.fspath(path)!r}: the suffix {given!r} names "
      f"no image format; use one of {', '.join('.' + f for f in sorted(formats))} "
      "(e.g. errors.png)"
    )
  errors = [p.max_abs_err for p in report.pairs]
  positive = [e for e in errors if e is not None and 0 < e < math.inf]
  # An exact match has no place on a log axis: drawn at a floor below every error shown.
  floor = min([*positive, 1e-6]) / 10
  ceiling = max([*positive, 1.0]) * 10
  axes = figure.add_subplot()
  for status_ok, color, label in ((True, "tab:green", "agrees"), (False, "tab:red", "differs")):
    xs, ys = [], []
    for i, (pair, error) in enumerate(zip(report.pairs, errors)):
      if error is None or (pair.status == OK) != status_ok:
        continue
      xs.append(i)
      ys.append(floor if error == 0 else min(error, ceiling))  # inf/NaN at the top edge
    if xs:
      axes.scatter(xs, ys, s=18, color=color, label=label, zorder=3)
  drawn = [floor if e == 0 else min(e, ceiling) for e in errors if e is not None]
  axes.plot([i for i, e in enumerate(errors) if e is not None], drawn, color="0.7", lw=1, zorder=2)
  axes.set_yscale("log")
  axes.set_ylim(floor / 2, ceiling)
  axes.set_xlabel("aligned module calls, in reference call order")
  axes.set_ylabel("max abs error (0 drawn at the bottom)")
  divergence = report.first_divergence
  if divergence is not None:
    first = next(i for i, p in enumerate(report.pairs) if p.status != OK)
    axes.axvline(first, color="tab:red", ls="--", lw=1)
    axes.annotate(
      f"first divergence: {divergence.reference_path or '(top)'} ~ "
      f"{divergence.candidate_path or '(top)'} ({divergence.kind})",
      xy=(first, 0.98),
      xycoords=("data", "axes fraction"),
      ha="left" if first < len(report.pairs) / 2 else "right",
      va="top",
      fontsize=8,
      color="tab:red",
    )
    axes.set_title("lb.compare: the port diverges")
  else:
    axes.set_title(f"lb.compare: all {len(report.pairs)} aligned calls agree")
  if len(report.pairs) <= 60:
    axes.set_xticks(range(len(report.pairs)))
    axes.set_xticklabels(
      [p.reference_path or "(top)" for p in report.pairs], rotation=90, fontsize=7
    )
  if axes.get_legend_handles_labels()[0]:
    axes.legend(loc="lower right", fontsize=8)
  # bbox_inches="tight" fits the rotated labels without tight_layout's warnings.
  figure.savefig(os.fspath(path), format=suffix, bbox_inches="tight")
  return figure
