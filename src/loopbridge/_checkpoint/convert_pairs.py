"""The pairing's records: a `Move` of leaves by one leaf rule and a `Pair` of units with its
candidate moves, and the path a rule or a mapping names a leaf by."""

from __future__ import annotations

import dataclasses
import typing as tp

from .convert_align import LeafName, Unit
from .leaf_rules import LeafRule

# More candidates than this for one pair: the error asks for a rule instead of trying them.
MAX_OPTIONS = 64


# (index into Pair.linen or Pair.nnx, leaf name)
Ref = tuple[int, LeafName]


@dataclasses.dataclass(frozen=True)
class Move:
  """Some Linen leaves of one pair become some NNX leaves of it, by `rule`."""

  rule: LeafRule
  linen: tuple[Ref, ...]
  nnx: tuple[Ref, ...]


@dataclasses.dataclass
class Pair:
  """Linen units of one layer and the NNX units holding the same numbers.

  `options` are the candidate ways the leaves move (one when names or shapes leave no
  choice); `chosen` is the one the evidence kept. Pairs of one stack share `key`, so every
  layer is decided alike. `linen_at` / `nnx_at` are the modules whose calls check the pair.
  """

  linen: tuple[Unit, ...]
  nnx: tuple[Unit, ...]
  linen_at: tuple[str, ...]
  nnx_at: tuple[str, ...]
  how: str  # "name", "order", "mapping", "rule" or "shapes"
  options: list[tuple[Move, ...]]
  key: tuple[object, ...]
  chosen: int = 0
  # Pairs made by call order among units of equal shapes share a class: every assignment
  # within the class becomes an option of one class pair (`class_pairs`).
  order_class: tuple[object, ...] | None = None
  # A class pair: per option, the NNX unit each Linen unit goes to (indices into `nnx`).
  assignments: list[tuple[int, ...]] | None = None

  @property
  def moves(self) -> tuple[Move, ...]:
    return self.options[self.chosen]

  @property
  def layer(self) -> int | None:
    return self.linen[0].layer


def leaf_path(unit: Unit, name: LeafName) -> str:
  """The path a rule or a mapping names a leaf by: module path and variable name."""
  return "/".join((*unit.path, name[1]))


def common_path(paths: tp.Iterable[tuple[str, ...]]) -> tuple[str, ...]:
  paths = list(paths)
  out: list[str] = []
  for parts in zip(*paths):
    if len(set(parts)) != 1:
      break
    out.append(parts[0])
  return tuple(out)
