"""`lb.explain`'s comparison: every difference between two snapshots of a carry, as `Change`s
(paths added or removed, shapes, dtypes, types, replaced objects, sharing, plain attributes,
containers, growing sow tuples)."""

from __future__ import annotations

import typing as tp

from .explain_report import Change
from .explain_snapshot import (
  _ARRAY,
  _CONTAINER,
  _MODULE,
  _STATIC,
  _VARIABLE,
  _Item,
  _Snapshot,
)


def _type_change(path: str, x: _Item, y: _Item) -> Change:
  """A node at `path` that became another kind or type of node (`x` before, `y` after)."""
  before, after = _describe(x), _describe(y)
  return Change("type", path, f"{path}: {before} became {after}", before, after, y.owner)


def _describe(item: _Item) -> str:
  if item.kind == _VARIABLE:
    if item.tuple_len is not None:
      return f"{item.type_name} holding a tuple of {item.tuple_len}"
    if item.shape is not None:
      return f"{item.type_name} {_shape_text(item)}"
    return f"{item.type_name} = {_short(item.static)}"
  if item.kind == _MODULE:
    return f"{item.type_name} module"
  if item.kind == _CONTAINER:
    return item.type_name
  if item.kind == _ARRAY:
    return _shape_text(item)
  return f"{item.type_name} = {_short(item.static)}"


def _shape_text(item: _Item) -> str:
  return f"{item.dtype}[{','.join(map(str, item.shape or ()))}]"


def _short(value: object, limit: int = 60) -> str:
  try:
    text = repr(value)
  except Exception:  # pylint: disable=broad-except
    text = f"<{type(value).__name__}>"
  text = " ".join(text.split())
  return text if len(text) <= limit else text[: limit - 3] + "..."


def _same_static(a: object, b: object) -> bool:
  if a is b:
    return True
  if type(a) is not type(b):
    return False
  try:
    return bool(a == b)
  except Exception:  # pylint: disable=broad-except
    return False


def _under(path: str, root: str) -> bool:
  """Whether `path` is strictly inside `root` (a descendant in the path text)."""
  return len(path) > len(root) and path.startswith(root) and path[len(root)] in ".["


def _under_any(path: str, roots: tp.Iterable[str]) -> bool:
  return any(_under(path, r) for r in roots)


def _sow_text(snap: _Snapshot, path: str) -> str:
  """'Intermediate, float32[1,4] each' for a sow tuple at `path` (a Variable or a tuple of them)."""
  item = snap.items[path]
  first = snap.items.get(path + "[0]")
  type_name = (
    item.type_name
    if item.kind == _VARIABLE
    else (first.type_name if first is not None else item.type_name)
  )
  if first is not None and first.shape is not None:
    return f"{type_name}, {_shape_text(first)} each"
  return type_name


def diff(before: _Snapshot, after: _Snapshot) -> list[Change]:
  """Every difference between two snapshots of a carry, in path order."""
  b, a = before.items, after.items
  changes: list[Change] = []
  skip: set[str] = set()  # alias paths whose contents one side lists elsewhere
  no_identity: set[str] = set()  # paths already explained by a sharing change

  # Shared references: a group of paths holding one object must hold one object afterwards.
  for label, this, other, verb in (
    ("split", before, a, "different objects after it"),
    ("joined", after, b, "one shared object after it"),
  ):
    for _ident, paths in this.paths_of.items():
      if len(paths) < 2:
        continue
      present = [p for p in paths if p in other and other[p].ident is not None]
      idents = {other[p].ident for p in present}
      if len(present) < 2 or len(idents) < 2:
        continue
      item = this.items[paths[0]]
      owner = item.owner
      if label == "split":
        message = (
          f"{' and '.join(present)} were one shared {item.type_name} before the step "
          f"and are {len(idents)} {verb}"
        )
      else:
        message = (
          f"{' and '.join(present)} were {len(idents)} different objects before the "
          f"step and are {verb}"
        )
      changes.append(Change("sharing", present[0], message, before=None, after=None, owner=owner))
      skip.update(present[1:])
      no_identity.update(present)

  type_changed: set[str] = set()
  grown: set[str] = set()
  replaced_modules: set[str] = set()
  for path, x in b.items():
    y = a.get(path)
    if (
      y is None
      or _under_any(path, skip)
      or _under_any(path, type_changed)
      or _under_any(path, grown)
    ):
      continue
    if x.kind != y.kind or x.type_name != y.type_name:
      changes.append(_type_change(path, x, y))
      type_changed.add(path)
      continue
    if x.tuple_len is not None and y.tuple_len is not None and y.tuple_len > x.tuple_len:
      grown.add(path)
      changes.append(
        Change(
          "sow",
          path,
          f"{path}: sow tuple grew from {x.tuple_len} to {y.tuple_len} values "
          f"({_sow_text(after, path)}); every call appends, so the carry changes on every step",
          _describe(x),
          _describe(y),
          y.owner,
        )
      )
      continue
    if (
      x.kind in (_VARIABLE, _MODULE)
      and x.ident != y.ident
      and path not in no_identity
      and not _under_any(path, replaced_modules)
    ):
      if x.kind == _MODULE:
        replaced_modules.add(path)  # its Variables are new too: one change says it
      what = "Variable" if x.kind == _VARIABLE else "module"
      changes.append(
        Change(
          "replaced",
          path,
          f"{path}: {what} replaced by a new {y.type_name} object",
          _describe(x),
          _describe(y),
          y.owner,
        )
      )
    if x.shape is not None and y.shape is not None:
      if x.shape != y.shape:
        changes.append(
          Change(
            "shape",
            path,
            f"{path}: shape {x.shape} became {y.shape} ({y.dtype})",
            _shape_text(x),
            _shape_text(y),
            y.owner,
          )
        )
      if x.dtype != y.dtype:
        changes.append(
          Change(
            "dtype",
            path,
            f"{path}: dtype {x.dtype} became {y.dtype} (shape {y.shape})",
            _shape_text(x),
            _shape_text(y),
            y.owner,
          )
        )
    elif (x.shape is None) != (y.shape is None):
      changes.append(_type_change(path, x, y))
    elif (
      x.kind in (_STATIC, _VARIABLE)
      and x.shape is None
      and x.tuple_len is None
      and not _same_static(x.static, y.static)
    ):
      changes.append(
        Change(
          "static",
          path,
          f"{path}: {_short(x.static)} became {_short(y.static)}",
          _short(x.static),
          _short(y.static),
          y.owner,
        )
      )

  def topmost(items: dict[str, _Item], other: dict[str, _Item]) -> list[str]:
    return [
      p
      for p, it in items.items()
      if p not in other
      and (it.parent is None or it.parent in other)
      and not _under_any(p, skip)
      and not _under_any(p, type_changed)
      and not _under_any(p, grown)
    ]

  for path in topmost(b, a):
    changes.append(
      Change(
        "removed",
        path,
        f"{path}: removed (was {_describe(b[path])})",
        _describe(b[path]),
        None,
        b[path].owner,
      )
    )
  for path in topmost(a, b):
    group = [p for p in a if (p == path or _under(p, path))]
    sows = [p for p in group if a[p].tuple_len is not None]
    for p in sows:
      changes.append(
        Change(
          "sow",
          p,
          f"{p}: new sow tuple of {a[p].tuple_len} value{'s' if a[p].tuple_len != 1 else ''} "
          f"({_sow_text(after, p)}); every later call appends to it, so the carry changes on "
          "every step",
          None,
          _describe(a[p]),
          a[p].owner,
        )
      )
    payload = [
      p for p in group if a[p].kind != _CONTAINER and p not in sows and not _under_any(p, sows)
    ]
    if payload or not sows:
      changes.append(
        Change(
          "added",
          path,
          f"{path}: added ({_describe(a[path])})",
          None,
          _describe(a[path]),
          a[path].owner,
        )
      )

  if before.treedef != after.treedef and before.treedef.num_leaves == after.treedef.num_leaves:
    changes.append(
      Change(
        "container",
        "carry",
        f"carry: container layout {before.treedef} became {after.treedef}",
        str(before.treedef),
        str(after.treedef),
      )
    )
  order = {p: i for i, p in enumerate([*b, *(p for p in a if p not in b)])}
  changes.sort(key=lambda c: order.get(c.path, len(order)))
  return changes
