"""A user subclass of `nn.Dense` or `nn.Conv` that overrides `param` to transform a param as
the layer reads it (the weight-standardized convolutions of big-transfer ResNets:
`param = super().param(name, ...)`, then the kernel standardized).

Linen's Dense and Conv read every param through `self.param` on each call, so the override
changes what each call computes with, never what is stored. The port subclasses the NNX layer
(built as the layer is, from the same construction) and keeps the override as a method from a
param's name to the value the call uses (`super().param(name, ...)` reads the stored value);
its `__call__` runs the NNX layer's own call on a view of the layer holding those values, so the
stored params stay as they are (no Variable is written: the call traces anywhere the layer's
own call does).

Hooks: `standard_layers.lookup` (a parent builds the class as the NNX layer), `draft._port_one`
(the class's code), `safety.layer_subclass_reason` (why an override is not drafted).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import textwrap
import typing as tp

from ..plan.class_source import libcst
from ..plan.source import is_docstring

if tp.TYPE_CHECKING:
  from ..plan.class_port import ClassPort, Context
  from ..plan.source import ClassSource


def _layers() -> dict[type, str]:
  """The layers whose call reads each param (`kernel`, `bias`) through `self.param`, which
  their NNX counterpart keeps under the same names and shapes."""
  from flax import linen as nn

  return {nn.Dense: "Linear", nn.Conv: "Conv"}


@dataclasses.dataclass(frozen=True)
class Override:
  """A drafted `param` override: its layer, its source and the call of `super().param`."""

  base: type
  nnx_name: str
  module: tp.Any  # the class's libcst module (its indent)
  doc: tp.Any  # the class's docstring statement, or None
  method: tp.Any  # the `param` method
  super_call: tp.Any  # its `super().param(name, ...)`


@functools.cache
def analysed(cls: type) -> Override | str | None:
  """The override of `param` in `cls` (a subclass of a layer of `_layers()`), a string saying
  why it is not drafted, or None where `cls` is no such subclass."""
  from flax import linen as nn

  if "param" not in vars(cls) or len(cls.__bases__) != 1:
    return None
  base = cls.__bases__[0]
  flax_layer = issubclass(base, nn.Module) and base.__module__.startswith("flax.linen")
  if base is nn.Module or not flax_layer:
    return None  # a user module's own method named `param`, or no flax layer's subclass
  if base not in _layers() or base.param is not nn.Module.param:
    return f"the draft ports a `param` override of {' and '.join(_names())} only"
  try:
    text = textwrap.dedent(inspect.getsource(cls))
  except (OSError, TypeError):
    return None
  c = libcst()
  module = c.parse_module(text)
  classdef: tp.Any = module.body[0]
  body = list(classdef.body.body)
  doc = body[0] if body and is_docstring(body[0]) else None
  methods = [s for s in body if isinstance(s, c.FunctionDef)]
  others = [s for s in body if not isinstance(s, c.FunctionDef) and s is not doc]
  if others or [m.name.value for m in methods] != ["param"] or methods[0].decorators:
    return "the draft ports a class whose body is a `param` override and a docstring only"
  method = methods[0]
  params = list(method.params.params)
  if len(params) < 2 or method.params.posonly_params:
    return "its `param` takes no name argument"
  nodes = list(_walk(method.body))
  supers = [n for n in nodes if _is_call_of(n, "super")]
  calls = [
    n
    for n in nodes
    if isinstance(n, c.Call)
    and isinstance(n.func, c.Attribute)
    and n.func.attr.value == "param"
    and _is_call_of(n.func.value, "super")
  ]
  if len(supers) != 1 or len(calls) != 1 or not calls[0].args:
    return "its `param` calls `super()` other than once as `super().param(name, ...)`"
  call = calls[0]
  first = call.args[0]
  if first.keyword is not None or first.star:
    return "its `super().param(...)` passes the name otherwise than first by position"
  rest = {p.name.value for p in params[2:] + list(method.params.kwonly_params)}
  for star in (method.params.star_arg, method.params.star_kwarg):
    if isinstance(star, c.Param):
      rest.add(star.name.value)
  outside = _names_outside(method.body, call)
  if rest & outside:
    return f"its `param` reads {sorted(rest & outside)} beyond passing them to super().param"
  if "self" in outside:
    return "its `param` reads `self` (the NNX layer's attributes are named otherwise)"
  return Override(base, _layers()[base], module, doc, method, call)


def overridden_layer(cls: type) -> type | None:
  """The flax layer a parent builds the subclass `cls` as (its NNX counterpart, by the
  subclass's name), where `cls` is a drafted `param` override."""
  found = analysed(cls)
  return found.base if isinstance(found, Override) else None


def reason(cls: type) -> str | None:
  """Why the `param` override of `cls` is not drafted (with the NNX code to write), or None."""
  found = analysed(cls)
  if not isinstance(found, str):
    return None
  base = tp.cast(type, cls.__bases__[0])
  nnx_name = _layers().get(base) or base.__name__
  known = f"{cls.__qualname__} overrides `param` of {base.__module__}.{base.__qualname__}: {found}"
  if base not in _layers():
    return (
      f"{known}. Write it by hand as a subclass of nnx.{nnx_name} that applies the override's "
      f"transform where nnx.{nnx_name} reads the param (its Linen source is kept below)"
    )
  return (
    f"{known}. Write it by hand as `class {cls.__name__}(nnx.{nnx_name})` whose `__call__` "
    f"runs nnx.{nnx_name}'s on a view holding each param as the override returns it: `view = "
    "types.SimpleNamespace(**vars(self))`, `view.kernel = nnx.Param(<the override's value "
    f"of self.kernel>)`, then `return nnx.{nnx_name}.__call__(view, *args, **kwargs)` (its "
    "Linen source is kept below)"
  )


def root_reason(cls: type) -> str | None:
  """The PortError for drafting such a subclass alone, or None."""
  found = analysed(cls)
  if not isinstance(found, Override):
    return None
  return (
    f"lb.port.draft: {cls.__qualname__} overrides `param` of flax's "
    f"nn.{found.base.__name__}; its port subclasses nnx.{found.nnx_name} and is built with "
    f"nnx.{found.nnx_name}'s arguments, which a module of yours that builds it passes. Draft "
    f"that module (it ports {cls.__qualname__} with it)."
  )


def port(src: ClassSource, ctx: Context) -> ClassPort | None:
  """The port of a drafted `param` override, or None where `src` is not one."""
  found = analysed(src.cls)
  if not isinstance(found, Override):
    return None
  from ..plan.class_port import ClassPort
  from ..plan.values import Resolver
  from ..records import Change

  c = libcst()
  read = "[...]" if ctx.modern else ".value"
  name = found.super_call.args[0].value
  stored = c.parse_expression(f"getattr(self, {found.module.code_for_node(name)}){read}")
  params = found.method.params
  method = found.method.deep_replace(found.super_call, stored)
  only_name = c.Parameters(
    params=[p.with_changes(comma=c.MaybeSentinel.DEFAULT) for p in params.params[:2]]
  )
  method = method.with_changes(params=only_name, leading_lines=[])
  kept = (
    "isinstance(getattr(self, name), nnx.Param)"
    if ctx.modern
    else "getattr(self, name) is not None and getattr(self, name).value is not None"
  )
  layer = f"nnx.{found.nnx_name}"
  call = f"""\
def __call__(self, *args, **kwargs):
  # Linen's nn.{found.base.__name__} reads each param through `param`, which this class overrides:
  # {layer}'s call runs on a view of the layer holding the values `param` returns
  # (the stored params stay as they are).
  view = types.SimpleNamespace(**vars(self))
  for name in ("kernel", "bias"):
    if {kept}:
      setattr(view, name, nnx.Param(self.param(name)))
  return {layer}.__call__(view, *args, **kwargs)
"""
  indent = found.module.default_indent
  parts = (
    []
    if found.doc is None
    else [found.module.code_for_node(found.doc.with_changes(leading_lines=[]))]
  )
  parts += [found.module.code_for_node(method), call.replace("  ", indent)]
  head = f"class {src.cls.__name__}({layer}):\n"
  result = ClassPort(src.cls, src)
  result.resolver = Resolver([], result.field_names())
  result.code = head + "\n".join(textwrap.indent(p, indent) for p in parts)
  line = src.first_line
  result.changes = [
    Change(
      src.file,
      line,
      f"class ...(nn.{found.base.__name__}) overriding param",
      f"{layer} subclass",
      f"built as {layer} is; its call runs {layer}'s on the values the override returns",
    )
  ]
  return result


def _names() -> list[str]:
  return [f"nn.{b.__name__}" for b in _layers()]


def _walk(node: tp.Any) -> tp.Iterator[tp.Any]:
  c = libcst()
  found: list[tp.Any] = []

  class Collect(c.CSTVisitor):
    def on_visit(self, node: tp.Any) -> bool:
      found.append(node)
      return True

  node.visit(Collect())
  return iter(found)


def _is_call_of(node: tp.Any, name: str) -> bool:
  c = libcst()
  return isinstance(node, c.Call) and isinstance(node.func, c.Name) and node.func.value == name


def _names_outside(body: tp.Any, call: tp.Any) -> set[str]:
  """The names `body` reads outside `call` (the arguments the override passes on)."""
  c = libcst()
  inside = {id(n) for n in _walk(call)}
  return {n.value for n in _walk(body) if isinstance(n, c.Name) and id(n) not in inside}
