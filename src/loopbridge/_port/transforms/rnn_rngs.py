"""`nn.RNN(..., split_rngs=...)` in NNX (flax's seq2seq decoder: `split_rngs={'params': False,
'lstm': True}`).

Linen's RNN scans its cell with `split_rngs`: a stream set True draws a new key at each step,
one set False the same key at every step. NNX's RNN carries the cell's random streams through
its scan, so each step draws a new key (what True asks); `params` draws nothing while NNX runs
(its variables are made in `__init__`). A stream kept the same at every step is NNX's
`broadcast_rngs=` where this flax's `nnx.RNN` has it; where not, it is a TODO saying what to
write, never a port that draws other keys than Linen's scheme asks.
"""

from __future__ import annotations

import ast

WHY = (
  "nnx.RNN carries the cell's random streams through its scan: a new key at each step, what "
  "split_rngs=True asks; params are made in __init__, so 'params' needs nothing"
)


def split_rngs(code: str, nnx_params: set[str]) -> tuple[dict[str, str], str | None]:
  """NNX constructor arguments for Linen's `split_rngs=<code>`, or why it is not drafted."""
  try:
    value = ast.literal_eval(code)
  except (ValueError, SyntaxError):
    return {}, f"nn.RNN's split_rngs={code} is not a literal dict: write nnx.RNN's streams by hand"
  if not isinstance(value, dict) or not all(
    isinstance(k, str) and isinstance(v, bool) for k, v in value.items()
  ):
    return {}, f"nn.RNN's split_rngs={code} is not a dict of stream names to bools"
  same_key = sorted(k for k, v in value.items() if k != "params" and not v)
  if not same_key:
    return {}, None
  if "broadcast_rngs" in nnx_params:
    return {"broadcast_rngs": repr(tuple(same_key))}, None
  return {}, (
    f"nn.RNN's split_rngs={code} keeps {same_key} the same at every step; this flax's nnx.RNN "
    "gives each step a new key (it has no broadcast_rngs=): draw that key once before the RNN "
    "and pass it to the cell by hand"
  )
