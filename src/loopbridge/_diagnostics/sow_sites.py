"""`lb.sow_sites`: what a bridged model sows, where, in which shape, and what its buffers cost.

Everything here is read from the declared sites `lb.lazy_init` leaves on the model
(`loopbridge__sites`, `loopbridge__dropped`): no tracing, no FLOPs, usable on any initialized
`lb.ToNNX`. The report prints as a table and converts to plain (JSON-serializable) dicts.
"""

from __future__ import annotations

import dataclasses
import typing as tp

from flax import nnx
from flax.nnx import bridge

from .. import _compat
from .._core import recorder
from .._core.errors import NotDeclaredError
from .._core.site import DroppedSow, SowSite, Transform, with_lengths

__all__ = ["DroppedSow", "SowSite", "SowSites", "Transform", "sow_sites", "with_lengths"]


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
    """The site with this `collection/path` or (if unambiguous) `path`.

    A leaf of a sown pytree is named with its keys: `"Block_0/__call__[1]"`. A site declared
    for several call signatures is read per signature: `report.for_signature(label)[name]`.
    """
    found = [s for s in self.sites if name in (f"{s.collection}/{s.label}", s.label)]
    if len(found) > 1:
      raise KeyError(
        f"sow site {name!r} is declared for {len(found)} call signatures "
        f"({', '.join(repr(s.signature) for s in found)}). Why: each signature has its own "
        f"buffer. Fix: report.for_signature(label)[{name!r}]."
      )
    if found:
      return found[0]
    raise KeyError(f"no sow site {name!r}; sites: {[s.label for s in self.sites]}")

  @property
  def signatures(self) -> tuple[str, ...]:
    """The labels of the declared call signatures, in declaration order."""
    return tuple(dict.fromkeys(s.signature for s in sorted(self.sites, key=lambda s: s.slot)))

  def for_signature(self, label: str) -> SowSites:
    """The sites declared for one call signature (`label` as in `signatures`).

    Raises:
      KeyError: no signature has this label.
    """
    if label not in self.signatures:
      raise KeyError(
        f"no call signature {label!r}; declared: {', '.join(map(repr, self.signatures))}"
      )
    return dataclasses.replace(self, sites=tuple(s for s in self.sites if s.signature == label))

  @property
  def buffer_bytes(self) -> int:
    """Total bytes of all buffers (the integer counts add 4 bytes per site)."""
    return sum(s.buffer_bytes for s in self.sites)

  def to_dict(self) -> dict[str, object]:
    """Plain dicts, lists, strings and numbers (`json.dumps` works on it)."""
    return {
      "model": self.model,
      "sites": [s.to_dict() for s in self.sites],
      "dropped": [d.to_dict() for d in self.dropped],
      "buffer_bytes": self.buffer_bytes,
    }

  def table(self) -> str:
    """The sites as a text table, followed by any dropped sows."""
    lines = [
      f"{self.model}: {len(self.sites)} sow site(s), buffers {format_bytes(self.buffer_bytes)}"
    ]
    if self.sites:
      # One signature (the common case) needs no column; several name each site's.
      several = len({s.slot for s in self.sites}) > 1
      rows = [
        (
          *((s.signature,) if several else ()),
          s.collection,
          s.label,
          _shape_str(s.shape),
          s.dtype,
          str(s.per_call),
          " > ".join(t.label() for t in s.transforms) or "-",
          str(s.capacity),
          str(s.overflow),
          format_bytes(s.buffer_bytes),
        )
        for s in self.sites
      ]
      lines.append(
        format_table(
          (
            *(("signature",) if several else ()),
            "collection",
            "path",
            "value shape",
            "dtype",
            "per call",
            "inside",
            "capacity",
            "overflow",
            "buffer",
          ),
          rows,
        )
      )
    if self.dropped:
      lines.append(f"{len(self.dropped)} sow(s) dropped by Linen (never recorded):")
      for d in self.dropped:
        shape = "" if d.shape is None else f" {_shape_str(d.shape)} {d.dtype}"
        lines.append(
          f"  {d.module_type} at '{'/'.join(d.module_path) or '<root>'}' sows "
          f"'{d.name}' into '{d.collection}'{shape}; fix: {d.fix}"
        )
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


def format_table(
  headers: tp.Sequence[str], rows: tp.Sequence[tp.Sequence[str]], indent: str = "  "
) -> str:
  """Left-aligned columns separated by two spaces, a dashed rule under the header."""
  widths = [max(len(str(r[i])) for r in (headers, *rows)) for i in range(len(headers))]

  def line(cells):
    return (indent + "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))).rstrip()

  return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _shape_str(shape: tp.Sequence[int]) -> str:
  return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def sow_sites(model: nnx.Module) -> SowSites:
  """Describe every sow site of an initialized `lb.ToNNX`: shapes, lifting, capacity, memory.

  Reads what `lb.lazy_init` / `lb.preallocate` declared; runs nothing. One record per site
  (collection, path, recorded value shape and dtype, values per call, the enclosing
  `nn.scan` / `nn.vmap` / `nn.remat` with stacked axis and length, capacity, buffer bytes),
  plus the sows Linen dropped because a lifted transform does not carry their collection.
  A sown pytree (tuple, dict, struct dataclass) has one record per array leaf, since each
  leaf has its own buffer: its `label` adds the leaf's keys (`"Block_0/__call__[1]"`), its
  `treedef` is the sown structure; `name` (the key `capacity=` uses) is the sow's path.

  Args:
    model: an `lb.ToNNX` after `lb.lazy_init`.

  Returns:
    A `SowSites` report: iterate it for `SowSite` records, `str()` it for a table,
    `.to_dict()` it for plain (JSON-serializable) data.

  Raises:
    TypeError: `model` is not an `lb.ToNNX`.
    NotDeclaredError: `model` was not initialized yet.

  Examples:
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
  if not isinstance(model, bridge.ToNNX) or recorder.BUFFERS_ATTR not in vars(model):
    raise TypeError(
      f"lb.sow_sites needs an lb.ToNNX, got {type(model).__name__}. Fix: wrap the Linen module "
      "with lb.ToNNX(module, rngs=nnx.Rngs(0)) and call lb.lazy_init(model, *sample_args, "
      "capacity=N) first."
    )
  sites = recorder.sites_of(model)
  name = type(_compat.linen_module_of(model)).__name__
  if sites is None:
    raise NotDeclaredError(
      f"lb.sow_sites: lb.ToNNX({name}) is not initialized, so its sow sites are not known "
      "yet. Why: sites are found from a call with sample inputs. Fix: "
      "lb.lazy_init(model, *sample_args, capacity=N) first."
    )
  return SowSites(
    model=name, sites=tuple(sites), dropped=tuple(vars(model).get(recorder.DROPPED_ATTR, ()))
  )
