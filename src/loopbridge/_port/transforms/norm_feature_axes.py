"""The width a normalization layer over several feature axes is built with in NNX.

Linen's `LayerNorm(feature_axes=(-2, -1))` and `BatchNorm(axis=(-2, -1))` hold a scale of the
feature shape, `(3, 4)`; NNX's take one `num_features` and hold a flat `(12,)` scale, reshaped
to the feature shape in the call. The port is built with the product of the feature axes'
sizes; converting the Linen variables reshapes the scale (the same values in the same order).
"""

from __future__ import annotations

import math
import typing as tp

from ..trace.trace import size

if tp.TYPE_CHECKING:
  from ..trace.trace import Instance


def _feature_size(inst: Instance, axes: object) -> int | None:
  call = inst.inputs.get("__call__")
  shape = getattr(call[0][0], "shape", None) if call and call[0] else None
  if shape is None:
    return None
  picked = (axes,) if isinstance(axes, int) else tuple(tp.cast(tp.Iterable[int], axes))
  return math.prod(size(shape[a]) for a in picked)


def _axes(inst: Instance, name: str) -> object:
  """The layer's feature axes setting; the last axis for a layer no configuration built (its
  settings cannot be read, `passed_values.NO_SETTINGS`), as the one-axis width always was."""
  try:
    return getattr(inst.module, name, -1)
  except LookupError:
    return -1


def layer_norm_widths(inst: Instance) -> dict[str, object]:
  """nnx.LayerNorm's and nnx.RMSNorm's `num_features`: the size of every feature axis."""
  return {"num_features": _feature_size(inst, _axes(inst, "feature_axes"))}


def batch_norm_widths(inst: Instance) -> dict[str, object]:
  """nnx.BatchNorm's `num_features`: the size of every axis Linen's `axis=` names."""
  return {"num_features": _feature_size(inst, _axes(inst, "axis"))}


def batch_norm_refused(
  kids: tp.Sequence[Instance], values: tp.Mapping[str, str], moved: tp.Sequence[str]
) -> str | None:
  """Why a BatchNorm over several axes is not drafted, or None.

  NNX's BatchNorm updates its flat `(num_features,)` statistics with the batch's
  feature-shaped ones, which do not broadcast: such a port only runs on its running averages.
  """
  several = any(
    not isinstance(axis := getattr(k.module, "axis", -1), int) and len(axis) > 1 for k in kids
  )
  frozen = values.get("use_running_average") == "True" or "use_running_average=True" in moved
  if not several or frozen:
    return None
  return (
    "nn.BatchNorm over several axes (axis=(...)) that may run in training: nnx.BatchNorm keeps "
    "flat statistics and cannot update them with feature-shaped batch statistics; port it by "
    "hand (a BatchNorm over the flattened feature axes, reshaping around it)"
  )
