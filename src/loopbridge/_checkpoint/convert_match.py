"""Which Linen leaves become which NNX leaves: every candidate, none chosen by order alone.

The units of both models (`convert_align`) are paired in this order:
1. `rules=` and leaf-level `mapping=` entries (`'ln/scale': 'norm/alpha'`) take their leaves;
2. module-level `mapping=` entries pair the units below them (an entry whose units stay
   unpaired is an error naming it);
3. units with the same path pair; then units with the same shapes, in call order;
4. what is left is grouped under the deepest module path both sides share (numbered layers
   named otherwise, `layer_0` and a list's `layers/0`, pair by number: `numbered_layers`), and
   each group's leaves are matched by leaf transforms (`leaf_rules`: split, fuse, reshape,
   transpose).

Within a pair, leaves with the same name pair. Where leaves of equal shapes have other names,
or a group admits several transforms, every candidate is kept (`Pair.options`) for
`convert_evidence` to decide by running the models. Nothing here picks one by order. The
records are `convert_pairs`', the ways two units' leaves pair `convert_leaf_options`', and
the pairs made by call order among units of equal shapes `convert_classes`'.
"""

from __future__ import annotations

import dataclasses
import typing as tp

from .._core.errors import CheckpointError
from .._core.site import linen_key
from .convert_align import LeafName, Unit
from .convert_classes import class_pairs, unit_pair, unit_signature
from .convert_leaf_options import leaf_covers, leaf_options
from .convert_pairs import MAX_OPTIONS, Move, Pair, Ref, common_path, leaf_path
from .leaf_rules import LeafRule, Rename, match
from .numbered_layers import aliased, numbered_aliases


def _distinct(units: tp.Iterable[Unit]) -> list[Unit]:
  seen: set[int] = set()
  return [u for u in units if not (id(u) in seen or seen.add(id(u)))]


def _pair(
  lrefs: tp.Sequence[tuple[Unit, LeafName]],
  nrefs: tp.Sequence[tuple[Unit, LeafName]],
  how: str,
  options_of: tp.Callable[
    [tp.Callable[[Unit, LeafName], Ref], tp.Callable[[Unit, LeafName], Ref]], list[tuple[Move, ...]]
  ],
  key: tuple[object, ...],
  linen_units: tp.Sequence[Unit] = (),
  nnx_units: tp.Sequence[Unit] = (),
) -> Pair:
  lu = _distinct([u for u, _ in lrefs] + list(linen_units))
  nu = _distinct([u for u, _ in nrefs] + list(nnx_units))
  lidx = {id(u): i for i, u in enumerate(lu)}
  nidx = {id(u): i for i, u in enumerate(nu)}
  options = options_of(lambda u, n: (lidx[id(u)], n), lambda u, n: (nidx[id(u)], n))
  return Pair(
    tuple(lu),
    tuple(nu),
    common_path(u.path for u in lu),
    common_path(u.path for u in nu),
    how,
    options,
    key,
  )


# --- rules and leaf-level mapping entries ---------------------------------------------------


def _by_path(units: tp.Sequence[Unit]) -> dict[str, list[tuple[Unit, LeafName]]]:
  found: dict[str, list[tuple[Unit, LeafName]]] = {}
  for unit in units:
    for name in unit.leaves:
      found.setdefault(leaf_path(unit, name), []).append((unit, name))
  return found


def _find(pattern: str, paths: tp.Iterable[str]) -> dict[tuple[str, ...], str]:
  found = {}
  for path in paths:
    groups = match(pattern, path)
    if groups is not None:
      found.setdefault(groups, path)
  return found


def _rule_pairs(
  rule: LeafRule,
  label: str,
  lpaths: dict[str, list[tuple[Unit, LeafName]]],
  npaths: dict[str, list[tuple[Unit, LeafName]]],
  used: set[tuple[int, LeafName]],
  index: int,
) -> list[Pair]:
  """The pairs one rule makes (one per layer and per match of its `*`)."""
  lfound = [_find(p, lpaths) for p in rule.linen]
  nfound = [_find(p, npaths) for p in rule.nnx]
  captures = set(lfound[0])
  for found in lfound[1:] + nfound:
    captures &= set(found)
  if not captures:
    missing = [
      f"{side} {p!r}"
      for side, patterns, founds in (("Linen", rule.linen, lfound), ("NNX", rule.nnx, nfound))
      for p, f in zip(patterns, founds)
      if not f
    ]
    raise CheckpointError(
      f"{label} matches no leaves"
      + (f" ({', '.join(missing)} match nothing)" if missing else " with equal `*` parts")
      + f". Leaf paths are module path and variable name, e.g. Linen "
      f"{sorted(lpaths)[:6]}, NNX {sorted(npaths)[:6]}."
    )
  pairs = []
  for groups in sorted(captures):
    lrefs_by = [lpaths[f[groups]] for f in lfound]
    nrefs_by = [npaths[f[groups]] for f in nfound]
    layers = [{u.layer for u, _ in refs} for refs in lrefs_by + nrefs_by]
    if any(ls != layers[0] for ls in layers):
      raise CheckpointError(
        f"{label} pairs leaves of stacks of other depths "
        f"({[sorted(map(str, ls)) for ls in layers]}). A rule moves arrays layer by layer "
        "between stacks of equal depth; convert the stack with lb.layers.stack_params / "
        "unstack_params first."
      )
    for layer in sorted(layers[0], key=lambda x: -1 if x is None else x):
      lrefs = [next(r for r in refs if r[0].layer == layer) for refs in lrefs_by]
      nrefs = [next(r for r in refs if r[0].layer == layer) for refs in nrefs_by]
      for unit, name in lrefs + nrefs:
        if (id(unit), name) in used:
          raise CheckpointError(
            f"{label}: the leaf `{leaf_path(unit, name)}` is taken by another rule or mapping "
            "entry; each leaf moves once."
          )
        used.add((id(unit), name))
      lleaves = [u.leaves[n] for u, n in lrefs]
      nleaves = [u.leaves[n] for u, n in nrefs]
      shapes = ([x.shape for x in lleaves], [x.shape for x in nleaves])
      kinds = {(n[0], leaf.dtype) for (_, n), leaf in zip(lrefs + nrefs, lleaves + nleaves)}
      if len(kinds) > 1 or not rule.fits(*shapes):
        raise CheckpointError(
          f"{label} cannot move Linen "
          + ", ".join(
            f"`{leaf_path(u, n)}` {leaf.dtype}{list(leaf.shape)}"
            for (u, n), leaf in zip(lrefs, lleaves)
          )
          + " into NNX "
          + ", ".join(
            f"`{leaf_path(u, n)}` {leaf.dtype}{list(leaf.shape)}"
            for (u, n), leaf in zip(nrefs, nleaves)
          )
          + " (the shapes do not fit it, or the collections or dtypes differ; values are never "
          "cast). Fix the rule: rename for equal shapes, reshape for equal sizes, transpose, "
          "split or fuse along the axis that differs."
        )

      def options(lref, nref, lrefs=lrefs, nrefs=nrefs):
        return [
          (Move(rule, tuple(lref(u, n) for u, n in lrefs), tuple(nref(u, n) for u, n in nrefs)),)
        ]

      how = "mapping" if label.startswith("mapping") else "rule"
      pairs.append(_pair(lrefs, nrefs, how, options, ("rule", index)))
  return pairs


def _reduced(units: tp.Sequence[Unit], used: set[tuple[int, LeafName]]) -> list[Unit]:
  """The units without the leaves rules took (units left empty are dropped)."""
  out = []
  for unit in units:
    leaves = {n: leaf for n, leaf in unit.leaves.items() if (id(unit), n) not in used}
    if len(leaves) == len(unit.leaves):
      out.append(unit)
    elif leaves:
      out.append(dataclasses.replace(unit, leaves=leaves))
  return out


# --- leftovers: leaf transforms within a group ----------------------------------------------


def _rel_name(path: tuple[str, ...]) -> str:
  """A module path named as Linen names it (an NNX list entry `layers/0` as `layers_0`)."""
  return "/".join(linen_key(tuple(int(p) if p.isdigit() else p for p in path)))


def _named_under(path: tuple[str, ...], name: str) -> bool:
  """Whether the module at `path`, named as Linen names it, is `name` or below it."""
  rel = _rel_name(path)
  return not name or rel == name or rel.startswith(name + "/")


def _named_path(path: tuple[str, ...], np_: tuple[str, ...], name: str) -> tuple[str, ...]:
  """The prefix of an NNX `path` (below `np_`) that Linen would name `name`."""
  for k in range(len(path) - len(np_) + 1):
    if _rel_name(path[len(np_) : len(np_) + k]) == name:
      return path[: len(np_) + k]
  return np_


def _group_pairs(
  lunits: list[Unit], nunits: list[Unit], lp: tuple[str, ...], np_: tuple[str, ...], how: str
) -> tuple[list[Pair], list[Unit], list[Unit]]:
  """Pairs of the units no unit pairs with, grouped under the deepest module path both sides
  share, matched by leaf transforms; and the units left over."""
  pairs: list[Pair] = []
  free_l, free_n = list(lunits), list(nunits)
  # Numbered layers of both sides (`layer_0` and the list entry `layers/0`) pair by number,
  # so each layer's leftovers are matched within it (`numbered_layers`).
  aliases = numbered_aliases(
    free_l,
    [_rel_name(u.path[len(lp) :]) for u in free_l],
    free_n,
    [_rel_name(u.path[len(np_) :]) for u in free_n],
  )
  # Each Linen unit's deepest prefix that names an NNX module holding free units (per layer).
  prefixes: dict[tuple[tuple[str, ...], int | None], list[Unit]] = {}
  for lu in free_l:
    for n in range(len(lu.path), len(lp) - 1, -1):
      name = aliased(_rel_name(lu.path[len(lp) : n]), aliases)
      if any(nu.layer == lu.layer and _named_under(nu.path[len(np_) :], name) for nu in free_n):
        prefixes.setdefault((lu.path[:n], lu.layer), []).append(lu)
        break
  for (prefix, layer), group_l in sorted(prefixes.items(), key=lambda kv: -len(kv[0][0])):
    name = aliased(_rel_name(prefix[len(lp) :]), aliases)
    group_n = [nu for nu in free_n if nu.layer == layer and _named_under(nu.path[len(np_) :], name)]
    group_l = [u for u in group_l if any(u is f for f in free_l)]
    if not group_l or not group_n:
      continue
    lrefs = [(u, n) for u in group_l for n in u.leaves]
    nrefs = [(u, n) for u in group_n for n in u.leaves]
    covers = leaf_covers(lrefs, nrefs, MAX_OPTIONS)
    if not covers:
      continue
    if len(covers) > MAX_OPTIONS:
      raise CheckpointError(
        f"Linen {', '.join(u.describe() for u in group_l)} and NNX "
        f"{', '.join(u.describe() for u in group_n)} can be matched in more than {MAX_OPTIONS} "
        "ways by leaf transforms. Fix: pass rules=[...] (lb.checkpoint.split, fuse, reshape, "
        "transpose, rename) for these leaves."
      )

    def options(lref, nref, covers=covers):
      return [
        tuple(
          Move(rule, tuple(lref(*r) for r in ls), tuple(nref(*r) for r in ns))
          for rule, ls, ns in cover
        )
        for cover in covers
      ]

    key = (
      "group",
      prefix[len(lp) :],
      tuple(u.path for u in group_l),
      tuple(u.path for u in group_n),
    )
    pair = _pair(lrefs, nrefs, how, options, key, group_l, group_n)
    # The check applies the module both sides share (e.g. `attn`), not a unit below it.
    pair.linen_at = prefix
    pair.nnx_at = _named_path(group_n[0].path, np_, name)
    pairs.append(pair)
    free_l = [u for u in free_l if not any(u is g for g in group_l)]
    free_n = [u for u in free_n if not any(u is g for g in group_n)]
  return pairs, free_l, free_n


# --- the whole pairing ----------------------------------------------------------------------


def _under(path: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
  return path[: len(prefix)] == prefix


def _split(text: str | tuple[str, ...]) -> tuple[str, ...]:
  # A path given whole (`call_order_mapping`'s): a Linen name may hold a dot itself.
  if isinstance(text, tuple):
    return text
  return tuple(p for p in text.replace(".", "/").split("/") if p)


MAPPING_HELP = (
  "Fix: if a port module is built with other widths, dtypes or depth, build it like the Linen "
  "one; if the modules exist on both sides but pair wrongly, pass mapping={linen_path: "
  "nnx_path} (module paths joined with '/', e.g. mapping={'Dense_0': 'proj'}; a prefix maps a "
  "whole subtree, e.g. {'ScanBlock_0': 'blocks'}; a leaf path maps one variable, e.g. "
  "{'ln/scale': 'norm/alpha'}); if the port stores arrays otherwise (split, fused, reshaped, "
  "transposed), pass rules=[lb.checkpoint.split(...), ...]."
)


def _unplaced(free_l: tp.Sequence[Unit], free_n: tp.Sequence[Unit], why: str) -> CheckpointError:
  lines = [f"  Linen {u.describe()}" for u in free_l[:20]]
  lines += [f"  NNX {u.describe()}" for u in free_n[:20]]
  more = max(0, len(free_l) - 20) + max(0, len(free_n) - 20)
  return CheckpointError(
    f"cannot place every variable: {why}:\n"
    + "\n".join(lines)
    + (f"\n  ... and {more} more" if more else "")
    + "\n"
    + MAPPING_HELP
  )


def _is_path(value: object) -> bool:
  # A string, or a path given whole (`call_order_mapping`'s tuples).
  return isinstance(value, str) or (
    isinstance(value, tuple) and all(isinstance(p, str) for p in value)
  )


def _check_strings(mapping: tp.Mapping[str, str]) -> None:
  for k, v in mapping.items():
    if not _is_path(k) or not _is_path(v):
      raise CheckpointError(
        f"mapping={dict(mapping)!r}: keys and values are module or leaf paths as strings "
        f"('a/b'), got {k!r}: {v!r}."
      )


def pair_units(
  lunits: list[Unit],
  nunits: list[Unit],
  mapping: tp.Mapping[str, str] | None,
  rules: tp.Sequence[LeafRule] | None,
) -> list[Pair]:
  """Pair every Linen unit's leaves with NNX leaves; raise naming whatever stays unpaired."""
  mapping = dict(mapping or {})
  _check_strings(mapping)
  rules = list(rules or ())
  for rule in rules:
    if not isinstance(rule, LeafRule):
      raise CheckpointError(
        f"rules= takes rules made by lb.checkpoint.rename, transpose, reshape, split or fuse, "
        f"got {rule!r}."
      )
  lpaths, npaths = _by_path(lunits), _by_path(nunits)
  # A mapping entry naming a Linen leaf maps that leaf (a rename); others map modules.
  labelled: list[tuple[LeafRule, str]] = []
  modules: dict[str, str] = {}
  for k, v in mapping.items():
    kk, vv = "/".join(_split(k)), "/".join(_split(v))
    if kk in lpaths or vv in npaths:
      labelled.append((Rename((kk,), (vv,)), f"mapping entry {k!r}: {v!r}"))
    else:
      modules[k] = v
  labelled += [(rule, f"rule {rule}") for rule in rules]
  used: set[tuple[int, LeafName]] = set()
  pairs: list[Pair] = []
  for index, (rule, label) in enumerate(labelled):
    pairs += _rule_pairs(rule, label, lpaths, npaths, used, index)
  lunits, nunits = _reduced(lunits, used), _reduced(nunits, used)

  for k, v in modules.items():
    if not any(_under(u.path, _split(k)) for u in lunits):
      raise CheckpointError(
        f"mapping key {k!r} names no Linen module that holds variables (nor a Linen leaf); "
        f"the Linen modules are {sorted({'/'.join(u.path) for u in lunits})}."
      )
    if not any(_under(u.path, _split(v)) for u in nunits):
      raise CheckpointError(
        f"mapping value {v!r} names no NNX module that holds Variables (nor an NNX leaf); the "
        f"port's modules are {sorted({'/'.join(u.path) for u in nunits})}."
      )
  # Each unit belongs to the longest mapping prefix it is under ('' maps the rest).
  groups = sorted(
    ((_split(k), _split(v), f"{k!r}: {v!r}") for k, v in modules.items()),
    key=lambda g: -len(g[0]),
  )
  groups.append(((), (), ""))
  free_l, free_n = list(lunits), list(nunits)
  for lp, np_, entry in groups:
    mine_l = [u for u in free_l if _under(u.path, lp)]
    mine_n = [u for u in free_n if _under(u.path, np_)]
    by_name = {(_rel_name(u.path[len(np_) :]), u.layer): u for u in mine_n}
    for lu in list(mine_l):
      nu = by_name.get((_rel_name(lu.path[len(lp) :]), lu.layer))
      if nu is None or not any(nu is m for m in mine_n):
        continue
      options = leaf_options(lu, nu)
      if options is not None:
        pairs.append(unit_pair(lu, nu, "mapping" if entry else "name", options))
        mine_l.remove(lu)
        mine_n.remove(nu)
    for lu in list(mine_l):
      for nu in mine_n:
        options = leaf_options(lu, nu)
        if options is not None:
          pair = unit_pair(lu, nu, "mapping" if entry else "order", options)
          if not entry:
            pair.order_class = (lp, np_, unit_signature(lu))
          pairs.append(pair)
          mine_l.remove(lu)
          mine_n.remove(nu)
          break
    made, mine_l, mine_n = _group_pairs(mine_l, mine_n, lp, np_, "mapping" if entry else "shapes")
    pairs += made
    if entry and (mine_l or mine_n):
      raise _unplaced(
        mine_l,
        mine_n,
        f"the mapping entry {entry} pairs the modules below it, but these found no "
        "counterpart there with fitting variable names and shapes",
      )
    placed = {id(u) for p in pairs for u in (*p.linen, *p.nnx)}
    free_l = [u for u in free_l if id(u) not in placed]
    free_n = [u for u in free_n if id(u) not in placed]
  if free_l or free_n:
    raise _unplaced(
      free_l,
      free_n,
      "these modules found no counterpart (matched by path, by call order and shapes, and by "
      "leaf transforms under a shared module path)",
    )
  return class_pairs(pairs)
