"""`nn.scan` over a module -> an `nnx.vmap`-built stack run by `nnx.scan`.

Linen's scanned module owns its layers' variables stacked along `variable_axes` (axis 0 here);
the port builds the same stack in `__init__` (`nnx.split_rngs` + `nnx.vmap` over the rngs) and
runs it with `nnx.scan`: the stack on axis 0, the carry as `nnx.Carry`, each scanned input on
its Linen `in_axes`; a broadcast input (`nn.broadcast`) is closed over, as it does not change
from layer to layer (and may be a Python flag that must stay static).
"""

from __future__ import annotations

import dataclasses
import typing as tp

from flax import linen as nn

from .names import available
from .source import dotted

if tp.TYPE_CHECKING:
  from .find_sites import Site

# The planner (`rewrite_class.Planner`) is passed in; typed loosely so this module stays below it.
Planner = tp.Any

# nn.scan arguments the draft writes; any other one makes the construction a TODO.
_KNOWN = frozenset({"variable_axes", "split_rngs", "in_axes", "out_axes", "length"})


@dataclasses.dataclass
class ScanPlan:
  length: str
  in_axes: object  # one axis (int or None = broadcast) for every scanned input, or a tuple
  out_axes: str
  body: str | None  # the local holding the layer's nnx.remat, or None: the layer's own call

  def stack(self, attr: str, construction: str, unit: str) -> list[str]:
    """`__init__` lines building the stack of `length` layers."""
    return [
      f"@nnx.split_rngs(splits={self.length})\n"
      f"@nnx.vmap(in_axes=(0,), out_axes=0)\n"
      f"def make_{attr}(rngs: nnx.Rngs):\n"
      f"{unit}return {construction}\n",
      f"self.{attr} = make_{attr}(rngs)",
    ]

  def call(self, module: str, args: list[str], split_rngs: bool) -> str:
    """`nnx.scan(...)(module, carry, *xs)` for a Linen call `scanned(carry, *xs)`.

    `split_rngs`: flax 0.10's nnx.scan needs the stack's rng streams split around the call
    (its layers' streams keep one count each); flax 0.12 splits them itself.
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
      f"out_axes=(nnx.Carry, {self.out_axes}))"
    )
    if split_rngs:
      scan = f"nnx.split_rngs(splits={self.length})({scan})"
    return f"{scan}({', '.join(outer)})"


def _value(planner: Planner, node: tp.Any) -> object:
  """A scan argument's value: literals and the module's globals (`nn.broadcast`) only."""
  code = planner.code(node)
  try:
    return eval(code, dict(planner.src.namespace))  # the user's own literal, e.g. {'params': 0}
  except Exception as e:
    raise ValueError(f"nn.scan's {code} cannot be read before the call ({e})") from e


def plan_scan(planner: Planner, site: Site) -> ScanPlan | str:
  """The plan of a construction through `nn.scan`, or why it stays a TODO."""
  call = site.lift
  kwargs = {a.keyword.value: a.value for a in call.args[1:] if a.keyword is not None}
  unknown = sorted(set(kwargs) - _KNOWN)
  if unknown or any(a.keyword is None for a in call.args[1:]):
    return f"nn.scan with {', '.join(unknown) or 'positional arguments'} (not drafted)"
  try:
    axes = _value(planner, kwargs["variable_axes"]) if "variable_axes" in kwargs else {}
    in_axes = _value(planner, kwargs["in_axes"]) if "in_axes" in kwargs else 0
    out_axes = _value(planner, kwargs["out_axes"]) if "out_axes" in kwargs else 0
  except ValueError as e:
    return str(e)
  if not isinstance(axes, dict) or any(v != 0 for v in axes.values()):
    return f"nn.scan with variable_axes={axes!r} (the drafted stack has its layers on axis 0)"
  if "length" not in kwargs:
    return "nn.scan without length= (the stack's size must be known in __init__)"
  aliases = planner.aliases.get(site.method, {})
  if not available(kwargs["length"], planner.src.namespace, set(aliases)):
    return "nn.scan whose length= depends on the call"

  def axis(a: object) -> object:
    return None if a is nn.broadcast else a

  if not isinstance(out_axes, int):
    return f"nn.scan with out_axes={out_axes!r} (not drafted)"
  scanned = tuple(axis(a) for a in in_axes) if isinstance(in_axes, tuple) else axis(in_axes)
  cls = tp.cast(type, site.target)
  first = call.args[0].value
  body = dotted(first) if site.inner_lift is not None else None
  del cls
  return ScanPlan(planner.code(kwargs["length"]), scanned, repr(out_axes), body)
