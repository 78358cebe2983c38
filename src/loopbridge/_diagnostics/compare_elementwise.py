"""Whether two arrays agree elementwise, with an absolute tolerance a few extreme entries cannot
widen: the one rule of `lb.compare`, the check inside `lb.port.draft` and conversion evidence.

A leaf agrees where `|candidate - reference| <= atol + rtol * |reference|` at every entry. A
default `atol` is a fraction of the reference's scale, and the scale is robust: the 99th
percentile (the lower neighbour: of 100 entries or fewer, the second largest) of the
reference's finite magnitudes, mask values left out. Taking the largest magnitude instead lets
one mask value decide every entry's tolerance: logits of a padded vocabulary masked with
`jnp.finfo(jnp.float32).min` would be compared at an atol of ~3e33, and with -1e9 at ~1e4, so
a port that forgets `/ temperature` would pass.

Mask values are what a model writes where a value is not computed: infinities, and large
sentinels (`finfo.min`, -1e9, -1e4 in float16) that are EQUAL on both sides. A finite entry is
a mask value when the candidate holds exactly the same value and its magnitude is at least
`MASK_RATIO` times the typical magnitude (the median of the reference's finite nonzero
magnitudes, not counting values that repeat and are equal on both sides, so that masks in the
majority of entries do not make themselves typical) or is half the dtype's largest value. Mask
values are matched exactly (they are equal by definition; infinities compare only with equal
infinities) and are left out of the scale.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from .compare_tolerance import ToleranceChoice, is_float

# The percentile of the reference's unmasked finite magnitudes that sets the scale.
SCALE_PERCENTILE = 99.0
# A value equal on both sides and this many times the typical magnitude is a mask value.
MASK_RATIO = 1e3
SCALE_WORDS = (
  f"the {SCALE_PERCENTILE:g}th percentile of the reference's finite magnitudes, mask values "
  "(infinities, and sentinels such as finfo.min or -1e9 equal on both sides) left out"
)


@dataclasses.dataclass(frozen=True)
class Elementwise:
  """One leaf compared: whether it agrees, its errors, and the tolerance it was held to."""

  within: bool
  max_abs: float
  max_rel: float
  rtol: float
  atol: float  # absolute: the default's fraction times `scale`, or the atol given
  scale: float  # the reference's robust scale (what a default atol is a fraction of)
  masked: int  # entries matched as mask values, left out of the scale


def _wide(a: np.ndarray, b: np.ndarray) -> type:
  return np.complex128 if "c" in (a.dtype.kind, b.dtype.kind) else np.float64


def mask_entries(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
  """Where `reference` holds a mask value (see the module docstring), as a bool array."""
  wide = _wide(reference, candidate)
  x, y = reference.astype(wide), candidate.astype(wide)
  magnitude = np.abs(x)
  finite = np.isfinite(magnitude)
  with np.errstate(invalid="ignore"):
    equal = x == y
  masks = ~finite & ~np.isnan(magnitude)
  if not is_float(reference.dtype) or not bool(np.any(equal & finite & (magnitude > 0))):
    return masks
  # Values that repeat and are equal on both sides are left out of the typical magnitude:
  # sentinels fill many entries with one value, and may fill most of them.
  flat = x[finite & equal].ravel()
  values, counts = np.unique(flat, return_counts=True)
  repeated = np.isin(x, values[counts > 1]) & equal
  typical_pool = magnitude[finite & (magnitude > 0) & ~repeated]
  if not typical_pool.size:
    typical_pool = magnitude[finite & (magnitude > 0)]
  typical = float(np.median(typical_pool))
  # jnp.finfo knows bfloat16 and the float8 types too (numpy's does not).
  largest = float(jnp.finfo(reference.dtype).max) if reference.dtype.kind != "c" else math.inf
  sentinel = (magnitude >= MASK_RATIO * typical) | (magnitude >= largest / 2)
  return masks | (finite & equal & sentinel)


def robust_scale(reference: np.ndarray, masks: np.ndarray) -> float:
  """The reference's scale: the `SCALE_PERCENTILE` percentile (the lower neighbour) of its
  finite magnitudes outside `masks`; 0 when there are none, 1 for a non-float leaf."""
  if not reference.size or not is_float(reference.dtype):
    return 1.0 if reference.size else 0.0
  wide = np.complex128 if reference.dtype.kind == "c" else np.float64
  magnitude = np.abs(reference.astype(wide))
  kept = magnitude[np.isfinite(magnitude) & ~masks]
  if not kept.size:
    return 0.0
  return float(np.percentile(kept, SCALE_PERCENTILE, method="lower"))


def compare_arrays(
  reference: np.ndarray,
  candidate: np.ndarray,
  default: ToleranceChoice,
  rtol: float | None = None,
  atol: float | None = None,
) -> Elementwise:
  """Compare two arrays of one shape: `default`'s dtype tolerances (its atol a fraction of the
  reference's robust scale) where `rtol`/`atol` are None; a given atol is absolute."""
  masks = mask_entries(reference, candidate)
  scale = robust_scale(reference, masks)
  rt_default, at_fraction = default.for_pair(reference.dtype, candidate.dtype)
  rt = rtol if rtol is not None else rt_default
  at = atol if atol is not None else at_fraction * scale
  wide = _wide(reference, candidate)
  x, y = reference.astype(wide), candidate.astype(wide)
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    same = (x == y) | (np.isnan(x) & np.isnan(y))  # equal infinities and NaN where NaN
    diff = np.where(same, 0.0, np.abs(y - x))
    diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
    magnitude = np.abs(x)
    # An infinity of the reference is matched only by the same infinity: `rtol * inf` would
    # let any value pass.
    finite = np.isfinite(magnitude)
    rel = np.where(
      finite & (magnitude > 0),
      diff / np.where(finite & (magnitude > 0), magnitude, 1.0),
      np.where(diff > 0, np.inf, 0.0),
    )
    # `same` first: NaN in the same places is equal, though NaN fails every `<=`. A mask value
    # is equal by definition. An infinite atol compares no values at all (structure, shapes
    # and dtypes only).
    within = at == math.inf or bool(np.all(same | (finite & (diff <= at + rt * magnitude))))
  return Elementwise(
    within=within,
    max_abs=float(diff.max()) if diff.size else 0.0,
    max_rel=float(rel.max()) if rel.size else 0.0,
    rtol=float(rt),
    atol=float(at),
    scale=scale,
    masked=int(masks.sum()),
  )
