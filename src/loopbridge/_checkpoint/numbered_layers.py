"""Repeated layers that the two models number under other names: member i pairs with member i.

A Linen model names the blocks it builds in a loop `layer_0, layer_1, ...` (or `Block_0`,
`h_0`, ...); its port holds them in a list `self.layers` (`layers/0`, named `layers_0` as
Linen would) or under another stem. Where no name pairs them, leftover leaves would be
grouped under the deepest module both sides share, the root, and every layer's leaves
(four fused `[2, D, F]` gates and eight Linears) matched against every other layer's: a
product of candidates that no evidence can run. The numbering is structure: a family of
numbered siblings on one side pairs with one on the other when both hang under the same
parent, carry the same numbers (two or more), and each pair of members holds as many
elements of each collection and dtype (what leaf transforms keep). Only a family that
exactly one family of the other side fits is paired, so each layer's leftovers are matched
within that layer, and decided by its own module call; the evidence still checks each.
"""

from __future__ import annotations

import collections
import re
import typing as tp

import numpy as np

from .convert_align import Unit

_NUMBERED = re.compile(r"(.*?)_?(\d+)")

Sizes = collections.Counter[tuple[str, str]]  # elements per (collection, dtype)
# (parent's relative name, stem) -> number -> (the member's own name, the sizes below it)
Families = dict[tuple[str, str], dict[int, tuple[str, Sizes]]]


def _families(units: tp.Sequence[Unit], names: tp.Sequence[str]) -> Families:
  """The numbered siblings among the modules above `units` (`names`: each unit's relative
  path, as Linen names it)."""
  found: Families = {}
  for unit, name in zip(units, names):
    parts = name.split("/") if name else []
    for depth, part in enumerate(parts[:-1] if parts else []):
      numbered = _NUMBERED.fullmatch(part)
      if numbered is None:
        continue
      family = ("/".join(parts[:depth]), numbered.group(1))
      members = found.setdefault(family, {})
      _, sizes = members.setdefault(int(numbered.group(2)), (part, collections.Counter()))
      for (collection, _), leaf in unit.leaves.items():
        sizes[(collection, str(leaf.dtype))] += int(np.prod(leaf.shape))
  return found


def numbered_aliases(
  linen: tp.Sequence[Unit],
  linen_names: tp.Sequence[str],
  nnx: tp.Sequence[Unit],
  nnx_names: tp.Sequence[str],
) -> dict[str, str]:
  """Linen member name -> NNX member name (relative, as Linen names them) for each pair of
  numbered families that fit each other and nothing else (see the module's rule)."""
  lfam, nfam = _families(linen, linen_names), _families(nnx, nnx_names)

  def fits(a: tuple[str, str], b: tuple[str, str]) -> bool:
    la, nb = lfam[a], nfam[b]
    same = la.keys() == nb.keys() and all(la[k][1] == nb[k][1] for k in la)
    return a[0] == b[0] and a[1] != b[1] and len(la) > 1 and same

  aliases: dict[str, str] = {}
  for lf in lfam:
    found = [nf for nf in nfam if fits(lf, nf)]
    if len(found) != 1 or sum(fits(other, found[0]) for other in lfam) != 1:
      continue
    prefix = f"{lf[0]}/" if lf[0] else ""
    for number, (name, _) in lfam[lf].items():
      aliases[prefix + name] = prefix + nfam[found[0]][number][0]
  return aliases


def aliased(name: str, aliases: tp.Mapping[str, str]) -> str:
  """A Linen relative module name with its longest aliased prefix replaced by the NNX one."""
  parts = name.split("/")
  for depth in range(len(parts), 0, -1):
    head = "/".join(parts[:depth])
    if head in aliases:
      return "/".join([aliases[head], *parts[depth:]])
  return name
