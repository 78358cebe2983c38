"""`lb.ParityReport`: what `lb.compare` found, as data (`to_dict`) and as a table (`str`)."""

from __future__ import annotations

import dataclasses
import math

from .compare_elementwise import SCALE_WORDS
from .compare_tolerance import ToleranceChoice

# Per-pair and per-leaf statuses, mildest first (a pair takes the worst of its leaves).
OK, DTYPE, VALUES, SHAPE, STRUCTURE = "ok", "dtype", "values", "shape", "structure"
SEVERITY = {OK: 0, DTYPE: 1, VALUES: 2, SHAPE: 3, STRUCTURE: 4}

# How a pair was aligned.
BY_MAPPING, BY_NAME, BY_ORDER, BY_POSITION = "mapping", "name", "order", "position"


@dataclasses.dataclass(frozen=True)
class LeafDiff:
  """One leaf of a call's output pytree, compared."""

  leaf: str  # the leaf's key path inside the output ('' for a single array)
  reference: str  # dtype[shape], e.g. 'float32[2,16]'
  candidate: str
  status: str  # ok | dtype | values | shape
  max_abs_err: float | None = None
  max_rel_err: float | None = None
  # The reference's robust scale a default atol is a fraction of (the 99th percentile of its
  # finite magnitudes, mask values left out), how many entries were matched as mask values
  # (infinities, sentinels such as finfo.min or -1e9 equal on both sides), and the absolute
  # atol the leaf was held to.
  scale: float | None = None
  masked: int = 0
  atol_used: float | None = None


@dataclasses.dataclass(frozen=True)
class CallPair:
  """A reference call and the candidate call it was aligned with, compared."""

  # '/'-joined module path, '' for the top level; a layer of a scanned stack (nn.scan,
  # nnx.scan, a vmap) is written stack[layer]/rest, as `layers[2]/Dense_0`.
  reference_path: str
  candidate_path: str
  reference_call: int  # position in the reference's call order, from 0
  candidate_call: int
  aligned_by: str  # mapping | name | order | position
  status: str  # ok | dtype | values | shape | structure
  max_abs_err: float | None
  max_rel_err: float | None
  leaves: tuple[LeafDiff, ...]
  note: str = ""  # for a structure mismatch: how the output trees differ
  # The layer stack each call belongs to ('' for none: an nn.scan, nnx.scan, vmap, a list of
  # layers or Linen layers_0, layers_1, ...) and its layer in it.
  reference_stack: str = ""
  reference_layer: int | None = None
  candidate_stack: str = ""
  candidate_layer: int | None = None

  @property
  def output(self) -> str:
    """The reference output, as `dtype[shape]` for one array or a count of leaves."""
    if len(self.leaves) == 1:
      return self.leaves[0].reference
    return f"{len(self.leaves)} leaves" if self.leaves else "-"

  @property
  def worst_leaf(self) -> LeafDiff | None:
    """The first leaf with the pair's status (None when the pair is ok or has no leaves)."""
    return next((d for d in self.leaves if d.status == self.status and d.status != OK), None)


@dataclasses.dataclass(frozen=True)
class Divergence:
  """The first reference call (in call order) whose aligned candidate output differs."""

  reference_path: str
  candidate_path: str
  kind: str  # values | dtype | shape | structure
  max_abs_err: float | None
  max_rel_err: float | None
  leaf: str  # the first differing leaf of the output ('' for a single array)
  reference: str  # dtype[shape] of that leaf on each side
  candidate: str
  reference_stack: str = ""  # the layer stack of each call ('' for none) and the layer in it
  reference_layer: int | None = None
  candidate_stack: str = ""
  candidate_layer: int | None = None
  # The differing leaf's tolerance: the absolute atol it was held to, the reference's robust
  # scale a default atol is a fraction of, and the entries matched as mask values.
  atol: float | None = None
  scale: float | None = None
  masked: int = 0


@dataclasses.dataclass(frozen=True)
class UnmatchedCall:
  """A call that has no counterpart on the other side."""

  path: str
  call: int
  output: str


@dataclasses.dataclass(frozen=True)
class ParityReport:
  """Where a candidate model's module outputs agree with a reference model's, call by call.

  `str(report)` is a table of every aligned pair in reference call order with the first
  divergence marked; `report.to_dict()` is the same as JSON-ready data.

  Attributes:
    pairs: every aligned pair, in reference call order (`CallPair`: paths, how they were
      aligned, status, max abs/rel errors, per-leaf details).
    unmatched_reference: reference calls with no candidate counterpart (`UnmatchedCall`).
    unmatched_candidate: candidate calls with no reference counterpart.
    not_recorded_reference: paths of reference calls made inside a JAX transform that takes
      no host callback (their values never reach the host); their enclosing module's output
      is compared instead.
    not_recorded_candidate: the same for the candidate.
    rtol: the relative tolerance given, or None for the per-dtype default.
    atol: the absolute tolerance given, or None for the per-dtype default.
    default_tolerance: the default used where `rtol`/`atol` is None, and why (a
      `ToleranceChoice`: backend, `jax_default_matmul_precision`, what float32 matmuls ran
      in, the float32 rtol/atol, a reason); None in reports built by hand.

  Examples:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from flax import nnx
    >>> import loopbridge as lb
    >>> linen = nn.Dense(3)
    >>> x = jnp.ones((1, 2))
    >>> variables = linen.init(jax.random.key(0), x)
    >>> port = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    >>> _ = lb.layers.load_params([variables['params']], [port])  # load Linen params by path
    >>> report = lb.compare((linen, variables), port, x)
    >>> report.ok, report.first_divergence
    (True, None)
  """

  pairs: tuple[CallPair, ...]
  unmatched_reference: tuple[UnmatchedCall, ...]
  unmatched_candidate: tuple[UnmatchedCall, ...]
  not_recorded_reference: tuple[str, ...]
  not_recorded_candidate: tuple[str, ...]
  rtol: float | None
  atol: float | None
  default_tolerance: ToleranceChoice | None = None

  @property
  def ok(self) -> bool:
    """True when every aligned pair agrees (values within tolerance, same shapes and dtypes)."""
    return all(p.status == OK for p in self.pairs)

  @property
  def first_divergence(self) -> Divergence | None:
    """The first reference call in call order whose candidate output differs, or None."""
    for pair in self.pairs:
      if pair.status == OK:
        continue
      leaf = pair.worst_leaf
      return Divergence(
        reference_path=pair.reference_path,
        candidate_path=pair.candidate_path,
        kind=pair.status,
        max_abs_err=pair.max_abs_err,
        max_rel_err=pair.max_rel_err,
        leaf=leaf.leaf if leaf else "",
        reference=leaf.reference if leaf else pair.note,
        candidate=leaf.candidate if leaf else "",
        reference_stack=pair.reference_stack,
        reference_layer=pair.reference_layer,
        candidate_stack=pair.candidate_stack,
        candidate_layer=pair.candidate_layer,
        atol=leaf.atol_used if leaf else None,
        scale=leaf.scale if leaf else None,
        masked=leaf.masked if leaf else 0,
      )
    return None

  @property
  def mismatches(self) -> tuple[CallPair, ...]:
    """Pairs whose outputs differ in shape, dtype or tree structure (not only in values)."""
    return tuple(
      p
      for p in self.pairs
      if p.status == STRUCTURE or any(d.reference != d.candidate for d in p.leaves)
    )

  def to_dict(self) -> dict[str, object]:
    """Everything in the report as JSON-ready data (non-finite errors as strings)."""
    divergence = self.first_divergence
    data: dict[str, object] = {
      "ok": self.ok,
      "rtol": self.rtol,
      "atol": self.atol,
      "default_tolerance": (
        None if self.default_tolerance is None else dataclasses.asdict(self.default_tolerance)
      ),
      "first_divergence": None if divergence is None else dataclasses.asdict(divergence),
      "pairs": [dataclasses.asdict(p) for p in self.pairs],
      "unmatched_reference": [dataclasses.asdict(c) for c in self.unmatched_reference],
      "unmatched_candidate": [dataclasses.asdict(c) for c in self.unmatched_candidate],
      "not_recorded_reference": list(self.not_recorded_reference),
      "not_recorded_candidate": list(self.not_recorded_candidate),
    }
    return {key: _json_ready(value) for key, value in data.items()}

  def __str__(self) -> str:
    return _render(self)


def _json_ready(value: object) -> object:
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  if isinstance(value, dict):
    return {k: _json_ready(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_ready(v) for v in value]
  return value


def _default_text(choice: ToleranceChoice | None) -> str:
  if choice is None:
    return "float32: rtol 1e-05, atol 1e-05"
  return f"{choice.reason}"


def _scale_text(divergence: Divergence) -> str:
  """How the differing leaf's atol came about: the scale it is a fraction of, the masks."""
  masks = (
    f", {divergence.masked} mask value(s) matched exactly and left out" if divergence.masked else ""
  )
  if divergence.scale is None:
    return masks
  return f" (the leaf's scale {_err(divergence.scale)}{masks})"


def _err(value: float | None) -> str:
  if value is None:
    return "-"
  return "0" if value == 0 else f"{value:.2e}"


def shown_path(path: str) -> str:
  return path if path else "(top)"


_KIND_TEXT = {
  VALUES: "values differ",
  DTYPE: "dtypes differ (values agree)",
  SHAPE: "output shapes differ",
  STRUCTURE: "output trees differ",
}


def _render(report: ParityReport) -> str:
  from .sow_sites import format_table

  out = []
  divergence = report.first_divergence
  n = len(report.pairs)
  if divergence is None:
    out.append(f"lb.compare: OK, all {n} aligned module calls agree")
  else:
    where = (
      f"reference {shown_path(divergence.reference_path)} ~ candidate "
      f"{shown_path(divergence.candidate_path)}"
    )
    leaf = f" at leaf {divergence.leaf}" if divergence.leaf else ""
    detail = ""
    if divergence.kind in (VALUES, DTYPE):
      detail = (
        f", max abs err {_err(divergence.max_abs_err)}, max rel err {_err(divergence.max_rel_err)}"
      )
      if divergence.kind == VALUES and divergence.atol is not None:
        detail += f"; atol {_err(divergence.atol)}" + _scale_text(divergence)
    if divergence.kind in (SHAPE, DTYPE):
      detail += f" ({divergence.reference} vs {divergence.candidate})"
    if divergence.kind == STRUCTURE:
      detail += f" ({divergence.reference})"
    out.append(
      f"lb.compare: DIVERGES, first at {where}: {_KIND_TEXT[divergence.kind]}{leaf}{detail}"
    )
    layers = [
      f"layer {layer} of the {side}'s stack {shown_path(stack)}"
      for side, stack, layer in (
        ("reference", divergence.reference_stack, divergence.reference_layer),
        ("candidate", divergence.candidate_stack, divergence.candidate_layer),
      )
      if layer is not None
    ]
    if layers:
      out.append(f"in a layer stack: {'; '.join(layers)}")
  if report.atol == math.inf:
    out.append(
      "tolerance: atol inf, so values are not compared: only the module structure, output "
      "shapes and dtypes (the errors below are shown for information)"
    )
  elif report.rtol is None and report.atol is None:
    out.append(
      "tolerance: |candidate - reference| <= atol * scale + rtol * |reference| at every "
      f"entry, scale being {SCALE_WORDS}; per dtype "
      f"({_default_text(report.default_tolerance)}; bfloat16: 1e-02; integers exact)"
    )
  else:
    out.append(
      f"tolerance: |candidate - reference| <= atol"
      f"{' * scale' if report.atol is None else ''} + rtol * |reference|, rtol "
      f"{report.rtol if report.rtol is not None else 'per dtype'}, atol "
      f"{report.atol if report.atol is not None else 'per dtype'}"
      + (
        f" (per dtype: {_default_text(report.default_tolerance)})"
        if report.rtol is None or report.atol is None
        else ""
      )
    )
  rows = []
  first_marked = False
  for pair in report.pairs:
    mark = ""
    status = pair.status.upper() if pair.status != OK else OK
    if pair.status != OK:
      leaf = pair.worst_leaf
      if leaf is not None and leaf.leaf:
        status += f" at {leaf.leaf}"
      if not first_marked:
        mark, first_marked = ">>", True
        status += "  <- first divergence"
    rows.append(
      (
        mark,
        str(pair.reference_call),
        shown_path(pair.reference_path),
        shown_path(pair.candidate_path),
        pair.aligned_by,
        pair.output,
        _err(pair.max_abs_err),
        _err(pair.max_rel_err),
        status,
      )
    )
  out.append("")
  out.append(
    format_table(
      (
        "",
        "#",
        "reference",
        "candidate",
        "aligned by",
        "output",
        "max abs err",
        "max rel err",
        "status",
      ),
      rows,
      indent="",
    )
  )
  mismatches = report.mismatches
  if mismatches:
    out.append("")
    out.append("shape/dtype mismatches:")
    for pair in mismatches:
      if pair.status == STRUCTURE:
        out.append(
          f"  {shown_path(pair.reference_path)} ~ {shown_path(pair.candidate_path)}: {pair.note}"
        )
        continue
      for leaf in pair.leaves:
        if leaf.reference != leaf.candidate:
          at = f" {leaf.leaf}" if leaf.leaf else ""
          out.append(
            f"  {shown_path(pair.reference_path)}{at}: {leaf.reference} vs "
            f"{shown_path(pair.candidate_path)}{at}: {leaf.candidate}"
          )
  for title, calls in (
    ("reference calls with no candidate counterpart", report.unmatched_reference),
    ("candidate calls with no reference counterpart", report.unmatched_candidate),
  ):
    if calls:
      out.append("")
      out.append(f"{title}:")
      out.extend(f"  #{c.call} {shown_path(c.path)}  {c.output}" for c in calls)
  for side, paths in (
    ("reference", report.not_recorded_reference),
    ("candidate", report.not_recorded_candidate),
  ):
    if paths:
      unique = list(dict.fromkeys(paths))
      out.append("")
      out.append(
        f"not recorded in the {side} (called inside a JAX transform that takes no host "
        "callback; compared through the enclosing module): "
        + ", ".join(shown_path(p) for p in unique)
      )
  if divergence is not None and divergence.kind == VALUES:
    out.append("")
    out.append(
      f"Every aligned call before it agrees: look at {shown_path(divergence.candidate_path)}"
      " and at what runs between the previous call and it (activations, residuals, "
      "parameters loaded into it)."
    )
  if report.unmatched_reference or report.unmatched_candidate:
    out.append("")
    out.append(
      "Unmatched calls are compared only through the modules around them; to pair "
      "them, pass mapping={reference_path: candidate_path}."
    )
  return "\n".join(out)
