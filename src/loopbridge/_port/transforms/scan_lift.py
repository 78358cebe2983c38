"""`nn.scan` over a module -> an `nnx.vmap`-built stack run by `nnx.scan`.

Linen's scanned module owns its layers' variables stacked along `variable_axes` (axis 0 here);
the port builds the same stack in `__init__` (`nnx.split_rngs` + `nnx.vmap` over the rngs) and
runs it with `nnx.scan`: the stack on axis 0, the carry as `nnx.Carry`, each scanned input on
its Linen `in_axes`; a broadcast input (`nn.broadcast`) is closed over, as it does not change
from layer to layer (and may be a Python flag that must stay static).
"""

from __future__ import annotations

import dataclasses
import json
import typing as tp

from flax import linen as nn

from ... import _compat
from ..plan.source import dotted
from . import lift_args, scan_param_streams

if tp.TYPE_CHECKING:
  from ..plan.find_sites import Site

# The planner (`rewrite_class.Planner`) is passed in; typed loosely so this module stays below it.
Planner = tp.Any

# nn.scan arguments the draft writes; any other one makes the construction a TODO.
_KNOWN = frozenset(
  {"variable_axes", "split_rngs", "in_axes", "out_axes", "length", "metadata_params"}
)


@dataclasses.dataclass
class ScanPlan:
  length: str
  in_axes: object  # one axis (int or None = broadcast) for every scanned input, or a tuple
  out_axes: str
  body: str | None  # the local holding the layer's nnx.remat, or None: the layer's own call
  # `metadata_params={nn.PARTITION_NAME: "layers"}` (MaxText's): the stack's logical axis
  # name, given to nnx.vmap and nnx.scan as `transform_metadata`; None: none given.
  partition: str | None = None
  # Linen's split_rngs splits the params stream: each layer starts from its own draw.
  split_params: bool = True
  lift: tp.ClassVar[str] = "scan"
  why: tp.ClassVar[str] = "nn.scan runs as nnx.scan over the vmap-built stack"

  def init_lines(self, attr: str, construction: str, unit: str) -> list[str]:
    """`__init__` lines building the stack of `length` layers."""
    return scan_param_streams.stack(
      self.length, attr, construction, unit, self._metadata(), self.split_params
    )

  def _metadata(self) -> str:
    if self.partition is None:
      return ""
    return f", transform_metadata={{nnx.PARTITION_NAME: {json.dumps(self.partition)}}}"

  def call(self, module: str, args: list[str]) -> str:
    """`nnx.scan(...)(module, carry, *xs)` for a Linen call `scanned(carry, *xs)`.

    flax 0.10's nnx.scan needs the stack's rng streams split around the call (its layers'
    streams keep one count each); flax 0.12 splits them itself.
    """
    carry, xs = args[0], args[1:]
    axes = list(self.in_axes) if isinstance(self.in_axes, tuple) else [self.in_axes] * len(xs)
    params, inner, outer, in_axes = ["layer", "carry"], ["carry"], [module, carry], []
    for i, (x, axis) in enumerate(zip(xs, axes)):
      if axis is None:
        inner.append(x)
      else:
        params.append(f"x{i}")
        inner.append(f"x{i}")
        outer.append(x)
        in_axes.append(repr(axis))
    run = f"{self.body}(layer, {', '.join(inner)})" if self.body else f"layer({', '.join(inner)})"
    scan = (
      f"nnx.scan(lambda {', '.join(params)}: {run}, "
      f"in_axes=(0, nnx.Carry{''.join(', ' + a for a in in_axes)}), "
      f"out_axes=(nnx.Carry, {self.out_axes}){self._metadata()})"
    )
    if _compat.nnx_scan_needs_split_rngs():
      scan = f"nnx.split_rngs(splits={self.length})({scan})"
    return f"{scan}({', '.join(outer)})"


def plan_scan(planner: Planner, site: Site, made: tp.Sequence[object] = ()) -> ScanPlan | str:
  """The plan of a construction through `nn.scan`, or why it stays a TODO.

  `made` (the modules the trace saw it make) is not read: whether the layers draw from a
  stream Linen's `split_rngs` leaves unsplit is checked for `nn.vmap` only (not yet here).
  """
  found = lift_args.read(planner, site, _KNOWN, "scan", "length")
  if isinstance(found, str):
    return found
  kwargs, read = found
  axes = read.get("variable_axes", {})
  in_axes, out_axes = read.get("in_axes", 0), read.get("out_axes", 0)
  if not isinstance(axes, dict) or any(v != 0 for v in axes.values()):
    return f"nn.scan with variable_axes={axes!r} (the drafted stack has its layers on axis 0)"
  if "length" not in kwargs:
    return "nn.scan without length= (the stack's size must be known in __init__)"
  if not lift_args.known_in_init(planner, site, kwargs["length"]):
    return "nn.scan whose length= depends on the call"

  def axis(a: object) -> object:
    return None if a is nn.broadcast else a

  if not isinstance(out_axes, int):
    return f"nn.scan with out_axes={out_axes!r} (not drafted)"
  scanned = tuple(axis(a) for a in in_axes) if isinstance(in_axes, tuple) else axis(in_axes)
  metadata = read.get("metadata_params", {})
  if not isinstance(metadata, dict) or set(metadata) - {nn.PARTITION_NAME}:
    return f"nn.scan with metadata_params={metadata!r} (only nn.PARTITION_NAME is drafted)"
  partition = metadata.get(nn.PARTITION_NAME)
  if partition is not None and not isinstance(partition, str):
    return f"nn.scan with metadata_params={metadata!r} (the partition name must be a string)"
  split = scan_param_streams.params_split(read.get("split_rngs", {}))
  if isinstance(split, str):
    return split
  first = site.lift.args[0].value
  body = dotted(first) if site.inner_lift is not None else None
  return ScanPlan(planner.code(kwargs["length"]), scanned, repr(out_axes), body, partition, split)
