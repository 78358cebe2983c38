"""The input widths an NNX attention layer is built with, read from the traced call.

`nn.SelfAttention(...)(x, mask)` takes the mask as its second positional argument: only the
query is an input there (no key/value width). Cross-attention (`MHA(q, kv)`) with a key/value
input of another width needs NNX's `in_kv_features`, which older flax's NNX does not have:
such a construction is a TODO naming the width, never built at the query's width.
"""

from __future__ import annotations

import typing as tp

if tp.TYPE_CHECKING:
  from ..trace.trace import Instance


def self_attention_widths(inst: Instance) -> dict[str, object]:
  """nn.SelfAttention attends its one input: the query's width is every width."""
  return {"in_features": inst.width()}


def cross_attention_widths(inst: Instance) -> dict[str, object]:
  widths: dict[str, object] = {"in_features": inst.width()}
  kv = inst.width(arg=1)
  if kv is not None and kv != widths["in_features"]:
    # Cross-attention from inputs of another width (NNX needs it at construction).
    widths["in_kv_features"] = kv
  return widths


def untaken_width(nnx_name: str, widths: tp.Mapping[str, object], known: set[str]) -> str | None:
  """Why the construction is not drafted when NNX's layer takes no argument for a width the
  trace saw (None when it takes them all)."""
  missing = sorted(set(widths) - known)
  if not missing:
    return None
  seen = ", ".join(f"{n}={widths[n]!r}" for n in missing)
  return (
    f"the traced call needs {seen}, and this flax's nnx.{nnx_name} takes no such argument "
    "(built at the query's width it would not hold Linen's weights): project the key/value "
    f"input to the query's width by hand, or use a flax whose nnx.{nnx_name} takes it"
  )
