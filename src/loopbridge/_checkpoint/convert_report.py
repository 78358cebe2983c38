"""What `lb.checkpoint.linen_to_nnx` put where: one line per pair of modules."""

from __future__ import annotations

import dataclasses
import typing as tp

from .convert_align import Pair, Unit


def _layers(units: tp.Sequence[Unit]) -> str:
  layers = sorted({u.layer for u in units if u.layer is not None})
  if not layers:
    return ""
  if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 1:
    return f"[layers {layers[0]}-{layers[-1]}]"
  return f"[layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}]"


@dataclasses.dataclass(frozen=True)
class Placement:
  """One Linen module's variables and the NNX module they went to (all layers together)."""

  linen: str
  nnx: str
  how: str  # "name", "order" or "mapping"
  variables: tuple[tuple[str, str], ...]  # (Linen 'collection/name', NNX 'collection/name')

  def to_dict(self) -> dict[str, object]:
    return {
      "linen": self.linen,
      "nnx": self.nnx,
      "how": self.how,
      "variables": [list(v) for v in self.variables],
    }


@dataclasses.dataclass(frozen=True)
class ConversionReport:
  """What went where in one conversion; `print` it or read `to_dict()`.

  Attributes:
    direction: "linen_to_nnx".
    placements: one entry per Linen module (its layers together), in call order.
    optimizer_arrays: how many arrays of the optimizer state were written (0 without one).
    step: the optimizer step after the conversion (None without an optimizer).
  """

  direction: str
  placements: tuple[Placement, ...]
  optimizer_arrays: int = 0
  step: int | None = None

  @classmethod
  def from_pairs(
    cls, direction: str, pairs: tp.Sequence[Pair], *, optimizer_arrays: int, step: int | None
  ) -> ConversionReport:
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[Pair]] = {}
    for pair in pairs:
      groups.setdefault((pair.linen.path, pair.nnx.path), []).append(pair)
    placements = []
    for (lpath, npath), group in groups.items():
      first = group[0]
      placements.append(
        Placement(
          linen=" ".join(
            filter(None, ["/".join(lpath) or "<root>", _layers([p.linen for p in group])])
          ),
          nnx=" ".join(
            filter(None, ["/".join(npath) or "<root>", _layers([p.nnx for p in group])])
          ),
          how=first.how,
          variables=tuple((f"{lk[0]}/{lk[1]}", f"{nk[0]}/{nk[1]}") for lk, nk in first.leaves),
        )
      )
    return cls(direction, tuple(placements), optimizer_arrays, step)

  def to_dict(self) -> dict[str, object]:
    """The report as plain data (JSON-ready)."""
    return {
      "direction": self.direction,
      "placements": [p.to_dict() for p in self.placements],
      "optimizer_arrays": self.optimizer_arrays,
      "step": self.step,
    }

  def __str__(self) -> str:
    width = max((len(p.linen) for p in self.placements), default=0)
    lines = [f"{self.direction}: {len(self.placements)} modules"]
    for p in self.placements:
      names = ", ".join(a.split("/", 1)[1] if a == b else f"{a} -> {b}" for a, b in p.variables)
      lines.append(f"  {p.linen:<{width}}  ->  {p.nnx}  ({p.how}: {names})")
    if self.step is not None:
      lines.append(f"  optimizer: {self.optimizer_arrays} arrays, step {self.step}")
    return "\n".join(lines)
