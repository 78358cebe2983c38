"""What a layer no traced call reached would have been given, when a trace saw that value.

GPT-2's `ln_cross_attn` runs only when the call passes `encoder_hidden_states`; diffusers' VAE
`conv_shortcut` only when a block changes its width. NNX needs their input width at
construction, and no trace saw them called. Sometimes the value they are given is one a trace
did see, and the source proves it:

- the argument is a parameter of the method that calls the layer, never reassigned before the
  call (the VAE's `residual = hidden_states` at the top, then `self.conv_shortcut(residual)`):
  it is what the enclosing module was called with;
- the argument was last assigned by a plain statement `x = ...` outside any loop, and a layer
  that was called takes the same `x` later with nothing reassigning `x` in between except the
  unreached `if` branch itself (GPT-2: `hidden_states = attn_output + residual`, then the
  cross-attention branch with `self.ln_cross_attn(hidden_states)` first in it, then
  `self.ln_2(hidden_states)`): since the unreached layer is the branch's first use of the
  value, and the branch never ran, the later layer was given the value the branch would have.

Anything else (a loop, a `try`, an argument that is an expression, a layer called in two places)
is no proof: the caller keeps its TODO. Read with `ast`: nothing here rewrites the source.
"""

from __future__ import annotations

import ast
import dataclasses
import typing as tp

# Where the first argument of the unreached call comes from.


@dataclasses.dataclass(frozen=True)
class FromParameter:
  method: str
  param: str
  position: int  # among the method's parameters after `self`


@dataclasses.dataclass(frozen=True)
class FromSibling:
  method: str
  attr: str  # `self.<attr>(x, ...)`, a layer a trace saw called with the same `x`


Origin = FromParameter | FromSibling

_CONDITIONAL = (ast.IfExp, ast.BoolOp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp)


def _self_call(node: ast.AST, attr: str | None = None) -> str | None:
  """`attr` of a call `self.attr(...)` (of the given attr, when one is given), else None."""
  if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
    return None
  owner = node.func.value
  if not (isinstance(owner, ast.Name) and owner.id == "self"):
    return None
  return node.func.attr if attr in (None, node.func.attr) else None


def _unconditional_calls(stmt: ast.stmt) -> list[ast.Call]:
  """The calls `stmt` always makes: none under a conditional expression or a lambda."""
  out: list[ast.Call] = []

  def walk(node: ast.AST) -> None:
    if isinstance(node, (*_CONDITIONAL, ast.GeneratorExp)):
      return
    if isinstance(node, ast.Call):
      out.append(node)
    for child in ast.iter_child_nodes(node):
      walk(child)

  walk(stmt)
  return out


def _stores(node: ast.AST, name: str) -> bool:
  return any(
    isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del))
    for n in ast.walk(node)
  )


def _plain_assignment(stmt: ast.stmt, name: str) -> bool:
  """`name = ...` with one plain target."""
  return (
    isinstance(stmt, ast.Assign)
    and len(stmt.targets) == 1
    and isinstance(stmt.targets[0], ast.Name)
    and stmt.targets[0].id == name
  ) or (
    isinstance(stmt, ast.AnnAssign)
    and isinstance(stmt.target, ast.Name)
    and stmt.target.id == name
    and stmt.value is not None
  )


# A position in the method: (the block, the index of the statement in it); the outermost first.
Path = list[tuple[list[ast.stmt], int]]


def _paths_to(body: list[ast.stmt], target: ast.stmt, above: Path) -> Path | None:
  """The blocks from the method's body down to `target`, through `if`s only (None otherwise)."""
  for i, stmt in enumerate(body):
    here = [*above, (body, i)]
    if stmt is target:
      return here
    if isinstance(stmt, ast.If):
      for block in (stmt.body, stmt.orelse):
        found = _paths_to(block, target, here)
        if found is not None:
          return found
  return None


def origin(class_source: str, attr: str) -> Origin | None:
  """Where the first argument of the one call `self.<attr>(x, ...)` comes from, or None."""
  tree = ast.parse(class_source)
  cls = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
  if cls is None:
    return None
  sites = [
    (fn, stmt, call)
    for fn in cls.body
    if isinstance(fn, ast.FunctionDef) and fn.name != "setup"
    for stmt in ast.walk(fn)
    if isinstance(stmt, ast.stmt) and not hasattr(stmt, "body")  # simple statements only
    for call in ast.walk(stmt)
    if isinstance(call, ast.Call) and _self_call(call, attr)
  ]
  if len(sites) != 1:
    return None  # called in two places (or none): no one value to read
  fn, stmt, call = sites[0]
  if (
    not call.args
    or not isinstance(call.args[0], ast.Name)
    or call not in _unconditional_calls(stmt)
  ):
    return None
  path = _paths_to(fn.body, stmt, [])
  if path is None:
    return None  # under a loop, a `with`, a `try`: not read here
  return _reaching(fn, path, len(path) - 1, path[-1][1], call.args[0].id)


def _reaching(fn: ast.FunctionDef, path: Path, level: int, index: int, name: str) -> Origin | None:
  """Back from statement `index` at `level` to what last bound `name`, level by level: an
  alias of another name (`residual = hidden_states`) is followed to what bound that one."""
  for lv in range(level, -1, -1):
    block, at = path[lv]
    start = index if lv == level else at
    for j in range(start - 1, -1, -1):
      if not _stores(block[j], name):
        continue
      if not _plain_assignment(block[j], name):
        return None
      value = tp.cast(tp.Any, block[j]).value
      if isinstance(value, ast.Name):
        return _reaching(fn, [*path[:lv], (block, j)], lv, j, value.id)
      return _sibling(fn, path, lv, j, name)
  params = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]
  if name in params:
    return FromParameter(fn.name, name, params.index(name))
  if any(a.arg == name for a in fn.args.kwonlyargs):
    return FromParameter(fn.name, name, -1)
  return None


def _sibling(fn: ast.FunctionDef, path: Path, level: int, bound: int, name: str) -> Origin | None:
  """A layer called on `name` after the statement that bound it, in the same block."""
  block, _ = path[level]
  if level == len(path) - 1:
    return None  # the unreached call is in this block: what follows it did not run either
  branch_at = path[level][1]  # the `if` the unreached call is in
  branch = block[branch_at]
  inner_block, _ = path[level + 1]
  if level + 1 != len(path) - 1 or not isinstance(branch, ast.If):
    return None  # the call is not directly in the `if`'s branch
  other = branch.orelse if inner_block is branch.body else branch.body
  if any(_stores(s, name) for s in other):
    return None  # the other branch may have run and rebound the value
  for j in range(bound + 1, len(block)):
    stmt = block[j]
    if j == branch_at:
      continue  # the branch never ran: the unreached call is its first statement on `name`
    for call in _unconditional_calls(stmt):
      attr = _self_call(call)
      if attr and call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == name:
        return FromSibling(fn.name, attr)
    if _stores(stmt, name) or isinstance(stmt, (ast.Return, ast.Raise)):
      return None
  return None


class _NoSettings:
  """The settings of a layer no configuration built: reading one is no evidence."""

  def __getattr__(self, name: str) -> tp.NoReturn:
    if name.startswith("__"):  # Python's own lookups (doctest, copy, pickle) find nothing
      raise AttributeError(name)
    # Not an AttributeError: `getattr(layer, "axis", -1)` must not read a default as evidence.
    raise LookupError(f"no built layer to read {name!r} from")


NO_SETTINGS: tp.Any = _NoSettings()


def value_given(found: Origin, parent: tp.Any, trace: tp.Any) -> object | None:
  """The traced (abstract) value the unreached call's first argument would be, or None."""
  if isinstance(found, FromParameter):
    call = parent.inputs.get(found.method)
    if call is None:
      return None
    args, kwargs = call
    if 0 <= found.position < len(args):
      return args[found.position]
    return kwargs.get(found.param)
  sibling = trace.instances.get((*parent.path, found.attr))
  if sibling is None:
    return None
  call = sibling.inputs.get("__call__")
  return call[0][0] if call and call[0] else None
