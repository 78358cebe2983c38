"""`lb.sow_sites`: what a bridged model sows, where, in which shape, and what its buffers cost.

Everything here is read from the static site description `lb.lazy_init` leaves on the model
(`loopbridge__sites`, `loopbridge__dropped`): no tracing, no FLOPs, usable on any initialized
`lb.ToNNX`. The report prints as a table and converts to plain (JSON-serializable) dicts.
"""

from __future__ import annotations

import dataclasses
import math
import typing as tp

import numpy as np

from . import _compat
from ._errors import NotInitializedError

# Lifted transforms that add an axis to the collections they carry.
_STACKING = ("scan", "vmap")


@dataclasses.dataclass(frozen=True)
class Transform:
  """One Linen lifted transform enclosing a sow site (outermost first in `SowSite.transforms`).

  `axis`/`length` describe the axis it stacks the sown values along in the recorded value
  (`None` for transforms that add none, such as `nn.remat`, or when it cannot be told apart).
  """

  kind: str  # "scan", "vmap", "remat", "jit", ...
  path: tuple[str, ...]  # Linen path of the transformed module
  axis: int | None
  length: int | None
  reverse: bool = False

  def label(self) -> str:
    if self.kind not in _STACKING:
      return self.kind
    axis = "?" if self.axis is None else self.axis
    length = "?" if self.length is None else self.length
    return f"{self.kind}(axis={axis}, len={length}{', reverse' if self.reverse else ''})"

  def to_dict(self) -> dict[str, tp.Any]:
    return {"kind": self.kind, "path": "/".join(self.path), "axis": self.axis,
            "length": self.length, "reverse": self.reverse}


@dataclasses.dataclass(frozen=True)
class SowSite:
  """One recorded sow site of an `lb.ToNNX`: what one value looks like and what its buffer holds."""

  collection: str
  path: tuple[str, ...]  # inside the collection, as in `lb.recorded(model)[collection]`
  shape: tuple[int, ...]  # one recorded value (including axes added by nn.scan / nn.vmap)
  dtype: str
  sown_shape: tuple[int, ...] | None  # the shape passed to `sow` inside the module
  per_call: int  # values one call adds
  transforms: tuple[Transform, ...]  # enclosing lifted transforms, outermost first
  capacity: int
  overflow: str
  buffer_bytes: int  # capacity * value size

  @property
  def name(self) -> str:
    """The `/`-joined path inside the collection (the key `capacity=` mappings use)."""
    return "/".join(self.path)

  @property
  def lifted(self) -> bool:
    """Whether the site lies inside an `nn.scan` / `nn.vmap` that stacks its values."""
    return any(t.kind in _STACKING for t in self.transforms)

  @property
  def calls_to_fill(self) -> int:
    """Calls the buffer holds before it is full."""
    return self.capacity // self.per_call if self.per_call else self.capacity

  def to_dict(self) -> dict[str, tp.Any]:
    return {
        "collection": self.collection, "path": self.name, "shape": list(self.shape),
        "dtype": self.dtype,
        "sown_shape": None if self.sown_shape is None else list(self.sown_shape),
        "per_call": self.per_call, "lifted": self.lifted,
        "in_scan": any(t.kind == "scan" for t in self.transforms),
        "in_vmap": any(t.kind == "vmap" for t in self.transforms),
        "transforms": [t.to_dict() for t in self.transforms], "capacity": self.capacity,
        "overflow": self.overflow, "calls_to_fill": self.calls_to_fill,
        "buffer_bytes": self.buffer_bytes,
    }


@dataclasses.dataclass(frozen=True)
class DroppedSow:
  """A `sow` Linen discarded: an enclosing lifted transform does not carry its collection."""

  collection: str
  module_path: tuple[str, ...]  # Linen path of the module calling `sow`
  name: str
  module_type: str
  shape: tuple[int, ...] | None
  dtype: str | None
  dropped_by: Transform | None  # the innermost transform not carrying the collection

  @property
  def fix(self) -> str:
    where = (f"the nn.{self.dropped_by.kind} at '{'/'.join(self.dropped_by.path) or '<root>'}'"
             if self.dropped_by is not None else "the enclosing lifted transform")
    return f"add '{self.collection}': 0 to the variable_axes of {where}"

  def to_dict(self) -> dict[str, tp.Any]:
    return {
        "collection": self.collection, "module_path": "/".join(self.module_path),
        "name": self.name, "module_type": self.module_type,
        "shape": None if self.shape is None else list(self.shape), "dtype": self.dtype,
        "dropped_by": None if self.dropped_by is None else self.dropped_by.to_dict(),
        "fix": self.fix,
    }


@dataclasses.dataclass(frozen=True)
class SowSites:
  """The sow sites (and dropped sows) of one model: a table with `str()`, dicts with `to_dict()`."""

  model: str  # the Linen module's class name
  sites: tuple[SowSite, ...]
  dropped: tuple[DroppedSow, ...]

  def __iter__(self) -> tp.Iterator[SowSite]:
    return iter(self.sites)

  def __len__(self) -> int:
    return len(self.sites)

  def __getitem__(self, name: str) -> SowSite:
    """The site with this `collection/path` or (if unambiguous) `path`."""
    for site in self.sites:
      if name in (f"{site.collection}/{site.name}", site.name):
        return site
    raise KeyError(f"no sow site {name!r}; sites: {[s.name for s in self.sites]}")

  @property
  def buffer_bytes(self) -> int:
    """Total bytes of all buffers (the integer counts add 4 bytes per site)."""
    return sum(s.buffer_bytes for s in self.sites)

  def to_dict(self) -> dict[str, tp.Any]:
    """Plain dicts, lists, strings and numbers (`json.dumps` works on it)."""
    return {"model": self.model, "sites": [s.to_dict() for s in self.sites],
            "dropped": [d.to_dict() for d in self.dropped], "buffer_bytes": self.buffer_bytes}

  def table(self) -> str:
    """The sites as a text table, followed by any dropped sows."""
    lines = [f"{self.model}: {len(self.sites)} sow site(s), buffers "
             f"{format_bytes(self.buffer_bytes)}"]
    if self.sites:
      rows = [(s.collection, s.name, _shape_str(s.shape), s.dtype, str(s.per_call),
               " > ".join(t.label() for t in s.transforms) or "-",
               str(s.capacity), s.overflow, format_bytes(s.buffer_bytes))
              for s in self.sites]
      lines.append(format_table(
          ("collection", "path", "value shape", "dtype", "per call", "inside", "capacity",
           "overflow", "buffer"), rows))
    if self.dropped:
      lines.append(f"{len(self.dropped)} sow(s) dropped by Linen (never recorded):")
      for d in self.dropped:
        shape = "" if d.shape is None else f" {_shape_str(d.shape)} {d.dtype}"
        lines.append(f"  {d.module_type} at '{'/'.join(d.module_path) or '<root>'}' sows "
                     f"'{d.name}' into '{d.collection}'{shape}; fix: {d.fix}")
    return "\n".join(lines)

  def __str__(self) -> str:
    return self.table()


def format_bytes(n: int) -> str:
  """`1536` -> `'1.5 KiB'`."""
  value = float(n)
  for unit in ("B", "KiB", "MiB", "GiB"):
    if value < 1024 or unit == "GiB":
      return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
    value /= 1024
  raise AssertionError("unreachable")


def format_table(headers: tp.Sequence[str], rows: tp.Sequence[tp.Sequence[str]],
                 indent: str = "  ") -> str:
  """Left-aligned columns separated by two spaces, a dashed rule under the header."""
  widths = [max(len(str(r[i])) for r in (headers, *rows)) for i in range(len(headers))]

  def line(cells):
    return (indent + "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))).rstrip()

  return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _shape_str(shape: tp.Sequence[int]) -> str:
  return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _stacking(lifts: tp.Sequence[tp.Any], shape: tuple[int, ...],
              sown_shape: tuple[int, ...] | None) -> tuple[Transform, ...]:
  """Transforms with the length of each stacked axis (and the axis, where discovery missed it)."""
  stacking = [i for i, t in enumerate(lifts) if t.kind in _STACKING and t.carries]
  axes: dict[int, int | None] = {i: lifts[i].axis for i in stacking}
  lengths: dict[int, int | None] = {i: None for i in stacking}
  if sown_shape is not None and len(shape) == len(sown_shape) + len(stacking):
    rest = list(shape)
    if all(axes[i] is not None for i in stacking):
      # Outermost transform first: its axis indexes the final value; removing it gives the
      # value as the next transform inward produced it.
      ok = True
      for i in stacking:
        axis = axes[i] % len(rest) if rest else 0
        if axis >= len(rest):
          ok = False
          break
        lengths[i] = rest.pop(axis)
      if not ok or tuple(rest) != tuple(sown_shape):
        lengths = {i: None for i in stacking}
    elif len(stacking) == 1:
      # Axis unknown (e.g. a transform discovery did not see): where one axis can be removed
      # to give the sown shape. Adjacent equal sizes leave the position ambiguous (None).
      (i,) = stacking
      candidates = [a for a in range(len(shape))
                    if shape[:a] + shape[a + 1:] == tuple(sown_shape)]
      if candidates:
        lengths[i] = shape[candidates[0]]
        axes[i] = candidates[0] if len(candidates) == 1 else None
  return tuple(
      Transform(t.kind, tuple(t.path), axes.get(i) if i in axes else None, lengths.get(i),
                bool(t.reverse) if t.kind == "scan" else False)
      for i, t in enumerate(lifts))


def sow_sites(model: tp.Any) -> SowSites:
  """Describe every sow site of an initialized `lb.ToNNX`: shapes, lifting, capacity, memory.

  Reads what `lb.lazy_init` / `lb.preallocate` declared; runs nothing. One record per site
  (collection, path, recorded value shape and dtype, values per call, the enclosing
  `nn.scan` / `nn.vmap` / `nn.remat` with stacked axis and length, capacity, buffer bytes),
  plus the sows Linen dropped because a lifted transform does not carry their collection.

  Args:
    model: an `lb.ToNNX` after `lb.lazy_init`.

  Returns:
    A `SowSites` report: iterate it for `SowSite` records, `str()` it for a table,
    `.to_dict()` it for plain (JSON-serializable) data.

  Raises:
    TypeError: `model` is not an `lb.ToNNX`.
    NotInitializedError: `model` was not initialized yet.

  Example:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), jnp.ones((1, 3)), capacity=4)
    >>> site = lb.sow_sites(model)["x"]
    >>> site.shape, site.per_call, site.buffer_bytes
    ((1, 3), 1, 48)
  """
  from ._to_nnx import ToNNX  # late: _to_nnx is the heavier module and does not need this one

  if not isinstance(model, ToNNX):
    raise TypeError(
        f"lb.sow_sites needs an lb.ToNNX, got {type(model).__name__}. Fix: wrap the Linen module "
        "with lb.ToNNX(module, rngs=nnx.Rngs(0)) and call lb.lazy_init(model, *sample_args, "
        "capacity=N) first.")
  infos = model.loopbridge__sites
  name = type(_compat.linen_module_of(model)).__name__
  if infos is None:
    raise NotInitializedError(
        f"lb.sow_sites: lb.ToNNX({name}) is not initialized, so its sow sites are not known "
        "yet. Why: sites are found from a call with sample inputs. Fix: "
        "lb.lazy_init(model, *sample_args, capacity=N) first.")
  sites = []
  for info in infos:
    size = math.prod(info.shape) * np.dtype(info.dtype).itemsize
    sites.append(SowSite(
        collection=info.collection, path=tuple(info.path), shape=tuple(info.shape),
        dtype=str(info.dtype), sown_shape=None if info.sown_shape is None else tuple(info.sown_shape),
        per_call=info.per_call, transforms=_stacking(info.lifts, tuple(info.shape),
                                                     info.sown_shape),
        capacity=info.capacity, overflow=info.overflow, buffer_bytes=info.capacity * size))
  dropped = []
  for call in getattr(model, "loopbridge__dropped", ()):
    culprit = next((t for t in reversed(call.lifts) if not t.carries), None)
    dropped.append(DroppedSow(
        collection=call.collection, module_path=tuple(call.module_path), name=call.name,
        module_type=call.module_type, shape=call.shape, dtype=call.dtype,
        dropped_by=None if culprit is None else Transform(culprit.kind, tuple(culprit.path),
                                                          None, None, culprit.reverse)))
  return SowSites(model=name, sites=tuple(sites), dropped=tuple(dropped))
