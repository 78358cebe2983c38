"""`lb.explain`: what one step of a loop body changes in the loop carry, in words.

A JAX loop carries exactly the same pytree through every step; NNX loops add that the carry's
graph (its Variables, modules and shared references) must come out of the body as it went in.
When it does not, flax reports a GraphDef or pytree mismatch. `explain` runs one step
abstractly (`jax.eval_shape`: shapes only, no FLOPs, the caller's objects untouched), takes a
snapshot of the carry before and after the step, and names each difference with its fix:
paths added or removed, shape and dtype changes, Variables or modules replaced by new objects,
shared references split or joined, plain attributes changed, and sow tuples that grow.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
from flax import nnx
from flax.nnx import bridge
from flax.nnx import graph as graph_lib

from .. import _compat
from .._core.bridge_settings import is_bridge
from .._core.errors import StructureChangeError

# Kinds of snapshot items: graph objects (modules, Rngs), pytree containers (dict/list/tuple),
# Variables, arrays, and static (non-array) attributes.
_MODULE, _CONTAINER, _VARIABLE = "module", "container", "variable"
_ARRAY, _STATIC = "array", "static"

# Owner flavors: which kind of module holds a path (chooses the fix we suggest).
_LB, _BRIDGE, _NNX = "lb.ToNNX", "flax.nnx.bridge.ToNNX", "nnx"

_MAX_PER_KIND = 8  # changes of one kind printed before "... and N more"


def is_graph_object(x: object) -> bool:
  """A Variable or an NNX graph node (module, Rngs, ...): split as graph, not as a pytree."""
  return isinstance(x, nnx.Variable) or graph_lib.is_graph_node(x)


def is_array_like(x: object) -> bool:
  """A value a JAX loop can carry: an array (or tracer) or a Python/NumPy scalar."""
  return (hasattr(x, "shape") and hasattr(x, "dtype")) or isinstance(x, (bool, int, float, complex))


# ----------------------------------------------------------------------------- snapshots
@dataclasses.dataclass
class _Item:
  path: str
  parent: str | None
  kind: str
  type_name: str
  owner: str
  ident: int | None = None  # modules and Variables: object identity
  shape: tuple[int, ...] | None = None
  dtype: str | None = None
  tuple_len: int | None = None  # a Variable holding a tuple: how sows store their values
  static: object = None


class _Snapshot:
  """Every path of a carry (through its NNX graphs) with its kind, type, shape/dtype, identity."""

  def __init__(self) -> None:
    self.items: dict[str, _Item] = {}
    self.paths_of: dict[int, list[str]] = {}
    self._alive: list[object] = []  # keeps objects alive so their ids stay unique
    self.treedef: tp.Any = None

  def note(self, obj: object, path: str) -> bool:
    """Record that `obj` is reachable at `path`; True the first time it is seen."""
    paths = self.paths_of.setdefault(id(obj), [])
    paths.append(path)
    if len(paths) == 1:
      self._alive.append(obj)
      return True
    return False

  def counts(self) -> dict[str, int]:
    """How many distinct modules and Variables, and how many arrays, the snapshot holds."""
    out = {"modules": 0, "variables": 0, "arrays": 0}
    for item in self.items.values():
      first = item.ident is not None and self.paths_of[item.ident][0] == item.path
      if item.kind == _MODULE and first:
        out["modules"] += 1
      elif item.kind == _VARIABLE and first:
        out["variables"] += 1
      elif item.kind == _ARRAY:
        out["arrays"] += 1
    return out


def _flavor(module: object) -> str:
  if is_bridge(module):
    return _LB
  if isinstance(module, bridge.ToNNX):
    return _BRIDGE
  return _NNX


def _key_text(node: object, key: object) -> str:
  if isinstance(node, (dict, list, tuple)) or not (isinstance(key, str) and key.isidentifier()):
    return f"[{key!r}]"
  return f".{key}"


def _aval(x: tp.Any) -> tuple[tuple[int, ...], str]:
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return tuple(x.shape), str(x.dtype)
  return (), str(jax.dtypes.result_type(x))


def _leaf_item(leaf: object, path: str, parent: str | None, owner: str) -> _Item:
  if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
    shape, dtype = _aval(leaf)
    return _Item(path, parent, _ARRAY, type(leaf).__name__, owner, shape=shape, dtype=dtype)
  return _Item(path, parent, _STATIC, type(leaf).__name__, owner, static=leaf)


def _walk(snap: _Snapshot, obj: object, path: str, parent: str | None, owner: str) -> None:
  if isinstance(obj, nnx.Variable):
    item = _Item(path, parent, _VARIABLE, type(obj).__name__, owner, ident=id(obj))
    snap.items[path] = item
    if not snap.note(obj, path):
      return
    value = _compat.variable_value(obj)
    if isinstance(value, tuple):
      item.tuple_len = len(value)
    for keypath, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
      if not keypath:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
          item.shape, item.dtype = _aval(leaf)
        else:
          item.static = leaf
        continue
      sub = path + jax.tree_util.keystr(keypath)
      snap.items[sub] = _leaf_item(leaf, sub, path, owner)
    return
  if graph_lib.is_graph_node(obj) or graph_lib.is_node(obj):
    is_object = graph_lib.is_graph_node(obj)  # modules are objects; dicts/lists/tuples are not
    snap.items[path] = _Item(
      path,
      parent,
      _MODULE if is_object else _CONTAINER,
      type(obj).__name__,
      owner,
      ident=id(obj) if is_object else None,
    )
    if is_object:
      owner = _flavor(obj)
      if not snap.note(obj, path):
        return  # a shared reference: its contents are listed under its first path
    children = _compat.graph_children(obj)
    if not is_object:
      snap.items[path].tuple_len = _compat.stock_sow_tuple_length(obj, children)
    for key, child in children.items():
      _walk(snap, child, path + _key_text(obj, key), path, owner)
    return
  snap.items[path] = _leaf_item(obj, path, parent, owner)


def snapshot(carry: object) -> _Snapshot:
  """A snapshot of `carry`: every path through its pytree and the NNX graphs it holds."""
  snap = _Snapshot()
  leaves, snap.treedef = jax.tree_util.tree_flatten_with_path(carry, is_leaf=is_graph_object)
  for keypath, leaf in leaves:
    _walk(snap, leaf, "carry" + jax.tree_util.keystr(keypath), None, _NNX)
  return snap


# ----------------------------------------------------------------------------- the report
@dataclasses.dataclass(frozen=True)
class Change:
  """One difference between the carry before and after a step."""

  kind: str  # sow, added, removed, shape, dtype, type, replaced, sharing, static, container
  path: str
  message: str
  before: str | None = None
  after: str | None = None
  owner: str = _NNX  # which kind of module holds the path (chooses the fix)

  def to_dict(self) -> dict[str, str | None]:
    return dataclasses.asdict(self)


_WHY = (
  "A JAX loop carries exactly the same structure through every step; NNX loops "
  "(nnx.while_loop / nnx.fori_loop / nnx.scan) also need the same shared references and, "
  "on flax 0.10 and in tree mode, the same Variable and module objects."
)

_FIXES: dict[str, str] = {
  "sow:" + _BRIDGE: (
    "sow tuples in a stock flax.nnx.bridge.ToNNX: every call appends each sown value to a "
    "tuple. Build the model with lb.ToNNX(linen_module, rngs=...) and "
    "lb.lazy_init(model, *sample_args, capacity=N): sows then go into preallocated buffers "
    "(read them with lb.recorded(model))."
  ),
  "sow:" + _LB: (
    "sow tuples in an lb.ToNNX: this call sows with another signature than the buffers were "
    "declared for. Declare it before the loop: lb.preallocate(model, *args, capacity=N)."
  ),
  "sow:" + _NNX: (
    "sow tuples: every `sow` call appends its value to a tuple. For a Linen model use "
    "lb.ToNNX(linen_module, rngs=...) with lb.lazy_init(..., capacity=N); for a native NNX "
    "module declare fixed-size buffers with lb.preallocate(model, *sample_args, capacity=N), "
    "or pop the values inside the body (nnx.pop(model, nnx.Intermediate)) so the carry "
    "leaves the step as it entered."
  ),
  "replaced:" + _BRIDGE: (
    "replaced Variables: a stock flax.nnx.bridge.ToNNX called with `mutable=` builds new "
    "Variables on every call. lb.ToNNX(linen_module, rngs=...) writes them in place."
  ),
  "replaced": (
    "replaced objects: write into the existing Variable (var.value = new, or "
    "var[...] = new) instead of assigning a new Variable or module; NNX loops on flax "
    "0.10 and in tree mode track them by identity."
  ),
  "sharing": (
    "sharing: keep shared submodules and Variables shared; do not copy or rebuild them inside "
    "the body (nnx.clone, nnx.merge, copy.deepcopy), and assign one object to every place "
    "that shares it."
  ),
  "added": (
    "added/removed paths: create every attribute and Variable before the loop (in "
    "__init__, or by running one step before the loop) and never delete one inside the "
    "body."
  ),
  "shape": (
    "shapes: keep each carried value at a fixed shape; preallocate it at its largest size "
    "and write into it (x.at[i].set(v), jax.lax.dynamic_update_slice)."
  ),
  "dtype": (
    "dtypes: keep each carried value at one dtype; cast the result back "
    "(y.astype(x.dtype)) or start the carry in the dtype the body produces."
  ),
  "type": "types: keep each attribute's type (same Variable type, same module class).",
  "type:" + _BRIDGE: (
    "changed Variable types: a stock flax.nnx.bridge.ToNNX called with `mutable=` rebuilds "
    "the updated collections as new Variables (on flax 0.10 even of another type). "
    "lb.ToNNX(linen_module, rngs=...) with lb.lazy_init(..., capacity=N) keeps them."
  ),
  "static": (
    "plain attributes: NNX keeps non-array attributes in the GraphDef, so a new value is a "
    "new structure. Keep values that change in a Variable (e.g. nnx.Variable(jnp.array(0)))."
  ),
  "container": (
    "carry layout: return the carry in the same container layout (same tuple/list/dict "
    "structure) the step received."
  ),
}
_FIXES["removed"] = _FIXES["added"]


@dataclasses.dataclass
class StructureReport:
  """What one step of a loop body changes in the loop carry (`lb.explain`'s result).

  `ok` is True when nothing changed: then the carry can go through `nnx.while_loop`,
  `nnx.fori_loop`, `nnx.scan`, `lb.while_loop` and `lb.fori_loop`. `str(report)` is the
  readable text; `to_dict()` a JSON-ready form.

  Attributes:
    changes: one `Change` per difference (`kind`, `path`, `message`, `before`, `after`,
      `owner`); kinds: sow, added, removed, shape, dtype, type, replaced, sharing, static,
      container.
    checked: how many distinct modules and Variables, and how many arrays, the carry holds.
    body: the body function's name, for the text.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> report = lb.explain(lambda carry: (carry[0] + 1, carry[1]), (jnp.zeros(2), 0))
    >>> report.ok, report.changes
    (True, [])
  """

  changes: list[Change]
  checked: dict[str, int]
  body: str = "body"

  @property
  def ok(self) -> bool:
    return not self.changes

  def fixes(self) -> list[str]:
    """One fix line per kind of change found, in the order first found."""
    out: list[str] = []
    for change in self.changes:
      key = f"{change.kind}:{change.owner}"
      text = _FIXES.get(key) or _FIXES.get(change.kind)
      if change.kind == "sow" and text is None:
        text = _FIXES["sow:" + _NNX]
      if text and text not in out:
        out.append(text)
    return out

  def __str__(self) -> str:
    checked = ", ".join(f"{n} {what if n != 1 else what[:-1]}" for what, n in self.checked.items())
    if self.ok:
      return (
        f"lb.explain({self.body}): one step keeps the loop carry's structure: same "
        f"paths, shapes, dtypes, Variables and sharing ({checked} checked)."
      )
    lines = [
      f"lb.explain({self.body}): one step changes the loop carry's structure "
      f"({len(self.changes)} change{'s' if len(self.changes) != 1 else ''}). {_WHY}"
    ]
    shown: dict[str, int] = {}
    for change in self.changes:
      shown[change.kind] = shown.get(change.kind, 0) + 1
      if shown[change.kind] <= _MAX_PER_KIND:
        lines.append(f"  [{change.kind}] {change.message}")
    for kind, n in shown.items():
      if n > _MAX_PER_KIND:
        lines.append(f"  ... and {n - _MAX_PER_KIND} more [{kind}] changes (see report.changes)")
    lines.append("Fix:")
    lines.extend(f"  - {fix}" for fix in self.fixes())
    return "\n".join(lines)

  def __repr__(self) -> str:
    return f"StructureReport(ok={self.ok}, changes={len(self.changes)})"

  def to_dict(self) -> dict[str, object]:
    """A JSON-ready dict: ok, body, checked counts, changes (kind, path, message, ...), fixes."""
    return {
      "ok": self.ok,
      "body": self.body,
      "checked": dict(self.checked),
      "changes": [c.to_dict() for c in self.changes],
      "fixes": self.fixes(),
    }


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


# ----------------------------------------------------------------------------- explain
def _body_name(body_fn: tp.Callable[..., object]) -> str:
  return getattr(body_fn, "__name__", None) or type(body_fn).__name__


def explain_step(
  body_fn: tp.Callable[..., object],
  carry: object,
  extra_args: tuple[object, ...] = (),
  name: str | None = None,
) -> StructureReport:
  """`explain` without the raise: the report of one abstract step of `body_fn(carry, *extra)`."""
  everything = (carry, extra_args)
  leaves, treedef = jax.tree_util.tree_flatten(everything, is_leaf=is_graph_object)
  node_mask = [is_graph_object(leaf) for leaf in leaves]
  dyn_mask = [not n and is_array_like(leaf) for n, leaf in zip(node_mask, leaves)]
  nodes = [leaf for leaf, n in zip(leaves, node_mask) if n]
  graphdef, state = _compat.split_graph(nodes)
  dynamic = [leaf for leaf, d in zip(leaves, dyn_mask) if d]
  result: dict[str, StructureReport] = {}

  def step(state: nnx.State, dynamic: list[object]) -> None:
    fresh = iter(nnx.merge(graphdef, state))
    values = iter(dynamic)
    rebuilt = [
      next(fresh) if n else next(values) if d else leaf
      for leaf, n, d in zip(leaves, node_mask, dyn_mask)
    ]
    carry_in, extra_in = treedef.unflatten(rebuilt)
    before = snapshot(carry_in)
    carry_out = body_fn(carry_in, *extra_in)
    after = snapshot(carry_out)
    result["report"] = StructureReport(
      diff(before, after), before.counts(), name or _body_name(body_fn)
    )

  jax.eval_shape(step, state, dynamic)
  return result["report"]


def explain(
  body_fn: tp.Callable[..., object],
  carry: object,
  *extra_args: object,
  raise_on_change: bool = False,
) -> StructureReport:
  """Run one loop step abstractly and report what it changes in the loop carry.

  Calls `body_fn(carry, *extra_args)` under `jax.eval_shape` (no FLOPs; the caller's modules
  are not modified) on a copy of `carry`, and compares the carry before and after the step:
  paths added or removed, shape and dtype changes, Variables or modules replaced by new
  objects, shared references split or joined, plain attributes changed, sow tuples growing.
  `carry` may mix NNX modules (`lb.ToNNX`, stock `flax.nnx.bridge.ToNNX`, native ones),
  Variables, arrays, Python scalars and nested tuples/lists/dicts of them. For a `fori_loop`
  body `f(i, carry)` pass `lambda c: f(0, c)`.

  Args:
    body_fn: one loop step, `carry -> carry` (extra arguments follow the carry).
    carry: the loop carry as the loop would receive it.
    *extra_args: further arguments of `body_fn`, after the carry (not compared).
    raise_on_change: raise `StructureChangeError` (with the report's text) if anything changed.

  Returns:
    A `StructureReport`: `.ok`, `.changes` (each with kind, path, message), `.to_dict()`, and
    `str(report)`, the readable text with the fix for each kind of change.

  Raises:
    StructureChangeError: `raise_on_change=True` and the step changes the carry's structure.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import nnx
    >>> def step(carry):  # keeps a growing history: its shape changes every step
    ...   model, history = carry
    ...   return model, jnp.concatenate([history, model(history[-1:])])
    >>> report = lb.explain(step, (nnx.Linear(2, 2, rngs=nnx.Rngs(0)), jnp.ones((1, 2))))
    >>> report.ok
    False
    >>> print(report.changes[0].message)
    carry[1]: shape (1, 2) became (2, 2) (float32)
  """
  if not callable(body_fn):
    raise TypeError(
      f"lb.explain: body_fn must be the loop step, a function carry -> carry, got "
      f"{type(body_fn).__name__}. Note the order: lb.explain(body_fn, carry, *extra_args)."
    )
  report = explain_step(body_fn, carry, tuple(extra_args))
  if raise_on_change and not report.ok:
    raise StructureChangeError(str(report))
  return report
