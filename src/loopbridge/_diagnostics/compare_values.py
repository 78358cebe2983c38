"""Comparing two recorded calls of `lb.compare`: their outputs, leaf by leaf, within tolerance.

A leaf agrees when `|candidate - reference| <= atol + rtol * |reference|` everywhere (NaN in
the same places counts as equal); the tolerances default per dtype, backend and check precision
(`compare_tolerance.default_tolerance`), the default atol relative to the reference's scale.
"""

from __future__ import annotations

import math
import typing as tp

import jax
import numpy as np

from .compare_capture import Call
from .compare_report import DTYPE, OK, SEVERITY, SHAPE, STRUCTURE, VALUES, CallPair, LeafDiff
from .compare_tolerance import ToleranceChoice, is_float


def as_numpy(leaf: object) -> np.ndarray:
  dtype = getattr(leaf, "dtype", None)
  if dtype is not None and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(tp.cast(jax.Array, leaf))
  return np.asarray(leaf)


def _desc(array: np.ndarray) -> str:
  return f"{array.dtype}[{','.join(map(str, array.shape))}]"


def numeric(array: np.ndarray) -> bool:
  return (
    array.dtype.kind in "biu"
    or is_float(array.dtype)
    or (array.dtype.name.startswith(("int", "uint")))
  )


def _leaf_diff(
  leaf: str,
  ref: object,
  cand: object,
  rtol: float | None,
  atol: float | None,
  default: ToleranceChoice,
) -> LeafDiff:
  a, b = as_numpy(ref), as_numpy(cand)
  da, db = _desc(a), _desc(b)
  if a.shape != b.shape:
    return LeafDiff(leaf, da, db, SHAPE)
  if not (numeric(a) and numeric(b)):
    same = bool(np.all(a == b))
    return LeafDiff(
      leaf, da, db, OK if same and a.dtype == b.dtype else (DTYPE if same else VALUES)
    )
  # The default atol is a fraction of the reference's scale; a given one is absolute.
  rt_default, at_default = default.for_values(a, b.dtype)
  rt = rtol if rtol is not None else rt_default
  at = atol if atol is not None else at_default
  wide = np.complex128 if "c" in (a.dtype.kind, b.dtype.kind) else np.float64
  x, y = a.astype(wide), b.astype(wide)
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    same = (x == y) | (np.isnan(x) & np.isnan(y))  # equal infinities and NaN where NaN
    diff = np.where(same, 0.0, np.abs(y - x))
    diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
    scale = np.abs(x)
    rel = np.where(
      scale > 0, diff / np.where(scale > 0, scale, 1.0), np.where(diff > 0, np.inf, 0.0)
    )
    # `same` first: NaN in the same places is equal, though NaN fails every `<=`. An infinite
    # atol compares no values at all (structure, shapes and dtypes only).
    within = at == math.inf or bool(np.all(same | (diff <= at + rt * scale)))
  max_abs = float(diff.max()) if diff.size else 0.0
  max_rel = float(rel.max()) if rel.size else 0.0
  if not within:
    status = VALUES
  else:
    status = OK if a.dtype == b.dtype else DTYPE
  return LeafDiff(leaf, da, db, status, max_abs, max_rel)


def compare_pair(
  ref: Call,
  cand: Call,
  aligned_by: str,
  rtol: float | None,
  atol: float | None,
  default: ToleranceChoice,
) -> CallPair:
  """Compare one aligned pair's outputs leaf by leaf; `default` where no rtol/atol is given."""

  def pair(status: str, leaves: tuple[LeafDiff, ...], note: str = "") -> CallPair:
    errors_abs = [d.max_abs_err for d in leaves if d.max_abs_err is not None]
    errors_rel = [d.max_rel_err for d in leaves if d.max_rel_err is not None]
    return CallPair(
      reference_path=ref.shown,
      candidate_path=cand.shown,
      reference_call=ref.index,
      candidate_call=cand.index,
      aligned_by=aligned_by,
      status=status,
      max_abs_err=max(errors_abs, default=None),
      max_rel_err=max(errors_rel, default=None),
      leaves=leaves,
      note=note,
      reference_stack=ref.stack,
      reference_layer=ref.layer,
      candidate_stack=cand.stack,
      candidate_layer=cand.layer,
    )

  if len(ref.leaves) != len(cand.leaves):
    return pair(
      STRUCTURE,
      (),
      f"the reference returns {len(ref.leaves)} array(s), the candidate "
      f"{len(cand.leaves)}: {tree_text(ref.output)} vs {tree_text(cand.output)}",
    )
  leaves = tuple(
    _leaf_diff(name, a, b, rtol, atol, default)
    for (name, a), (_, b) in zip(ref.leaves, cand.leaves)
  )
  return pair(max((d.status for d in leaves), key=SEVERITY.__getitem__, default=OK), leaves)


def tree_text(tree: object, limit: int = 120) -> str:
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  text = (
    ", ".join(f"{jax.tree_util.keystr(k) or 'out'}: {_desc(as_numpy(v))}" for k, v in leaves)
    or "no arrays"
  )
  return text if len(text) <= limit else text[: limit - 3] + "..."
