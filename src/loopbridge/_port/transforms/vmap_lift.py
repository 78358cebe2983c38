"""`nn.vmap` over a module -> `nnx.vmap` at the call, over a stack or one shared module.

Two forms are drafted, the two that Linen code uses `nn.vmap` for:

- an ensemble, `variable_axes={'params': 0}` with every rng stream split: one set of params
  per member, stacked on axis 0. The port builds the same stack in `__init__` as for `nn.scan`
  (`nnx.split_rngs` + `nnx.vmap` over the rngs, `axis_size` members) and maps the stack's
  axis 0 beside the inputs' `in_axes`;
- params shared over a mapped axis, `variable_axes={'params': None}` with no stream split:
  one module built as usual, broadcast (`in_axes` None) beside the mapped inputs.

Anything else (other axes or collections, `axis_name` and its collectives, `methods=`, an
`axis_size` known only at the call) is left as a TODO with the reason: never a guess.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing as tp

from flax import linen as nn

from ... import _compat
from ..emit.literals import literal
from ..plan.source import dotted
from . import lift_args

if tp.TYPE_CHECKING:
  from ..plan.find_sites import Site
  from ..trace.trace import Instance

# The planner (`rewrite_class.Planner`) is passed in; typed loosely so this module stays below it.
Planner = tp.Any

# nn.vmap arguments the draft writes; any other one (axis_name, spmd_axis_name, methods,
# metadata_params) makes the construction a TODO.
_KNOWN = frozenset({"variable_axes", "split_rngs", "in_axes", "out_axes", "axis_size"})


@dataclasses.dataclass
class VmapPlan:
  size: str | None  # the members of an ensemble (its stack's size); None: shared params
  in_axes: object  # Linen's: one axis for every input, or a tuple (one per input)
  out_axes: str
  # Written at the call: the stack's size (a member without arrays maps nothing but still
  # has its size), or Linen's own axis_size= over shared params (None: none given).
  axis_size: str | None
  body: str | None  # the local holding the module's nnx.remat, or None: the module's own call
  lift: tp.ClassVar[str] = "vmap"

  @property
  def why(self) -> str:
    return (
      "nn.vmap runs as nnx.vmap over the stack of members"
      if self.size is not None
      else "nn.vmap runs as nnx.vmap with the module's params broadcast"
    )

  def init_lines(self, attr: str, construction: str, unit: str) -> list[str]:
    """`__init__` lines: the stack of members, or the one module."""
    if self.size is None:
      return [f"self.{attr} = {construction}"]
    return lift_args.stack(self.size, attr, construction, unit)

  def call(self, module: str, args: list[str]) -> str:
    """`nnx.vmap(...)(module, *xs)` for a Linen call `vmapped(*xs)`.

    flax 0.10's nnx.vmap needs a stack's rng streams split around the call (its members'
    streams keep one count each); flax 0.12 maps them itself.
    """
    axes = list(self.in_axes) if isinstance(self.in_axes, tuple) else [self.in_axes] * len(args)
    own = "0" if self.size is not None else "None"
    in_axes = ", ".join([own, *(tp.cast(str, literal(a)) for a in axes)])
    run = f"{self.body}(module, *args)" if self.body else "module(*args)"
    options = f", axis_size={self.axis_size}" if self.axis_size is not None else ""
    vmap = (
      f"nnx.vmap(lambda module, *args: {run}, in_axes=({in_axes}), "
      f"out_axes={self.out_axes}{options})"
    )
    if self.size is not None and _compat.nnx_vmap_needs_split_rngs():
      vmap = f"nnx.split_rngs(splits={self.size})({vmap})"
    return f"{vmap}({', '.join([module, *args])})"


def _drawn_streams(planner: Planner, made: tp.Sequence[Instance]) -> set[str]:
  """The rng streams the vmapped modules (and their submodules) draw from, as the trace and
  their classes' source show them: a Dropout's `rng_collection`, `make_rng('<name>')`."""
  roots = [k.path for k in made]
  found: set[str] = set()
  for path, inst in planner.trace.instances.items():
    if not any(path[: len(r)] == r for r in roots):
      continue
    stream = getattr(inst.module, "rng_collection", None)
    if isinstance(inst.module, nn.Dropout) and isinstance(stream, str):
      found.add(stream)
    try:
      text = inspect.getsource(inst.cls)
    except (OSError, TypeError):
      continue
    found.update(re.findall(r"make_rng\(\s*['\"](\w+)['\"]", text))
  return found - {"params"}


def plan_vmap(planner: Planner, site: Site, made: tp.Sequence[Instance]) -> VmapPlan | str:
  """The plan of a construction through `nn.vmap` (`made`: the modules the trace saw it
  make), or why it stays a TODO."""
  found = lift_args.read(planner, site, _KNOWN, "vmap", "axis_size")
  if isinstance(found, str):
    return found
  kwargs, read = found
  axes = read.get("variable_axes", {})
  split = read.get("split_rngs", {})
  in_axes, out_axes = read.get("in_axes", 0), read.get("out_axes", 0)
  if not isinstance(axes, dict) or set(axes) != {"params"} or axes["params"] not in (0, None):
    return (
      f"nn.vmap with variable_axes={axes!r} (only params, on axis 0 or None, is drafted: "
      "other axes and collections are not)"
    )
  stacked = axes["params"] == 0
  if not isinstance(split, dict) or (
    not (split.get("params") is True and all(v is True for v in split.values()))
    if stacked
    else any(v is not False for v in split.values())
  ):
    return (
      f"nn.vmap with split_rngs={split!r} and variable_axes={axes!r} (drafted: every stream "
      "split for params on axis 0, none split for params None)"
    )
  for name, value in (("in_axes", in_axes), ("out_axes", out_axes)):
    flat = value if isinstance(value, tuple) else (value,)
    if any(a is not None and (not isinstance(a, int) or isinstance(a, bool)) for a in flat):
      return f"nn.vmap with {name}={value!r} (one axis or None per input is drafted)"
  size = kwargs.get("axis_size")
  if size is not None and not lift_args.known_in_init(planner, site, size):
    return "nn.vmap whose axis_size= depends on the call"
  if stacked and size is None:
    return (
      "nn.vmap with params per member and no axis_size= (the stack's size must be known "
      "in __init__)"
    )
  unsplit = _drawn_streams(planner, made) - set(split) if stacked else set()
  if unsplit:
    # Linen gives every member the same draws from a stream it does not split; the stack
    # built in __init__ gives each member its own: a difference no check can measure.
    return (
      f"nn.vmap whose members draw from {sorted(unsplit)} that split_rngs={split!r} does not "
      "split (every member gets the same draws in Linen, its own in the drafted stack); "
      "split it too, or port by hand"
    )
  first = site.lift.args[0].value
  body = dotted(first) if site.inner_lift is not None else None
  size_code = None if size is None else planner.code(size)
  return VmapPlan(
    size_code if stacked else None, in_axes, tp.cast(str, literal(out_axes)), size_code, body
  )
