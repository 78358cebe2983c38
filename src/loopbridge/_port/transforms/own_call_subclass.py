"""A user subclass of a flax layer whose `__call__` replaces the layer's own (the monotone
dense layers of variational-diffusion models: `class DenseMonotone(nn.Dense)` whose compact
`__call__` makes its own kernel from the inherited `features` and `kernel_init`).

Nothing of the flax layer runs but its fields: the class is a plain user module that happens to
take its fields from the layer. Its port is a plain `nnx.Module` (drafted as any user class:
its `self.param` lines make the params in `__init__`) whose `__init__` takes the inherited
fields its source reads, with Linen's defaults written out; the fields it never reads are no
argument of the port, and a parent passing one drops it (Linen reads it nowhere either).

Hooks: `ClassPort.dropped` (the unread fields), `write_class` (the base and the defaults).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re

import jax
from flax import linen as nn


@functools.cache
def flax_base(cls: type) -> type | None:
  """The flax layer `cls` subclasses, where `cls` is a subclass of one whose `__call__` is its
  own and never reaches the layer's code (no `super()`, no method only the layer has)."""
  from .layer_subclass import flax_layer_base

  base = flax_layer_base(cls)
  if base is None or "__call__" not in vars(cls) or "setup" in vars(cls):
    return None
  text = _source(cls)
  if text is None or "super(" in text:
    return None
  fields = {f.name for f in dataclasses.fields(base)}
  layer_only = {
    name
    for k in base.__mro__
    if k.__module__.startswith("flax.") and issubclass(k, nn.Module) and k is not nn.Module
    for name in vars(k)
    if name not in fields and not name.startswith("__")
  }
  own = {n for k in cls.__mro__[: cls.__mro__.index(base)] for n in vars(k)}
  if (_reads(text) & layer_only) - own:
    return None  # it calls a method of the flax layer's (its port subclasses it: not drafted)
  return base


def inherited_fields(cls: type) -> list[str]:
  """The fields `cls` takes from its flax layer without declaring them itself."""
  base = flax_base(cls)
  if base is None:
    return []
  own = set(inspect.get_annotations(cls))
  return [f.name for f in dataclasses.fields(base) if f.name not in own | {"parent", "name"}]


def unread_fields(cls: type) -> set[str]:
  """The inherited fields the class's source never reads: no argument of its port."""
  inherited = inherited_fields(cls)
  if not inherited:
    return set()
  return set(inherited) - _reads(_source(cls) or "")


def default_source(cls: type, field: str) -> str | None:
  """The port's default (source) for an inherited field the class reads, or None where the
  field is required or its default has no source the draft writes."""
  base = flax_base(cls)
  if base is None:
    return None
  found = next((f for f in dataclasses.fields(base) if f.name == field), None)
  if found is None or found.default is dataclasses.MISSING:
    return None
  return _written(found.default)


def inherited_default(cls: type, field: str) -> str | None:
  """The port's default (source) for a field the subclass `cls` inherits from a flax layer:
  Linen's own where the port is a plain module, else the NNX layer's (`layer_subclass`)."""
  from .layer_subclass import flax_layer_base
  from .layer_subclass import inherited_default as layer_default

  if flax_base(cls) is not None:
    return default_source(cls, field)
  return layer_default(flax_layer_base(cls), field)


def unwritten_defaults(cls: type) -> list[str]:
  """The inherited fields the class reads whose Linen default the draft cannot write."""
  base = flax_base(cls)
  if base is None:
    return []
  by_name = {f.name: f for f in dataclasses.fields(base)}
  read = set(inherited_fields(cls)) - unread_fields(cls)
  return [
    name
    for name in sorted(read)
    if by_name[name].default is not dataclasses.MISSING and _written(by_name[name].default) is None
  ]


def reason(cls: type) -> str | None:
  """Why a subclass whose `__call__` is its own is not drafted, or None when it is."""
  unwritten = unwritten_defaults(cls)
  if not unwritten:
    return None
  base = tp_name(flax_base(cls))
  return (
    f"{cls.__qualname__} subclasses {base} and reads its fields {unwritten}, whose Linen "
    "defaults the draft cannot write as NNX source; write the port's __init__ defaults for "
    "them by hand (its Linen source is kept below)"
  )


def tp_name(base: type | None) -> str:
  return "" if base is None else f"{base.__module__}.{base.__qualname__}"


def _initializers() -> dict[int, str]:
  """Linen's default initializers by identity -> the NNX source that makes the same."""
  from flax.linen import linear

  return {
    id(linear.default_kernel_init): "nnx.initializers.lecun_normal()",
    id(linear.default_embed_init): (
      'nnx.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)'
    ),
    id(jax.nn.initializers.zeros): "nnx.initializers.zeros_init()",
    id(jax.nn.initializers.ones): "nnx.initializers.ones_init()",
  }


def _written(value: object) -> str | None:
  if value is None or isinstance(value, (bool, int, float, str)):
    return repr(value)
  if isinstance(value, tuple) and all(_written(v) is not None for v in value):
    return repr(value)
  import jax.numpy as jnp

  name = getattr(value, "__name__", None)
  if isinstance(value, type) and name and getattr(jnp, name, None) is value:
    return f"jnp.{name}"  # a dtype (`param_dtype=jnp.float32`)
  return _initializers().get(id(value))


def _reads(text: str) -> set[str]:
  return set(re.findall(r"\bself\.(\w+)", text))


def _source(cls: type) -> str | None:
  try:
    return inspect.getsource(cls)
  except (OSError, TypeError):
    return None
