"""`self.config.NAME` where `config` comes from a mixin base beside `nn.Module`.

diffusers' Flax models (`class FlaxAutoencoderKL(nn.Module, FlaxModelMixin, ConfigMixin)`,
decorated with `@flax_register_to_config`) read their own dataclass fields back through
`self.config`, a dict of those fields that the decorator fills when the model is built. The
port leaves the mixins out (they load and save Linen variables), so `self.config` does not
exist there; the fields it mirrors are the port's own constructor arguments. A read becomes
`self.NAME` only for a field whose value through `config` equals the field itself in every
traced instance: that is the evidence that `config` mirrors it. Any other read is left as
written (and the check, which builds the port, then says what is missing).
"""

from __future__ import annotations

import dataclasses
import typing as tp

from .linen_machinery import is_mixin_base

CONFIG = "config"
WHY = (
  "the model's config mixin (left out of the port) mirrors this dataclass field, in every "
  "traced instance: the port reads its own argument"
)


def _from_a_mixin(cls: type) -> bool:
  """Whether `cls.config` is defined by a base that is not a Linen module (not a field)."""
  if CONFIG in {f.name for f in dataclasses.fields(tp.cast(tp.Any, cls))}:
    return False
  return any(is_mixin_base(base) and CONFIG in vars(base) for base in cls.__mro__)


def _same(a: object, b: object) -> bool:
  try:
    return bool(a == b)
  except Exception:  # arrays, objects without a plain equality: no evidence
    return False


def mirrored_fields(cls: type, modules: tp.Sequence[object]) -> frozenset[str]:
  """The dataclass fields of `cls` that `self.config` mirrors in every traced module."""
  if not modules or not _from_a_mixin(cls):
    return frozenset()
  names = [f.name for f in dataclasses.fields(tp.cast(tp.Any, cls))]
  found = set()
  for name in names:
    if name in ("parent", "name"):
      continue
    try:
      pairs = [(getattr(getattr(m, CONFIG), name), getattr(m, name)) for m in modules]
    except Exception:  # a config without the setting: not mirrored
      continue
    if all(_same(through, own) for through, own in pairs):
      found.add(name)
  return frozenset(found)
