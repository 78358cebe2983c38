"""Comparing two recorded calls of `lb.compare`: their outputs, leaf by leaf, within tolerance.

A leaf agrees when `|candidate - reference| <= atol + rtol * |reference|` everywhere (NaN in
the same places counts as equal); the tolerances default per dtype, backend and check precision
(`compare_tolerance.default_tolerance`), the default atol relative to the reference's robust
scale with mask values left out (`compare_elementwise`).
"""

from __future__ import annotations

import typing as tp

import jax
import numpy as np

from .compare_capture import Call
from .compare_elementwise import compare_arrays
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
  result = compare_arrays(a, b, default, rtol, atol)
  if not result.within:
    status = VALUES
  else:
    status = OK if a.dtype == b.dtype else DTYPE
  return LeafDiff(
    leaf,
    da,
    db,
    status,
    result.max_abs,
    result.max_rel,
    scale=result.scale,
    masked=result.masked,
    atol_used=result.atol,
  )


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
