"""A dataclass field written `dataclasses.field(default_factory=list)` (or `default=...`).

As an `__init__` default, the `Field` object itself would be the value: the port would not
build with its defaults. A factory stays a factory (a fresh value per instance, as the
dataclass made it): the argument defaults to None and `__init__` calls the factory then.
"""

from __future__ import annotations

import typing as tp

from ..plan.source import dotted, libcst, resolve


def field_call(value: tp.Any, namespace: tp.Mapping[str, object]) -> dict[str, tp.Any] | None:
  """The keyword arguments of a `dataclasses.field(...)` call, or None for any other value."""
  import dataclasses

  c = libcst()
  if not isinstance(value, c.Call):
    return None
  if resolve(dotted(value.func), namespace) is not dataclasses.field:
    return None
  return {a.keyword.value: a.value for a in value.args if a.keyword is not None}


def signature_and_init(
  name: str, annotation: str, value: tp.Any, namespace: tp.Mapping[str, object], code: tp.Callable
) -> tuple[str, str] | None:
  """(`name: T | None = None`, `self.name = name if name is not None else factory()`) for a
  factory field, (`name: T = default`, `self.name = name`) for `field(default=...)`, else None."""
  kwargs = field_call(value, namespace)
  if kwargs is None:
    return None
  if "default_factory" in kwargs:
    factory = code(kwargs["default_factory"])
    return (
      f"{name}: {annotation} | None = None",
      f"self.{name} = {name} if {name} is not None else ({factory})()",
    )
  if "default" in kwargs:
    return f"{name}: {annotation} = {code(kwargs['default'])}", f"self.{name} = {name}"
  return f"{name}: {annotation}", f"self.{name} = {name}"


def factory_class(value: object) -> type | None:
  """The Linen class a field value builds: `partial(nn.Conv, ...)` or `nn.Conv` itself."""
  import functools

  from flax import linen as nn

  func = value.func if isinstance(value, functools.partial) else value
  return func if isinstance(func, type) and issubclass(func, nn.Module) else None


def is_root(module: object) -> bool:
  """The module no other module holds (the drafted root)."""
  from flax import linen as nn

  return not isinstance(getattr(module, "parent", None), nn.Module)


def kept_partial(value: object) -> bool:
  """A `functools.partial` of a Linen class binding keywords (rlpd-style `base_cls=partial(MLP,
  hidden_dims=(256, 256))`, a ResNet's `norm=partial(nn.BatchNorm, use_running_average=True)`)."""
  import functools

  return (
    isinstance(value, functools.partial)
    and factory_class(value) is not None
    and bool(value.keywords)
  )


def drop_factory_field(planner: tp.Any, field: str) -> None:
  """The port drops a field holding a module factory (it builds the factory's port itself),
  but the drafted root keeps one holding a partial: the port reads what the partial binds
  from it (`self.base_cls.keywords['hidden_dims']`, `self.norm.keywords['momentum']`, a flag
  such as `use_running_average` given to the NNX layer when built), at any configuration. (A
  class below the root is handed its factories by a parent, which may build them in its call,
  where `__init__` cannot: its port takes what its parent's port passes.)"""
  values = [getattr(i.module, field, None) for i in planner.instances]
  if not (planner.resolver.root and all(map(kept_partial, values))):
    planner.port.dropped.add(field)


# The helper a port calls to pass what a kept partial binds (`drop_factory_field`).
HELPER = "linen_keywords"
SOURCE = '''
def linen_keywords(bound, renames, written):
  """What a Linen partial binds, as the NNX constructor's keywords: each renamed where NNX
  spells it otherwise, those the port writes itself left out."""
  named = {renames.get(k, k): v for k, v in bound.items()}
  return {k: v for k, v in named.items() if k not in written}
'''

# The `values` key (`emit/construction`) of a kept partial's keywords, passed as `**`.
BOUND = "**bound"


def bound_keywords(planner: tp.Any, field: str, renames: tp.Mapping[str, str], written) -> str:
  """`**linen_keywords(self.norm.keywords, {...}, (...))`: every keyword the partial in `field`
  binds at any configuration, not only those the sample's binds."""
  planner.ctx.helpers.add(HELPER)
  return f"**{HELPER}(self.{field}.keywords, {dict(renames)!r}, {tuple(sorted(written))!r})"
