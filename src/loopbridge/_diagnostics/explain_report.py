"""`lb.explain`'s result: one `Change` per difference and the `StructureReport` that words
them, with the fix for each kind of change."""

from __future__ import annotations

import dataclasses

from .explain_snapshot import _BRIDGE, _LB, _NNX

_MAX_PER_KIND = 8  # changes of one kind printed before "... and N more"


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
