"""Deciding an open pair through the module that encloses it, one layer at a time.

A pair whose own module cannot run alone on what the source module saw (a gemma `Einsum`
called with an equation string, an `nnx.Einsum` called without one) would otherwise be
decided on the whole model, its candidates multiplied by every other layer's: a square
`[2, 2, D, H]` kv kernel that may be stored transposed gives `2 ** layers` runs, and a deep
model more than the converter tries. The modules around it usually can run alone: the
attention block both sides call as `attn(x, positions, cache, mask)`, or the layer. Their
paths are the pair's with the same trailing names taken off both sides (`layer_0/attn/kv`
and `layers/0/attn/kv` -> `layer_0/attn` and `layers/0/attn`). The open pairs below such a
module pair are decided together, with that module alone on each input's recorded call
(every combination of their candidates, up to `MAX_OPTIONS`): one agreeing conversion
decides them; several narrow them for the model's runs; none leaves them to the model.
"""

from __future__ import annotations

import itertools
import math
import typing as tp

import numpy as np

from .convert_match import MAX_OPTIONS, Pair

Path = tuple[str, ...]
# The evidence's own types (`convert_evidence`, which calls this module), named here by what
# this module reads of them: importing them, even for the type checker only, would be an import
# cycle (tests/test_layering.py).
Groups = dict[tuple[object, ...], list[int]]
Decided = dict[tuple[object, ...], tuple[str, tuple[str, ...]]]
Record = tp.Any  # a recorded module call: `.out` and what `Sides.apply_target` reads
Ran = tuple[object, dict[Path, tp.Any]]
Sides = tp.Any  # convert_evidence.Sides: forward, inputs, convert, target_path, apply_target, ...


def _enclosing(pair: Pair) -> list[tuple[Path, Path]]:
  """The module pairs around `pair` (Linen path, NNX path), innermost first."""
  linen, port = pair.linen_at, pair.nnx_at
  found = []
  while linen and port and linen[-1] == port[-1]:
    linen, port = linen[:-1], port[:-1]
    if linen and port:
      found.append((linen, port))
  return found


def _in(path: Path, prefix: Path) -> bool:
  return path[: len(prefix)] == prefix


def by_enclosing(
  pairs: list[Pair],
  groups: Groups,
  open_keys: list[tuple[object, ...]],
  sides: Sides,
  refs: list[Ran],
  decided_by: Decided,
  narrowed: dict[tuple[object, ...], list[int]],
  agrees: tp.Callable[[object, object], bool],
) -> None:
  """Decide (or narrow) open single pairs through their enclosing modules, innermost first;
  fills `decided_by` and `narrowed` as `_by_module` does."""
  single = [k for k in open_keys if len(groups[k]) == 1]
  around = {m for k in single for m in _enclosing(pairs[groups[k][0]])}
  for linen_at, nnx_at in sorted(around, key=lambda m: -len(m[1])):
    source_at, target_at = (linen_at, nnx_at) if sides.forward else (nnx_at, linen_at)
    keys = [
      k
      for k in single
      if k not in decided_by
      and _in(pairs[groups[k][0]].linen_at, linen_at)
      and _in(pairs[groups[k][0]].nnx_at, nnx_at)
    ]
    records = [ran[1].get(source_at) for ran in refs]
    if not keys or any(r is None for r in records):
      continue
    choices = [narrowed.get(k, list(range(len(pairs[groups[k][0]].options)))) for k in keys]
    if math.prod(len(c) for c in choices) > MAX_OPTIONS:
      continue
    before = [pairs[groups[k][0]].chosen for k in keys]
    agreeing = _agreeing(pairs, groups, keys, choices, sides, target_at, records, agrees)
    if agreeing is None or not agreeing[0]:
      for key, chosen in zip(keys, before):  # undecided here: as it was
        pairs[groups[key][0]].chosen = chosen
      if agreeing is not None:
        sides.note_off_sample(source_at, agreeing[1])
      continue
    combos, rejected = agreeing
    for n, key in enumerate(keys):
      options = sorted({combo[n] for combo in combos})
      pairs[groups[key][0]].chosen = options[0]
      if len(combos) == 1:
        decided_by[key] = ("module", tuple(i.name for i in sides.inputs if i.name in rejected))
        narrowed.pop(key, None)
      else:
        narrowed[key] = options


def _agreeing(
  pairs: list[Pair],
  groups: Groups,
  keys: list[tuple[object, ...]],
  choices: list[list[int]],
  sides: Sides,
  target_at: Path,
  records: list[Record | None],
  agrees: tp.Callable[[object, object], bool],
) -> tuple[list[tuple[int, ...]], set[str]] | None:
  """The combinations whose values make the target module alone agree on every input (one
  per distinct set of values), and the inputs that ruled the others out; None where the
  module does not run alone on these inputs."""
  nearby = [p for p in pairs if _in(sides.target_path(p), target_at)]
  kept: list[tuple[tuple[int, ...], dict]] = []
  rejected: set[str] = set()
  try:
    for combo in itertools.product(*choices):
      for key, option in zip(keys, combo):
        pairs[groups[key][0]].chosen = option
      values = {
        k: v for k, v in sides.convert(nearby, {}).items() if k[1 : 1 + len(target_at)] == target_at
      }
      for given, record in zip(sides.inputs, records):
        record = tp.cast(Record, record)
        if not agrees(record.out, sides.apply_target(target_at, values, record)):
          rejected.add(given.name)
          break
      else:
        if not any(_same(values, v) for _, v in kept):
          kept.append((combo, values))
  except Exception:  # the module does not run alone on these inputs: the model decides
    return None
  return [combo for combo, _ in kept], rejected


def _same(a: tp.Mapping, b: tp.Mapping) -> bool:
  return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
