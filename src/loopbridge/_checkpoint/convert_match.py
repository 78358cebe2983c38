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
`convert_evidence` to decide by running the models. Nothing here picks one by order.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing as tp

import numpy as np

from .._core.errors import CheckpointError
from .._core.site import linen_key
from .convert_align import Leaf, LeafName, Unit
from .leaf_rules import Fuse, LeafRule, Rename, Reshape, Split, Transpose, match
from .numbered_layers import aliased, numbered_aliases

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
  # within the class becomes an option of one class pair (`_class_pairs`).
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


def _common(paths: tp.Iterable[tuple[str, ...]]) -> tuple[str, ...]:
  paths = list(paths)
  out: list[str] = []
  for parts in zip(*paths):
    if len(set(parts)) != 1:
      break
    out.append(parts[0])
  return tuple(out)


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
    _common(u.path for u in lu),
    _common(u.path for u in nu),
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


# --- leaves of two paired units -------------------------------------------------------------


def _kind(leaf: Leaf, name: LeafName) -> tuple[str, tuple[int, ...], str]:
  return (name[0], leaf.shape, str(leaf.dtype))


def _leaf_options(lu: Unit, nu: Unit) -> list[tuple[Move, ...]] | None:
  """The ways the leaves of two units pair one to one: equal names first, then every
  assignment among leaves of equal collection, shape and dtype. None if none fits."""
  fixed = []
  rest_l = [n for n in lu.leaves if n not in nu.leaves]
  rest_n = [n for n in nu.leaves if n not in lu.leaves]
  for name in lu.leaves:
    if name in nu.leaves:
      if _kind(lu.leaves[name], name) != _kind(nu.leaves[name], name):
        return None
      fixed.append((name, name))
  kinds_l = sorted(_kind(lu.leaves[n], n) for n in rest_l)
  kinds_n = sorted(_kind(nu.leaves[n], n) for n in rest_n)
  if kinds_l != kinds_n:
    return None
  classes: dict[tuple[str, tuple[int, ...], str], tuple[list[LeafName], list[LeafName]]] = {}
  for n in rest_l:
    classes.setdefault(_kind(lu.leaves[n], n), ([], []))[0].append(n)
  for n in rest_n:
    classes[_kind(nu.leaves[n], n)][1].append(n)
  per_class = [
    [list(zip(ls, perm)) for perm in itertools.permutations(ns)] for ls, ns in classes.values()
  ]
  options = []
  for combo in itertools.product(*per_class):
    renamed = [p for part in combo for p in part]
    # A leaf under another name may also be stored transposed: a square kernel `x @ W.T`
    # (PyTorch's layout) has the shape of `x @ W`, so each shape-keeping permutation is a
    # candidate too, for the evidence to decide.
    ways = [[None]] * len(fixed) + [
      [None, *_square_permutations(lu.leaves[a].shape)] for a, _ in renamed
    ]
    for how in itertools.product(*ways):
      options.append(
        tuple(
          Move(_same_shape_rule(leaf_path(lu, a), leaf_path(nu, b), perm), ((0, a),), ((0, b),))
          for (a, b), perm in zip(fixed + renamed, how)
        )
      )
      if len(options) > MAX_OPTIONS:
        return options
  return options


def _square_permutations(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
  """The non-identity axis permutations that keep `shape` (a square kernel's transpose)."""
  return [
    perm
    for perm in itertools.permutations(range(len(shape)))
    if perm != tuple(range(len(shape))) and tuple(shape[i] for i in perm) == shape
  ]


def _same_shape_rule(a: str, b: str, perm: tuple[int, ...] | None) -> LeafRule:
  return Rename((a,), (b,)) if perm is None else Transpose((a,), (b,), perm)


# --- leftovers: leaf transforms within a group ----------------------------------------------

_Ref = tuple[Unit, LeafName]


def _one_to_one(a: Leaf, b: Leaf) -> list[type[LeafRule] | tuple[int, ...]]:
  """Rename, Reshape, or a transpose permutation: the ways one array becomes the other."""
  found: list[type[LeafRule] | tuple[int, ...]] = []
  if a.shape == b.shape:
    found.append(Rename)
  if len(a.shape) == len(b.shape) and len(a.shape) >= 2:
    for perm in itertools.permutations(range(len(a.shape))):
      if perm != tuple(range(len(a.shape))) and tuple(a.shape[i] for i in perm) == b.shape:
        found.append(perm)
  if a.shape != b.shape and int(np.prod(a.shape)) == int(np.prod(b.shape)):
    found.append(Reshape)
  return found


def _covers(
  lrefs: list[_Ref], nrefs: list[_Ref], limit: int
) -> list[list[tuple[LeafRule, list[_Ref], list[_Ref]]]]:
  """Every way to move all of `lrefs` into all of `nrefs` by leaf transforms (up to `limit`)."""
  results: list[list[tuple[LeafRule, list[_Ref], list[_Ref]]]] = []

  def leaf(ref: _Ref) -> Leaf:
    return ref[0].leaves[ref[1]]

  def same_kind(a: _Ref, b: _Ref) -> bool:
    return a[1][0] == b[1][0] and leaf(a).dtype == leaf(b).dtype

  def path(ref: _Ref) -> str:
    return leaf_path(*ref)

  def rec(rest: list[_Ref], free: list[_Ref], moves: list) -> None:
    if len(results) > limit:
      return
    if not rest:
      if not free:
        results.append(list(moves))
      return
    first, others = rest[0], rest[1:]
    fits = [n for n in free if same_kind(first, n)]
    for n in fits:
      left = [m for m in free if m is not n]
      for how in _one_to_one(leaf(first), leaf(n)):
        if isinstance(how, tuple):
          rule: LeafRule = Transpose((path(first),), (path(n),), how)
        else:
          rule = how((path(first),), (path(n),))
        rec(others, left, [*moves, (rule, [first], [n])])
    shape = leaf(first).shape
    for axis in range(len(shape)):
      # Split `first` into several NNX leaves along `axis` (ordered: order is a candidate).
      parts = [n for n in fits if len(leaf(n).shape) in (len(shape), len(shape) - 1)]
      for k in range(2, min(len(parts), 8) + 1):
        for combo in itertools.permutations(parts, k):
          rule = Split((path(first),), tuple(path(n) for n in combo), axis)
          if rule.fits([shape], [leaf(n).shape for n in combo]):
            left = [m for m in free if not any(m is c for c in combo)]
            rec(others, left, [*moves, (rule, [first], list(combo))])
      # Fuse `first` and other Linen leaves into one NNX leaf along `axis` of the NNX leaf.
      for n in fits:
        target = leaf(n).shape
        if axis >= len(target):
          continue
        peers = [first] + [o for o in others if same_kind(first, o)]
        for k in range(2, min(len(peers), 8) + 1):
          for combo in itertools.permutations(peers, k):
            if not any(c is first for c in combo):
              continue
            rule = Fuse(tuple(path(c) for c in combo), (path(n),), axis)
            if rule.fits([leaf(c).shape for c in combo], [target]):
              left = [m for m in free if m is not n]
              rest2 = [o for o in others if not any(o is c for c in combo)]
              rec(rest2, left, [*moves, (rule, list(combo), [n])])

  rec(list(lrefs), list(nrefs), [])
  return results


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
    covers = _covers(lrefs, nrefs, MAX_OPTIONS)
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
      options = _leaf_options(lu, nu)
      if options is not None:
        pairs.append(_unit_pair(lu, nu, "mapping" if entry else "name", options))
        mine_l.remove(lu)
        mine_n.remove(nu)
    for lu in list(mine_l):
      for nu in mine_n:
        options = _leaf_options(lu, nu)
        if options is not None:
          pair = _unit_pair(lu, nu, "mapping" if entry else "order", options)
          if not entry:
            pair.order_class = (lp, np_, _signature(lu))
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
  return _class_pairs(pairs)


def _signature(unit: Unit) -> tuple[object, ...]:
  return (unit.layer is None, tuple(sorted(_kind(leaf, n) for n, leaf in unit.leaves.items())))


# More assignments than this for one class of modules of equal shapes: an error asks for a
# mapping instead of trying them (6 modules: 720 assignments, each one module call per input).
MAX_ASSIGNMENTS = 720

ASSIGNMENTS_HELP = (
  "Linen {linen} and NNX {nnx} hold variables of equal shapes under {where}, and can be "
  "paired in {count} ways, more than the {cap} the converter tries. Fix: name the pairing, "
  "e.g. (call order, check it) mapping={mapping!r}."
)


def _too_many(lus: tp.Sequence[Unit], nus: tp.Sequence[Unit], count: object) -> CheckpointError:
  """The error of a class of equal-shaped modules with too many assignments to try; it holds
  the call-order pairing it suggests (`call_order_mapping`, paths whole), for a caller that
  checks it."""
  mapping = {"/".join(a.path): "/".join(b.path) for a, b in zip(lus, nus)}
  error = CheckpointError(
    ASSIGNMENTS_HELP.format(
      linen=", ".join(f"`{u.name}`" for u in lus),
      nnx=", ".join(f"`{u.name}`" for u in nus),
      where=f"`{'/'.join(_common(u.path for u in lus)) or '<root>'}`",
      count=count,
      cap=MAX_ASSIGNMENTS,
      mapping=mapping,
    )
  )
  whole = {a.path: b.path for a, b in zip(lus, nus)}
  error.call_order_mapping = whole  # pyright: ignore[reportAttributeAccessIssue]
  return error


def _class_pairs(pairs: list[Pair]) -> list[Pair]:
  """Pairs made by call order among units of equal shapes, replaced by one pair per class
  whose options are every assignment within it (units under the same parent module on each
  side, one layer of a stack standing for all): call order alone decides nothing."""
  classes: dict[tuple[object, ...], list[int]] = {}
  for i, pair in enumerate(pairs):
    if pair.order_class is not None:
      lu, nu = pair.linen[0], pair.nnx[0]
      where = (pair.order_class, lu.path[:-1], nu.path[:-1], lu.layer, nu.layer)
      classes.setdefault(where, []).append(i)
  out = list(pairs)
  for idx in classes.values():
    if len(idx) < 2:
      continue
    lus = tuple(pairs[i].linen[0] for i in idx)
    nus = tuple(pairs[i].nnx[0] for i in idx)
    by_name = _pairing_by_name(lus, nus)
    count = 1
    for n in range(2, len(idx) + 1):
      count *= n
    if by_name is None and count > MAX_ASSIGNMENTS:
      raise _too_many(lus, nus, count)
    options: list[tuple[Move, ...]] = []
    assignments: list[tuple[int, ...]] = []
    # Names the port's author kept (Linen's `ii`, `if`, ... as `ii`, `if_`, ...) state the
    # pairing: only it is tried (the evidence still has to agree). Otherwise call order says
    # nothing, and every assignment is tried.
    perms = [by_name] if by_name is not None else itertools.permutations(range(len(idx)))
    for perm in perms:
      per_unit = []
      for i, j in enumerate(perm):
        found = _leaf_options(lus[i], nus[j])
        if found is None:
          break
        per_unit.append(
          [
            tuple(
              Move(m.rule, tuple((i, n) for _, n in m.linen), tuple((j, n) for _, n in m.nnx))
              for m in option
            )
            for option in found
          ]
        )
      else:
        for combo in itertools.product(*per_unit):
          options.append(tuple(m for moves in combo for m in moves))
          assignments.append(perm)
          if len(options) > MAX_ASSIGNMENTS:
            raise _too_many(lus, nus, f"more than {MAX_ASSIGNMENTS}")
    key = ("class", tuple(u.path for u in lus), tuple(u.path for u in nus), lus[0].layer is None)
    group = Pair(
      lus, nus, _common(u.path for u in lus), _common(u.path for u in nus), "order", options, key
    )
    group.assignments = assignments
    out[idx[0]] = group
    for i in idx[1:]:
      out[i] = None  # pyright: ignore[reportCallIssue, reportArgumentType]
  return [p for p in out if p is not None]


def _pairing_by_name(lus: tuple[tp.Any, ...], nus: tuple[tp.Any, ...]) -> tuple[int, ...] | None:
  """The assignment that pairs every unit with the one of its own name, if names decide it.

  A name matches itself, or itself with a trailing `_` (a Python keyword such as `if` as an
  attribute). None unless each Linen unit finds exactly one NNX unit and all are distinct.
  """
  perm = []
  for lu in lus:
    found = [j for j, nu in enumerate(nus) if _last(nu).rstrip("_") == _last(lu).rstrip("_")]
    if len(found) != 1:
      return None
    perm.append(found[0])
  return tuple(perm) if len(set(perm)) == len(perm) else None


def _last(unit: tp.Any) -> str:
  """A unit's own name under its parent (the units of one class share their parents)."""
  return unit.path[-1] if unit.path else ""


def unit_mapping(pair: Pair, option: int) -> dict[str, str] | None:
  """A class pair's candidate `option` as the `mapping=` that declares it (None: not a class)."""
  if pair.assignments is None:
    return None
  perm = pair.assignments[option]
  return {"/".join(pair.linen[i].path): "/".join(pair.nnx[j].path) for i, j in enumerate(perm)}


def split_classes(pairs: tp.Sequence[Pair]) -> list[tuple[Pair, int]]:
  """Each class pair as the unit pairs of its chosen assignment (so the report and the moves
  of an optax state read one pair per module), with the index of the pair it came from."""
  out: list[tuple[Pair, int]] = []
  for n, pair in enumerate(pairs):
    if pair.assignments is None:
      out.append((pair, n))
      continue
    perm = pair.assignments[pair.chosen]
    for i, j in enumerate(perm):
      moves = tuple(
        Move(m.rule, tuple((0, x) for _, x in m.linen), tuple((0, x) for _, x in m.nnx))
        for m in pair.moves
        if m.linen[0][0] == i
      )
      lu, nu = pair.linen[i], pair.nnx[j]
      out.append((_unit_pair(lu, nu, "order", [moves]), n))
  return out


def _unit_pair(lu: Unit, nu: Unit, how: str, options: list[tuple[Move, ...]]) -> Pair:
  if len(options) > MAX_OPTIONS:
    raise CheckpointError(
      f"Linen {lu.describe()} and NNX {nu.describe()} have more than {MAX_OPTIONS} ways to "
      "pair their leaves of equal shapes. Fix: name the leaves, e.g. mapping={'a/scale': "
      "'b/alpha'}."
    )
  key = ("unit", lu.path, nu.path, lu.layer is None)
  return Pair((lu,), (nu,), lu.path, nu.path, how, options, key)
