"""Write the NNX construction of one hoisted attribute (standard layer or user class)."""

from __future__ import annotations

import builtins
import dataclasses
import inspect
import typing as tp

from . import standard_layers
from .find_sites import Site
from .source import libcst
from .values import literal

if tp.TYPE_CHECKING:
  import libcst as cst

  from .rewrite_class import Hoist, Planner


def names_in(node: cst.CSTNode) -> set[str]:
  """The free names an expression reads (attribute names after a dot excluded)."""
  c = libcst()
  found: set[str] = set()

  class V(c.CSTVisitor):
    def visit_Attribute(self, node: cst.Attribute) -> bool:
      node.value.visit(self)
      return False

    def visit_Name(self, node: cst.Name) -> None:
      found.add(node.value)

    def visit_Arg(self, node: cst.Arg) -> bool:
      node.value.visit(self)
      return False

  node.visit(V())
  return found


def available(node: cst.CSTNode, namespace: tp.Mapping[str, object], extra: set[str]) -> bool:
  """Whether an expression can be evaluated in `__init__` (fields, globals, loop targets)."""
  return all(
    n == "self" or n in namespace or hasattr(builtins, n) or n in extra for n in names_in(node)
  )


def loop_targets(loop: cst.For | None) -> set[str]:
  return names_in(loop.target) if loop is not None else set()


def bind(site: Site, cls: type) -> tuple[dict[str, cst.BaseExpression], str | None]:
  """Linen field -> argument expression of a construction, or an error text."""
  c = libcst()
  fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("parent", "name")]
  bound: dict[str, cst.BaseExpression] = {}
  for i, arg in enumerate(site.node.args):
    if arg.star:
      return {}, "a construction with *args/**kwargs (the draft binds arguments one by one)"
    if arg.keyword is None:
      if i >= len(fields):
        return {}, "more positional arguments than the class has fields"
      bound[fields[i]] = arg.value
    elif arg.keyword.value != "name":
      bound[arg.keyword.value] = arg.value
  del c
  return bound, None


def construction(planner: Planner, hoist: Hoist, index: str | None) -> tuple[str | None, str]:
  """(`nnx.Linear(24, 32, rngs=rngs)`, '') or (None, why it cannot be written)."""
  site = hoist.site
  cls = tp.cast(type, site.target)
  bound, error = bind(site, cls)
  if error:
    return None, error
  aliases = planner.aliases.get(site.method, {})
  extra = loop_targets(site.loop) | planner.comprehension_targets(site) | set(aliases)
  ns = planner.src.namespace
  values: dict[str, str] = {}
  moved: list[str] = []
  layer = standard_layers.lookup(cls)
  nested = {id(s.node): s for s in planner.sites if s.nested_in is site.node}
  for field, expr in bound.items():
    code = planner.code(expr)
    if id(expr) in nested:
      inner, why = _nested(planner, hoist, nested[id(expr)], field, index)
      if inner is None:
        return None, why
      values[field] = inner
    elif available(expr, ns, extra):
      values[field] = planner.rewrite_expr(code)
      planner.used_aliases.update(n for n in names_in(expr) if n in aliases)
    elif layer is not None and field in layer.call_time and site.outer_call is not None:
      moved.append(f"{field}={code}")
    else:
      values[field] = planner.traced(hoist, lambda k, f=field: getattr(k.module, f), field, index)
  hoist.call_kwargs = moved
  if layer is None:
    return _user_class(planner, hoist, cls, values, index), ""
  return _standard(planner, hoist, layer, values, index)


def _nested(planner: Planner, hoist: Hoist, inner: Site, field: str, index: str | None):
  """The NNX construction of a module built as another's argument (`nn.RNN(nn.LSTMCell(8))`).

  Linen adopts it where it was built (a sibling, `OptimizedLSTMCell_0`); the trace pairs it by
  the line that called it, as any construction.
  """
  from .rewrite_class import Hoist as HoistRecord
  from .rewrite_class import _match

  trace = planner.ctx.trace
  children = {
    p: [k for k in trace.children(p) if _match(inner, planner.src, k)] for p in hoist.children
  }
  record = HoistRecord(f"{hoist.attr}_{field}", inner, children, hoist.is_list)
  return construction(planner, record, index)


def _standard(planner, hoist, layer, values, index) -> tuple[str | None, str]:
  params = layer.parameters()
  known = {p.name for p in params}
  args: dict[str, str] = {}
  widths_seen = None
  for kids in hoist.children.values():
    if kids:
      widths_seen = layer.widths(kids[0])
      break
  for name in widths_seen or {}:
    args[name] = planner.traced(hoist, lambda k, n=name: layer.widths(k)[n], name, index)
  for field, code in values.items():
    target = layer.renames.get(field, field)
    if target not in known:
      return None, f"nn.{layer_name(hoist)}'s {field}= has no counterpart in nnx.{layer.nnx_name}"
    args[target] = code
  linen_fields = {f.name: f for f in dataclasses.fields(tp.cast(type, hoist.site.target))}
  for p in params:
    field = linen_fields.get(p.name)
    if field is None or p.name in args or field.default is dataclasses.MISSING:
      continue
    text = literal(field.default)
    if field.default is not None and text is not None and p.default is None:
      # NNX leaves it open (and then demands it); Linen's default is what the model ran with.
      args[p.name] = text
  if "rngs" in known:
    args["rngs"] = "rngs"
  parts: list[str] = []
  positional = True
  for p in params:
    if p.name not in args:
      if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
        positional = False
      continue
    if positional and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
      parts.append(args[p.name])
    else:
      positional = False
      parts.append(f"{p.name}={args[p.name]}")
  hoist.post = []
  if layer.nnx_name == "MultiHeadAttention" and index is None:
    kids = [k[0] for k in hoist.children.values() if k]
    if kids and any(getattr(k.module, "decode", False) for k in kids):
      # Linen sizes the decode cache from the input given to init; NNX needs init_cache.
      shape = planner.traced(
        hoist, lambda k: tuple(k.inputs["__call__"][0][0].shape), "cache_shape", None
      )
      dtype = planner.traced(
        hoist, lambda k: k.module.dtype or k.inputs["__call__"][0][0].dtype, "cache_dtype", None
      )
      hoist.post.append(f"self.{hoist.attr}.init_cache({shape}, dtype={dtype})")
  return f"nnx.{layer.nnx_name}({', '.join(parts)})", ""


def layer_name(hoist: Hoist) -> str:
  return tp.cast(type, hoist.site.target).__name__


def _user_class(planner, hoist, cls, values, index) -> str:
  site = hoist.site
  parts: list[str] = []
  fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("parent", "name")]
  positional = [a for a in site.node.args if a.keyword is None]
  for i, _ in enumerate(positional):
    parts.append(values[fields[i]])
  for arg in site.node.args:
    if arg.keyword is not None and arg.keyword.value != "name":
      parts.append(f"{arg.keyword.value}={values[arg.keyword.value]}")
  child_port = planner.ctx.ported[cls]
  for extra in tp.cast(tp.Any, child_port.resolver).extras.values():
    code = planner.traced(hoist, lambda k, e=extra: e.values[k.path], extra.name, index)
    parts.append(f"{extra.name}={code}")
  parts.append("rngs=rngs")
  func = cls.__name__ if site.lift is not None else planner.code(site.node.func)
  return f"{func}({', '.join(parts)})"
