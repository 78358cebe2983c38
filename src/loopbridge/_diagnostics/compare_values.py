"""Comparing two recorded calls of `lb.compare`: their outputs, leaf by leaf, within tolerance.

A leaf agrees when `|candidate - reference| <= atol + rtol * |reference|` everywhere (NaN in
the same places counts as equal); the tolerances default per dtype.
"""

from __future__ import annotations

import math
import typing as tp

import jax
import numpy as np

from .compare_capture import Call
from .compare_report import DTYPE, OK, SEVERITY, SHAPE, STRUCTURE, VALUES, CallPair, LeafDiff

# Default (rtol, atol) per floating dtype size in bytes: two implementations of the same math
# differ by a few ulps of the reassociated sums; a porting bug is far above that.
_FLOAT_TOLERANCES = {1: (1e-1, 1e-1), 2: (1e-2, 1e-2), 4: (1e-5, 1e-5), 8: (1e-9, 1e-9)}
_BFLOAT16_TOLERANCES = (1e-2, 1e-2)
_FLOAT16_TOLERANCES = (1e-3, 1e-3)


def as_numpy(leaf: object) -> np.ndarray:
  dtype = getattr(leaf, "dtype", None)
  if dtype is not None and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(tp.cast(jax.Array, leaf))
  return np.asarray(leaf)


def _desc(array: np.ndarray) -> str:
  return f"{array.dtype}[{','.join(map(str, array.shape))}]"


def _is_float(dtype: np.dtype) -> bool:
  # bfloat16 and the float8 types come from ml_dtypes with kind 'V'; their names say it.
  return dtype.kind in "fc" or dtype.name.startswith(("float", "bfloat"))


def numeric(array: np.ndarray) -> bool:
  return (
    array.dtype.kind in "biu"
    or _is_float(array.dtype)
    or (array.dtype.name.startswith(("int", "uint")))
  )


def _default_tolerance(dtype: np.dtype) -> tuple[float, float]:
  if not _is_float(dtype):
    return (0.0, 0.0)  # integers and bools: exact
  if dtype.name == "bfloat16":
    return _BFLOAT16_TOLERANCES
  if dtype.name == "float16":
    return _FLOAT16_TOLERANCES
  size = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
  return _FLOAT_TOLERANCES.get(size, _FLOAT_TOLERANCES[1])


def _leaf_diff(
  leaf: str, ref: object, cand: object, rtol: float | None, atol: float | None
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
  (rt_a, at_a), (rt_b, at_b) = _default_tolerance(a.dtype), _default_tolerance(b.dtype)
  rt = rtol if rtol is not None else max(rt_a, rt_b)
  at = atol if atol is not None else max(at_a, at_b)
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
  ref: Call, cand: Call, aligned_by: str, rtol: float | None, atol: float | None
) -> CallPair:
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
    _leaf_diff(name, a, b, rtol, atol) for (name, a), (_, b) in zip(ref.leaves, cand.leaves)
  )
  return pair(max((d.status for d in leaves), key=SEVERITY.__getitem__, default=OK), leaves)


def tree_text(tree: object, limit: int = 120) -> str:
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  text = (
    ", ".join(f"{jax.tree_util.keystr(k) or 'out'}: {_desc(as_numpy(v))}" for k, v in leaves)
    or "no arrays"
  )
  return text if len(text) <= limit else text[: limit - 3] + "..."
