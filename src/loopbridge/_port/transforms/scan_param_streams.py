"""Whether an `nn.scan` stack's layers start from one draw of the params stream or their own.

Linen's `nn.scan` splits only the streams its `split_rngs` names True (none by default): with
`split_rngs={'params': False}` every layer is initialized from the same key, so a fresh Linen
model holds identical layers. The drafted stack does the same by broadcasting the rngs to
every layer (`nnx.vmap(in_axes=(None,), axis_size=n)`) instead of splitting them.
"""

from __future__ import annotations

import typing as tp


def params_split(split_rngs: object) -> bool | str:
  """True: Linen gives each layer its own params key; False: one key for all; a string: why
  the draft cannot tell (a filter other than a stream name or True)."""
  if not isinstance(split_rngs, tp.Mapping):
    return f"nn.scan with split_rngs={split_rngs!r} (a dict of stream name -> bool is drafted)"
  split = tp.cast(tp.Mapping[object, object], split_rngs)
  if any(not isinstance(k, (str, bool)) or not isinstance(v, bool) for k, v in split.items()):
    return f"nn.scan with split_rngs={split_rngs!r} (a dict of stream name -> bool is drafted)"
  # A stream name decides for itself; `True` as a key stands for every stream.
  return bool(split.get("params", split.get(True, False)))


def stack(size: str, attr: str, construction: str, unit: str, metadata: str, split: bool):
  """`__init__` lines building `size` layers: each with its own rng streams (`split`), or
  every layer from the same keys, as Linen's unsplit params stream initializes them."""
  if split:
    from .lift_args import stack as split_stack

    return split_stack(size, attr, construction, unit, metadata)
  return [
    f"# nn.scan leaves the params stream unsplit: every layer starts from the same draw.\n"
    f"@nnx.vmap(in_axes=(None,), out_axes=0, axis_size={size}{metadata})\n"
    f"def make_{attr}(rngs: nnx.Rngs):\n"
    f"{unit}return {construction}\n",
    f"self.{attr} = make_{attr}(rngs)",
  ]
