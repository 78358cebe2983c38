"""A construction through a module-level partial of a Linen class (`Conv3x3 =
functools.partial(nn.Conv, kernel_size=(3, 3), use_bias=False)`, then `Conv3x3(f)(x)` in a
method): built as the partial's class with what the partial binds, as a method's own
`conv = partial(nn.Conv, ...)` local is.

The partial is read from the module's globals, not from the source: its bound values are written
as literals where they are plain values, else read from the global itself
(`Conv3x3.keywords['kernel_init']`), which the port imports.
"""

from __future__ import annotations

import functools
import types
import typing as tp

from flax import linen as nn

from ..emit.literals import literal
from .class_source import libcst

if tp.TYPE_CHECKING:
  import libcst as cst


def _class_name(cls: type, namespace: tp.Mapping[str, object]) -> str | None:
  """How the module names `cls`: a global bound to it, or `module.Class` of an imported one."""
  for key, value in namespace.items():
    if value is cls:
      return key
  for key, value in namespace.items():
    if isinstance(value, types.ModuleType) and getattr(value, cls.__name__, None) is cls:
      return f"{key}.{cls.__name__}"
  return None


def global_partial(name: str, namespace: tp.Mapping[str, object]) -> tuple[type, cst.Call] | None:
  """(the Linen class, a `functools.partial(Class, ...)` call binding what the global binds) for
  a global `name` holding such a partial, else None."""
  value = namespace.get(name)
  if not isinstance(value, functools.partial):
    return None
  cls = value.func
  if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
    return None
  class_text = _class_name(cls, namespace)
  if class_text is None:
    return None
  parts = [class_text]
  parts += [literal(a) or f"{name}.args[{i}]" for i, a in enumerate(value.args)]
  parts += [f"{k}={literal(v) or f'{name}.keywords[{k!r}]'}" for k, v in value.keywords.items()]
  node = libcst().parse_expression(f"functools.partial({', '.join(parts)})")
  return (cls, tp.cast("cst.Call", node)) if isinstance(node, libcst().Call) else None
