"""Units of equal shapes paired by call order, as one pair per class whose assignment is chosen
by names or by running (`convert_evidence`)."""

from __future__ import annotations

import itertools
import typing as tp

from .._core.errors import CheckpointError
from .convert_align import Unit
from .convert_leaf_options import leaf_kind, leaf_options
from .convert_pairs import MAX_OPTIONS, Move, Pair, common_path


def unit_signature(unit: Unit) -> tuple[object, ...]:
  return (unit.layer is None, tuple(sorted(leaf_kind(leaf, n) for n, leaf in unit.leaves.items())))


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
      where=f"`{'/'.join(common_path(u.path for u in lus)) or '<root>'}`",
      count=count,
      cap=MAX_ASSIGNMENTS,
      mapping=mapping,
    )
  )
  whole = {a.path: b.path for a, b in zip(lus, nus)}
  error.call_order_mapping = whole  # pyright: ignore[reportAttributeAccessIssue]
  return error


def class_pairs(pairs: list[Pair]) -> list[Pair]:
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
        found = leaf_options(lus[i], nus[j])
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
      lus,
      nus,
      common_path(u.path for u in lus),
      common_path(u.path for u in nus),
      "order",
      options,
      key,
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
      out.append((unit_pair(lu, nu, "order", [moves]), n))
  return out


def unit_pair(lu: Unit, nu: Unit, how: str, options: list[tuple[Move, ...]]) -> Pair:
  if len(options) > MAX_OPTIONS:
    raise CheckpointError(
      f"Linen {lu.describe()} and NNX {nu.describe()} have more than {MAX_OPTIONS} ways to "
      "pair their leaves of equal shapes. Fix: name the leaves, e.g. mapping={'a/scale': "
      "'b/alpha'}."
    )
  key = ("unit", lu.path, nu.path, lu.layer is None)
  return Pair((lu,), (nu,), lu.path, nu.path, how, options, key)
