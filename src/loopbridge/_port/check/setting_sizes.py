"""The port at input sizes equal to the settings, where a layer sits under a test of shapes.

A layer built only `if residual.shape != y.shape` is built by the port always when every trace
took the branch (`plan/shape_guards.py`): the sample's input width differed from the
projection's. At an input width equal to a setting (`x_features=features`) the test fails and
Linen builds no such layer; the port is checked there, and where that fails each such layer is
a TODO of the draft, so the draft is not `ok`. Only drafts with such a layer pay for this check.
"""

from __future__ import annotations

import dataclasses
import typing as tp

from ..records import Check
from .class_check import (
  call_arrays,
  checked_at,
  inits_in_linen,
  int_settings,
  merged,
  with_sizes,
)

# At most this many sizes are checked (each builds and runs the port once).
MAX_CHECKS = 4
# Settings above this are no input width to try (a vocabulary, a length).
MAX_SIZE = 4096


def at_setting_sizes(result: tp.Any, verdict: Check) -> Check:
  """`verdict`, merged with the port's check at each input size equal to an integer setting
  (only where the draft has a layer under a test of shapes and was equal so far)."""
  guards = getattr(result, "shape_guards", ())
  if not guards or not verdict.equal:
    return verdict
  sample = result.calls[0]
  arrays = call_arrays(sample)
  checks = 0
  for name, (where, axis) in result.input_sizes.items():
    if where not in arrays or axis >= arrays[where].ndim:
      continue
    old = int(arrays[where].shape[axis])
    for size in sorted(int_settings(result.linen_module)):
      if checks >= MAX_CHECKS or size == old or not 0 < size <= MAX_SIZE:
        continue
      call = with_sizes(sample, {(where, axis): size})
      if not inits_in_linen(result.linen_module, call):
        continue  # a size the model does not take is not checked
      checks += 1
      where_text = f"an input of a setting's size ({name}={size})"
      resized = dataclasses.replace(result, init_kwargs={**result.init_kwargs, name: size})
      more = checked_at(result, result.linen_module, resized.build, call)
      verdict = merged(verdict, more, where_text)
      if not verdict.equal:
        object.__setattr__(result, "todos", (*result.todos, *guards))
        return verdict
  return verdict
