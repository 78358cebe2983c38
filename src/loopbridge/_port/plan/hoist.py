"""One attribute the port builds in `__init__`, and how the trace's submodules pair with sites."""

from __future__ import annotations

import dataclasses
import typing as tp

from flax import linen as nn

from ..trace.trace import Instance
from .find_sites import Site
from .source import ClassSource


@dataclasses.dataclass
class Hoist:
  """One attribute of the port built in `__init__` (or a list of them, built by a loop)."""

  attr: str
  site: Site
  children: dict[tuple[str, ...], list[Instance]]  # parent instance path -> made in order
  is_list: bool
  call_kwargs: list[str] = dataclasses.field(default_factory=list)  # moved to the call
  # (NNX attribute, expression): settings read from the call, set before each call
  call_settings: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  index: str | None = None  # the loop variable indexing the list at the call
  post: list[str] = dataclasses.field(default_factory=list)  # `__init__` lines after it
  counter: bool = False  # built in nested loops: indexed by a running count
  # A `scan_lift.ScanPlan` / `vmap_lift.VmapPlan` when built through nn.scan / nn.vmap.
  lifted: tp.Any = None

  def __post_init__(self) -> None:
    from ..transforms.dotted_names import attribute_name

    self.attr = attribute_name(self.attr)


def match_child(site: Site, src: ClassSource, child: Instance) -> bool:
  """Whether the trace saw `child` called by this construction (or by the local it went to)."""
  if child.called_at is None or child.called_at[0] != src.file or child.cls is not site.target:
    return False
  line = child.called_at[1]
  return any(
    src.line(first) <= line <= src.line(last) for first, last in [site.lines, *site.local_lines]
  )


def handed_in(parent: Instance, kid: Instance) -> bool:
  """`kid` was handed to `parent` as a dataclass field (Linen adopts it under the field's
  name): no construction in the parent's source made it, though the parent calls it."""
  name = kid.path[-1]
  fields = {f.name for f in dataclasses.fields(parent.module)}
  return name in fields and isinstance(getattr(parent.module, name, None), nn.Module)


def list_local(planner: tp.Any, hoist: Hoist) -> str:
  """The local `__init__` fills with a loop's layers: the list's attribute name, unless that
  name means something there (the layers' own class, `Encoder1DBlock_0, ...` making the list
  `Encoder1DBlock`; a global; a local of the method)."""
  clash = hoist.attr in planner.init_namespace or hoist.attr in planner.aliases.get(
    hoist.site.method, {}
  )
  return f"{hoist.attr}_layers" if clash else hoist.attr
