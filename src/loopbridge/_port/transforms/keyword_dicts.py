"""Keyword arguments a method collects in a dict local and passes with `**`.

Two shapes of published code:
- one dict written out (big_vision's MlpBlock: `inits = dict(kernel_init=...)`, then
  `nn.Dense(d, **inits)`): each key is bound as the argument it names (`items`);
- one dict or another, chosen by a setting (big_vision's ViT head: `kw = {"kernel_init":
  zeros} if self.head_zeroinit else {}`, then `nn.Dense(n, name="head", **kw)`). A key only one
  branch has cannot be bound one by one (the other branch leaves the layer's own default), so
  the port passes the same choice on: `**(... if self.head_zeroinit else {})`, each key spelled
  as the NNX layer spells it (`chosen`, `respelled`). NNX's defaults are Linen's for every
  parameter the table carries over, so a key left out means what it meant in Linen.
"""

from __future__ import annotations

import typing as tp

from ..plan.source import libcst

if tp.TYPE_CHECKING:
  import libcst as cst

Items = list[tuple[str, "cst.BaseExpression"]]


def items(node: tp.Any) -> Items | None:
  """(key, value) of `dict(a=1, b=2)` or `{"a": 1, "b": 2}`, else None."""
  c = libcst()
  if isinstance(node, c.Call) and isinstance(node.func, c.Name) and node.func.value == "dict":
    if all(a.keyword is not None and not a.star for a in node.args):
      return [(a.keyword.value, a.value) for a in node.args]
    return None
  if isinstance(node, c.Dict):
    found = []
    for el in node.elements:
      if not isinstance(el, c.DictElement) or not isinstance(el.key, c.SimpleString):
        return None
      text = el.key.evaluated_value
      if not isinstance(text, str) or not text.isidentifier():
        return None
      found.append((text, el.value))
    return found
  return None


def chosen(node: tp.Any) -> tp.Any | None:
  """`node` when it is `A if test else B` with A and B dicts written out (`items`), else None."""
  c = libcst()
  is_chosen = isinstance(node, c.IfExp) and items(node.body) is not None
  return node if is_chosen and items(node.orelse) is not None else None


def keys(node: tp.Any) -> list[str]:
  """The keys of both branches of a `chosen` dict, each once, in order."""
  found = [k for branch in (node.body, node.orelse) for k, _ in items(branch) or []]
  return list(dict.fromkeys(found))


def respelled(code: str, spelling: tp.Mapping[str, str]) -> str:
  """The code of a `chosen` dict with each key spelled as `spelling` says, as `{"k": v}`."""
  c = libcst()
  node = c.parse_expression(code)

  def branch(b: tp.Any) -> str:
    parts = [f'"{spelling.get(k, k)}": {c.Module([]).code_for_node(v)}' for k, v in items(b) or []]
    return "{" + ", ".join(parts) + "}"

  module = c.Module([])
  return f"{branch(node.body)} if {module.code_for_node(node.test)} else {branch(node.orelse)}"
