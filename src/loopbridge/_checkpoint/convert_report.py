"""What `lb.checkpoint.linen_to_nnx` put where, how each pairing was decided and checked."""

from __future__ import annotations

import dataclasses
import math
import typing as tp

from .._diagnostics.compare_tolerance import ToleranceChoice
from .convert_evidence import Check
from .convert_pairs import Pair, leaf_path
from .leaf_rules import Rename


def _layers(layers: tp.Iterable[int | None]) -> str:
  found = sorted({x for x in layers if x is not None})
  if not found:
    return ""
  if found == list(range(found[0], found[-1] + 1)) and len(found) > 1:
    return f"[layers {found[0]}-{found[-1]}]"
  return f"[layer{'s' if len(found) > 1 else ''} {', '.join(map(str, found))}]"


def _where(path: tuple[str, ...], layers: tp.Iterable[int | None]) -> str:
  return " ".join(filter(None, ["/".join(path) or "<root>", _layers(layers)]))


@dataclasses.dataclass(frozen=True)
class Placement:
  """One Linen module's variables and the NNX module they went to (all layers together).

  Attributes:
    linen: the Linen module path (and its layers, for stacks).
    nnx: the NNX module path (and its layers).
    how: how the modules were paired: "name" (same path), "order" (same shapes, call
      order), "mapping" (a `mapping=` entry), "rule" (a `rules=` entry) or "shapes" (the
      only leaf transforms that fit, below a module path both sides share).
    variables: (Linen leaf, NNX leaf) per moved array, as 'collection/name' below the
      modules (several leaves joined with ', ' for a split or a fuse).
    transforms: the leaf rules that are not a plain copy, as `lb.checkpoint` calls.
    decided: "unique" (one candidate fitted), or what chose among several: "module" (the
      module alone run on its recorded inputs, or the one enclosing it in its layer where
      it cannot run alone) or "model" (the whole model run).
    candidates: how many candidates there were.
    checked: "module" (the pair's own outputs compared) or "model" (checked through the
      model's output, e.g. inside a scanned stack).
    max_abs_error: the largest absolute difference of that check.
    probes: the inputs that ruled the other candidates out ("sample", "probe 1", ...: the
      evidence runs on the sample arguments and on probes made from them or given by
      `probes=`); empty for a unique candidate.
  """

  linen: str
  nnx: str
  how: str
  variables: tuple[tuple[str, str], ...]
  transforms: tuple[str, ...] = ()
  decided: str = "unique"
  candidates: int = 1
  checked: str = "model"
  max_abs_error: float = 0.0
  probes: tuple[str, ...] = ()

  def to_dict(self) -> dict[str, object]:
    return {
      "linen": self.linen,
      "nnx": self.nnx,
      "how": self.how,
      "variables": [list(v) for v in self.variables],
      "transforms": list(self.transforms),
      "decided": self.decided,
      "candidates": self.candidates,
      "checked": self.checked,
      "max_abs_error": self.max_abs_error,
      "probes": list(self.probes),
    }


def _below(path: str, prefix: tuple[str, ...]) -> str:
  return "/".join(path.split("/")[len(prefix) :])


def _placement(group: list[tuple[Pair, Check]]) -> Placement:
  first, check = group[0]
  variables, transforms = [], []
  for move in first.moves:
    lnames = [
      f"{n[0]}/{_below(leaf_path(first.linen[i], n), first.linen_at)}" for i, n in move.linen
    ]
    nnames = [f"{n[0]}/{_below(leaf_path(first.nnx[i], n), first.nnx_at)}" for i, n in move.nnx]
    variables.append((", ".join(lnames), ", ".join(nnames)))
    if not isinstance(move.rule, Rename):
      transforms.append(str(move.rule))
  checks = [c for _, c in group]
  checked = "module" if all(c.checked == "module" for c in checks) else "model"
  return Placement(
    linen=_where(first.linen_at, [p.layer for p, _ in group]),
    nnx=_where(first.nnx_at, [p.nnx[0].layer for p, _ in group]),
    how=first.how,
    variables=tuple(variables),
    transforms=tuple(transforms),
    decided=check.decided,
    candidates=check.candidates,
    checked=checked,
    max_abs_error=max(c.max_abs_error for c in checks),
    probes=check.probes,
  )


# Why a collection of the Linen variables is left out, as the report prints it.
_SKIPPED_WHY = {
  "cache": "a decode cache is per-sequence state; the port keeps its own nnx.Cache values",
  "intermediates": "sown values are outputs of a call, not state",
}


@dataclasses.dataclass(frozen=True)
class ConversionReport:
  """What went where in one conversion, how each pair was decided and checked.

  `print` it or read `to_dict()`.

  Attributes:
    direction: "linen_to_nnx".
    placements: one entry per Linen module (its layers together), in call order.
    optimizer_arrays: how many arrays of the optimizer state were written (0 without one).
    step: the optimizer step after the conversion (None without an optimizer).
    output_error: the largest absolute difference between the port's output and the Linen
      model's on the sample arguments, after the conversion.
    layer_axes: the layer axis of each Linen stack whose depth equals a width (so that its
      shapes fitted several axes), as chosen by running, by 'stack/collection'.
    skipped: collections of the given Linen variables left out on purpose: a decode `cache`
      (per-sequence state; the port keeps its own `nnx.Cache` values) and `intermediates`.
    tolerance: the precision both models ran at and the tolerance their outputs were
      compared with, and why (a `ToleranceChoice`); None in reports built by hand.
    unproven: for `linen_to_nnx(..., check=False)` (loading for checking), what is not
      proven: the pairings chosen without evidence and where the outputs first differ;
      None for a checked conversion.
  """

  direction: str
  placements: tuple[Placement, ...]
  optimizer_arrays: int = 0
  step: int | None = None
  output_error: float = 0.0
  layer_axes: tuple[tuple[str, int], ...] = ()
  skipped: tuple[str, ...] = ()
  tolerance: ToleranceChoice | None = None
  unproven: str | None = None

  @classmethod
  def from_pairs(
    cls,
    direction: str,
    pairs: tp.Sequence[Pair],
    checks: tp.Sequence[Check],
    *,
    optimizer_arrays: int,
    step: int | None,
    output_error: float = 0.0,
    layer_axes: tp.Mapping[tuple[tuple[str, ...], str], int] | None = None,
    skipped: tp.Sequence[str] = (),
    tolerance: ToleranceChoice | None = None,
    unproven: str | None = None,
  ) -> ConversionReport:
    groups: dict[tuple[object, ...], list[tuple[Pair, Check]]] = {}
    for pair, check in zip(pairs, checks):
      groups.setdefault((pair.linen_at, pair.nnx_at, pair.key), []).append((pair, check))
    axes = tuple(("/".join((*s, c)), a) for (s, c), a in sorted((layer_axes or {}).items()))
    return cls(
      direction,
      tuple(_placement(g) for g in groups.values()),
      optimizer_arrays,
      step,
      output_error,
      axes,
      tuple(skipped),
      tolerance,
      unproven,
    )

  def to_dict(self) -> dict[str, object]:
    """The report as plain data (JSON-ready)."""
    return {
      "direction": self.direction,
      "placements": [p.to_dict() for p in self.placements],
      "optimizer_arrays": self.optimizer_arrays,
      "step": self.step,
      "output_error": self.output_error,
      "layer_axes": [list(a) for a in self.layer_axes],
      "skipped": list(self.skipped),
      "tolerance": None if self.tolerance is None else dataclasses.asdict(self.tolerance),
      "unproven": self.unproven,
    }

  def __str__(self) -> str:
    width = max((len(p.linen) for p in self.placements), default=0)
    lines = [
      f"{self.direction}: {len(self.placements)} modules, each pair checked by running both "
      f"models (output max abs error {self.output_error:.3g})"
      if self.unproven is None
      else f"{self.direction}: {len(self.placements)} modules, {self.unproven}"
    ]
    for p in self.placements:
      names = ", ".join(a.split("/", 1)[1] if a == b else f"{a} -> {b}" for a, b in p.variables)
      decided = "" if p.decided == "unique" else f", 1 of {p.candidates} by {p.decided}"
      if p.probes:
        decided += f" on {', '.join(p.probes)}"
      err = "inf" if math.isinf(p.max_abs_error) else f"{p.max_abs_error:.3g}"
      lines.append(
        f"  {p.linen:<{width}}  ->  {p.nnx}  ({p.how}{decided}: {names}; {p.checked} check, "
        f"error {err})"
      )
      lines += [f"      {t}" for t in p.transforms]
    for where, axis in self.layer_axes:
      lines.append(f"  layer axis of {where}: {axis} (chosen by running)")
    if self.step is not None:
      lines.append(f"  optimizer: {self.optimizer_arrays} arrays, step {self.step}")
    for collection in self.skipped:
      why = _SKIPPED_WHY.get(collection, "left out")
      lines.append(f"  not converted: the Linen {collection!r} collection ({why})")
    if self.tolerance is not None:
      lines.append(f"  checked with {self.tolerance.reason}")
    return "\n".join(lines)


def unproven_text(
  checks: tp.Sequence[Check], differing: tuple[tuple[str, ...], tuple[str, ...]] | None
) -> str:
  """What `linen_to_nnx(..., check=False)` leaves unproven: the pairings chosen without
  evidence, and where the outputs first differ (`differing`: Linen path, NNX path)."""
  guessed = sum(1 for c in checks if c.decided == "unproven")
  chosen = (
    f"{guessed} pairing(s) the evidence could not decide took their first candidate"
    if guessed
    else "every pairing had one candidate or was chosen by evidence"
  )
  if differing is None:
    return f"loaded without proof (check=False): {chosen}; the outputs agree"
  linen_at, nnx_at = differing
  return (
    f"loaded without proof (check=False): {chosen}; the port's output differs from the "
    f"Linen model's, first at Linen `{'/'.join(linen_at) or '<root>'}` and NNX "
    f"`{'/'.join(nnx_at) or '<root>'}`"
  )
