"""The draft's safety net: a class whose drafting fails, or whose drafted code does not parse,
becomes one TODO naming the class and its line, never a raw exception out of `draft()`.

The rest of the model still drafts; the class keeps its original source in the TODO block (so
nothing is dropped) and its port raises where it would be built.
"""

from __future__ import annotations

import ast
import textwrap

from ..plan.class_port import ClassPort
from ..plan.source import ClassSource
from ..plan.values import Resolver
from ..records import Todo


def drafted_code_error(code: str) -> str | None:
  """Why `code` (one drafted class) is not valid Python, or None when it parses."""
  try:
    ast.parse(code)
  except SyntaxError as e:
    return f"line {e.lineno}: {e.msg}"
  return None


def class_failed_reason(cls: type, error: BaseException) -> str:
  return (
    f"drafting the class {cls.__qualname__} failed ({type(error).__name__}: "
    f"{' '.join(str(error).split())[:200]}); this is a defect of lb.port.draft, please report "
    "it with this class. Port this class by hand: its Linen source is kept below"
  )


def unparsable_reason(cls: type, why: str) -> str:
  return (
    f"the drafted code of the class {cls.__qualname__} does not parse ({why}); this is a defect "
    "of lb.port.draft, please report it with this class. Port this class by hand: its Linen "
    "source is kept below"
  )


def layer_subclass_reason(cls: type) -> str | None:
  """Why the subclass `cls` of a flax layer is not drafted; None when it is drafted, or is no
  subclass of a flax layer."""
  from ..transforms import own_call_subclass, param_override
  from ..transforms.layer_subclass import flax_layer_base, subclassable, unsupported_reason

  base = flax_layer_base(cls)
  if base is None:
    return None
  if (why := param_override.reason(cls)) is not None:
    return why
  if own_call_subclass.flax_base(cls) is not None:
    return own_call_subclass.reason(cls)
  if subclassable(base) is not None:
    return unsupported_reason(cls, base)
  return subclassed_layer_reason(cls, base)


def subclassed_layer_reason(cls: type, base: type) -> str:
  from ..plan.standard_layers import lookup

  mapped = lookup(base)
  counterpart = f"nnx.{mapped.nnx_name}" if mapped else "the NNX counterpart of that layer"
  return (
    f"{cls.__qualname__} subclasses flax's own layer {base.__module__}.{base.__qualname__}; "
    f"the draft does not port a subclass of a flax layer. Write it by hand as a subclass of "
    f"{counterpart} with the same overrides (its Linen source is kept below)"
  )


def fallback_port(src: ClassSource, reason: str) -> ClassPort:
  """The port of a class drafting could not write: its Linen source kept as one TODO block,
  in a class of the same name whose constructor raises (so building the port says where)."""
  port = ClassPort(src.cls, src)
  port.resolver = Resolver([], port.field_names())
  original = src.text.strip("\n")
  port.todos.append(Todo(src.file, src.first_line, reason, original))
  where = f"TODO(port) at {src.file.rsplit('/', 1)[-1]}:{src.first_line}"
  comments = [f"# {ln}" for ln in textwrap.wrap(f"TODO(port): {reason}", 80)]
  comments += [f"#   | {ln}" for ln in original.splitlines()]
  body = "\n".join(f"  {ln}" for ln in comments)
  port.code = (
    f"class {src.cls.__name__}(nnx.Module):\n"
    f"{body}\n"
    "  def __init__(self, *args, rngs: nnx.Rngs, **kwargs):\n"
    f"    raise NotImplementedError({where!r})\n"
  )
  return port
