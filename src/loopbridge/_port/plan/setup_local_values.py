"""The values setup's locals had in a traced instance, for a width no field explains.

HF Dinov2's SwiGLU MLP computes its hidden width in two lines of setup,

    hidden_features = int(self.config.hidden_size * self.config.mlp_ratio)
    hidden_features = (int(hidden_features * 2 / 3) + 7) // 8 * 8

and `weights_out` runs at it. No field, config attribute, or product or sum of two is that
number, so the width would become a constructor argument the parent passes per instance (and
per layer: the wrong length at another depth). Setup's body runs in `__init__` as written, so
the local is there when the layer is built: where exactly one local equals the traced width
in every traced instance of every configuration, the width is that local.

A local's value is its own expression evaluated again on the traced instance (`self` is the
Linen module, with the fields it was built with) in the module's globals, statement by
statement in setup's order up to the construction. Only plain assignments at setup's top
level that call nothing on `self` are evaluated; a local any other statement binds is unknown.
"""

from __future__ import annotations

import ast
import typing as tp


def _calls_self(node: ast.AST) -> bool:
  """A call of something reached through `self` (`self.param(...)`, `self.make_rng(...)`)."""
  for n in ast.walk(node):
    if isinstance(n, ast.Call):
      head = n.func
      while isinstance(head, ast.Attribute):
        head = head.value
      if isinstance(head, ast.Name) and head.id == "self":
        return True
  return False


def _bound_names(stmt: ast.stmt) -> set[str]:
  return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def setup_statements(class_source: str, before_line: int, method: str = "setup") -> list[ast.stmt]:
  """The method's top-level statements that start before line `before_line` of the class text
  (setup's, or a compact method's: its locals that read no call argument are what `__init__`
  computes for the constructions it moved there)."""
  tree = ast.parse(class_source)
  cls = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
  setup = next(
    (f for f in (cls.body if cls else []) if isinstance(f, ast.FunctionDef) and f.name == method),
    None,
  )
  return [s for s in setup.body if s.lineno < before_line] if setup is not None else []


def local_values(
  statements: tp.Sequence[ast.stmt], namespace: tp.Mapping[str, object], module: object
) -> dict[str, object]:
  """The locals the statements bind, evaluated with `self` = `module` (unknown ones left out)."""
  known: dict[str, object] = {}
  for stmt in statements:
    plain = (
      isinstance(stmt, ast.Assign)
      and len(stmt.targets) == 1
      and isinstance(stmt.targets[0], ast.Name)
      and not _calls_self(stmt.value)
    )
    if not plain:
      for name in _bound_names(stmt):
        known.pop(name, None)
      continue
    target = tp.cast(ast.Name, tp.cast(ast.Assign, stmt).targets[0]).id
    try:
      code = compile(ast.Expression(tp.cast(ast.Assign, stmt).value), "<setup>", "eval")
      known[target] = eval(code, dict(namespace), {**known, "self": module})
    except Exception:  # reads something a traced module no longer gives: unknown
      known.pop(target, None)
  return known


def matching_local(
  statements: tp.Sequence[ast.stmt],
  namespace: tp.Mapping[str, object],
  samples: tp.Sequence[tuple[object, object]],
) -> str | None:
  """The one local equal to the value in every (module, value) sample, else None (the
  symbolic trace's samples hold symbols: a local computed from the symbolic settings is an
  expression of them)."""
  if not samples:
    return None
  from ..trace.tracing.expressions import is_symbolic

  candidates: set[str] | None = None
  for module, value in samples:
    if type(value) is not int and not is_symbolic(value):
      return None
    found = local_values(statements, namespace, module)
    here = {name for name, v in found.items() if same_width(v, value)}
    candidates = here if candidates is None else candidates & here
  return next(iter(candidates)) if candidates is not None and len(candidates) == 1 else None


def same_width(a: object, b: object) -> bool:
  """Equal ints, or equal expressions of the symbolic trace's symbols (a local evaluated on
  the symbolic trace's instance is one); no flag, float, string or tuple."""
  if a is None or type(a) is not type(b) or isinstance(a, (bool, float, str, tuple)):
    return False
  try:
    return bool(a == b)
  except Exception:  # symbols jax cannot compare: no evidence
    return False
