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


def partial_of_user_class(value: object) -> bool:
  """A `functools.partial` of a user-written Linen class binding keywords (rlpd-style
  `base_cls=partial(MLP, hidden_dims=(256, 256))`)."""
  import functools

  cls = factory_class(value)
  return (
    isinstance(value, functools.partial)
    and cls is not None
    and not cls.__module__.startswith("flax.")
    and bool(value.keywords)
  )


def drop_factory_field(planner: tp.Any, field: str) -> None:
  """The port drops a field holding a module factory (it builds the factory's port itself),
  but keeps one holding a partial of a user class in every instance: the port reads what the
  partial binds from it (`self.base_cls.keywords['hidden_dims']`), at any configuration."""
  if not all(partial_of_user_class(getattr(i.module, field, None)) for i in planner.instances):
    planner.port.dropped.add(field)
