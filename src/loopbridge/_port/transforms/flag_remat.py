"""A class rematerialized only where a config flag says so (nanodo's transformer:
`block = nn.remat(TBlock) if cfg.remat else TBlock`, then `[block(cfg) for _ in range(N)]`).

Both branches build the same class with the same params under the same names; `nn.remat` only
recomputes the block's activations in the backward pass. The port keeps the local and its
test: the construction is planned as one of the class (`plan/find_sites.py` reads the local as
an alias of it), and `nn.remat(TBlock, ...)` becomes `remat_class(TBlock, ...)`, a helper the
draft writes: a subclass of the port whose call runs the class's own call under `nnx.remat`
(options kept: Linen counts `static_argnums` with `self` as 0, as the function nnx.remat is
given does). In a compact method the construction moves to `__init__` and the local stays
behind: the construction is written through the choice itself. Hooks: `plan/find_sites.py`
(the alias), `plan/rewrite_class.py` (the lift), `emit/construction.py` (the compact form).
"""

from __future__ import annotations

import typing as tp

from ..plan.source import dotted, libcst, resolve

HELPER = "remat_class"
SOURCE = f'''
def {HELPER}(cls, **options):
  """`nn.remat(cls, **options)` in NNX: a subclass of the port whose call runs the class's own
  call under `nnx.remat`, the module its first argument."""

  def __call__(self, *args):
    return nnx.remat(lambda module, *args: cls.__call__(module, *args), **options)(self, *args)

  return type(f"Checkpoint{{cls.__name__}}", (cls,), {{"__call__": __call__}})
'''
WHY = (
  "Linen's nn.remat makes a subclass whose call is rematerialized; the port's subclass runs "
  "the class's call under nnx.remat"
)
# nn.remat's options over a class that nnx.remat takes as they are.
_KEPT = frozenset({"prevent_cse", "static_argnums", "policy"})


def _remat_of(node: tp.Any, namespace: tp.Mapping[str, object]) -> type | None:
  """`Block` for `nn.remat(Block, <options nnx.remat takes>)` (or `nn.checkpoint`), else None."""
  from flax import linen as nn

  c = libcst()
  if not isinstance(node, c.Call) or not node.args or node.args[0].keyword is not None:
    return None
  if resolve(dotted(node.func), namespace) not in (nn.remat, nn.checkpoint):
    return None
  if any(a.keyword is None or a.keyword.value not in _KEPT for a in node.args[1:]):
    return None
  cls = resolve(dotted(node.args[0].value), namespace)
  return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


def chosen_class(value: tp.Any, namespace: tp.Mapping[str, object]) -> type | None:
  """`Block` for `nn.remat(Block) if flag else Block` (either way round), else None."""
  from flax import linen as nn

  if not isinstance(value, libcst().IfExp):
    return None
  branches = (value.body, value.orelse)
  lifted = [_remat_of(b, namespace) for b in branches]
  plain = [resolve(dotted(b), namespace) if dotted(b) else None for b in branches]
  for i in (0, 1):
    cls, other = lifted[i], plain[1 - i]
    if cls is not None and other is cls and issubclass(cls, nn.Module):
      return cls
  return None


def rewrite(planner: tp.Any, site: tp.Any) -> bool:
  """Plan `nn.remat(Block, ...)` at `site` (a lift no construction goes through) as the draft's
  `remat_class(Block, ...)`, where it is a branch of a flag's choice; False elsewhere."""
  node = site.node
  parent = planner.parents.get(node)
  if _remat_of(node, planner.src.namespace) is None:
    return False
  if chosen_class(parent, planner.src.namespace) is None:
    return False
  planner.lift_rewrites[id(node)] = _helper_call(planner, node)
  return True


def _helper_call(planner: tp.Any, remat: tp.Any) -> str:
  """`remat_class(Block, <options>)` for the call `nn.remat(Block, <options>)`."""
  args = [planner.code(remat.args[0].value)]
  args += [f"{a.keyword.value}={planner.code(a.value)}" for a in remat.args[1:]]
  planner.ctx.helpers.add(HELPER)
  return f"{HELPER}({', '.join(args)})"


def inlined(planner: tp.Any, site: tp.Any, cls: type) -> str | None:
  """`(remat_class(Block) if flag else Block)` for a construction through such a local of a
  method other than setup (the local stays in the method; the construction moves to
  `__init__`, which computes the choice itself), else None."""
  if site.class_alias is None or site.method == "setup" or site.target is not cls:
    return None
  value = planner.aliases.get(site.method, {}).get(site.class_alias)
  if value is None:
    return None
  node = libcst().parse_expression(value)
  if chosen_class(node, planner.src.namespace) is None:
    return None
  branches = [
    _helper_call(planner, b) if _remat_of(b, planner.src.namespace) else planner.code(b)
    for b in (node.body, node.orelse)
  ]
  test = planner.rewrite_expr(planner.code(node.test))
  return f"({branches[0]} if {test} else {branches[1]})"
