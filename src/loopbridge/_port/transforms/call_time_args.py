"""A standard layer's setting that reads the call stays a call-time value in the port.

`nn.LayerNorm(epsilon=eps)` with `eps` a call argument (or `dtype=x.dtype`, a `padding` chosen
by a call flag, BatchNorm's `momentum`) builds a fresh layer at every Linen call with that
call's value. The port builds the layer once in `__init__`, so writing the sample's value
there would ignore every other call. A setting the NNX layer only reads in its own call (an
attribute of the same name, no parameter shape depends on it) is set on the layer just before
the statement that calls it: `self.LayerNorm_0.epsilon = eps`. Any other setting read from the
call and is not read by the NNX layer's own call is not drafted (a TODO). A width read from
the input's shape (`nn.Dense(x.shape[-1])`) sizes parameters: NNX needs it at construction,
and it stays the traced value's expression (a field, an added argument), as before.
"""

from __future__ import annotations

import functools
import inspect
import typing as tp

LOOP_OVER_CALL = (
  "a loop whose range depends on the call (an input's size, a list the call fills) builds "
  "layers, which the port builds once in __init__: build them in a loop over range(n) with n "
  "a setting, and index them in the call's loop"
)

# Settings that size no parameter: a layer built without them and given them before each
# call computes what Linen's fresh layer computes.
_NO_SHAPE = frozenset(
  {
    "epsilon",
    "dtype",
    "precision",
    "momentum",
    "padding",
    "strides",
    "input_dilation",
    "kernel_dilation",
    "reduction_axes",
    "use_fast_variance",
    "rate",
    "broadcast_dims",
  }
)


def sizes_nothing(field: str) -> bool:
  """A Linen layer field no parameter shape depends on (a setting of the computation)."""
  return field in _NO_SHAPE


@functools.cache
def _read_in_call(nnx_class: type, attr: str) -> bool:
  """Whether the NNX layer's own call reads `self.<attr>` (so setting it takes effect)."""
  try:
    text = inspect.getsource(nnx_class.__call__)
  except (OSError, TypeError):
    return False
  return f"self.{attr}" in text


def call_time_setting(layer: tp.Any, field: str, site: tp.Any) -> tuple[str | None, str]:
  """(the NNX attribute to set before the call, '') for a setting read from the call, or
  (None, why the construction is not drafted)."""
  target = layer.renames.get(field, field)
  where = (
    "built in setup"
    if site.method == "setup"
    else "built inside another layer's construction"
    if site.nested_in is not None
    else "built in a list comprehension"
    if site.comp is not None
    else "built through a lifted transform"
    if site.lift is not None
    else None
  )
  if not _read_in_call(layer.nnx_class, target):
    return None, (
      f"{field}= reads the call, and the port builds nnx.{layer.nnx_name} once in __init__ "
      f"(writing the sample call's value would ignore every other call), whose own call "
      f"does not read .{target}: make it a constructor setting of the class"
    )
  if where is not None:
    return None, (
      f"{field}= reads the call, and the layer is {where}: the draft sets a call-time "
      f"setting on a layer called in a method only; set `.{target}` before the call by hand"
    )
  return target, ""


def statements(ref: str, settings: tp.Sequence[tuple[str, str]]) -> list[str]:
  """The lines setting each call-time value on the layer `ref` (`self.LayerNorm_0`)."""
  return [f"{ref}.{attr} = {code}\n" for attr, code in settings]
