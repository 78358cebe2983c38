"""The ways the leaves of two units pair: equal names first, then every one-to-one assignment
or leaf transform (`leaf_rules`) that moves all of one side's leaves into the other's."""

from __future__ import annotations

import itertools

import numpy as np

from .convert_align import Leaf, LeafName, Unit
from .convert_pairs import MAX_OPTIONS, Move, leaf_path
from .leaf_rules import Fuse, LeafRule, Rename, Reshape, Split, Transpose


def leaf_kind(leaf: Leaf, name: LeafName) -> tuple[str, tuple[int, ...], str]:
  return (name[0], leaf.shape, str(leaf.dtype))


def leaf_options(lu: Unit, nu: Unit) -> list[tuple[Move, ...]] | None:
  """The ways the leaves of two units pair one to one: equal names first, then every
  assignment among leaves of equal collection, shape and dtype. None if none fits."""
  fixed = []
  rest_l = [n for n in lu.leaves if n not in nu.leaves]
  rest_n = [n for n in nu.leaves if n not in lu.leaves]
  for name in lu.leaves:
    if name in nu.leaves:
      if leaf_kind(lu.leaves[name], name) != leaf_kind(nu.leaves[name], name):
        return None
      fixed.append((name, name))
  kinds_l = sorted(leaf_kind(lu.leaves[n], n) for n in rest_l)
  kinds_n = sorted(leaf_kind(nu.leaves[n], n) for n in rest_n)
  if kinds_l != kinds_n:
    return None
  classes: dict[tuple[str, tuple[int, ...], str], tuple[list[LeafName], list[LeafName]]] = {}
  for n in rest_l:
    classes.setdefault(leaf_kind(lu.leaves[n], n), ([], []))[0].append(n)
  for n in rest_n:
    classes[leaf_kind(nu.leaves[n], n)][1].append(n)
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


def leaf_covers(
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
