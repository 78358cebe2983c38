"""Locals a method fills while it runs (`skips = []` then `skips.append(x)`) are not settings.

A local assigned once at the top of a method from what `__init__` can read is copied into
`__init__` (an alias: `config = self.config`). A container the method then fills during the
call (a UNet's skip connections) has another value there: empty. A loop over it that builds
layers would build none in `__init__`; such a local is left to the call, and the loop is a TODO.
"""

from __future__ import annotations

import typing as tp

# Methods that change a list, dict or set in place.
_MUTATORS = frozenset(
  {"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "setdefault", "sort"}
)


def filled_during_call(fn: tp.Any) -> set[str]:
  """The names `fn` changes in place: `x.append(...)`, `x += ...`, `x[k] = ...`, `del x[k]`."""
  import libcst.matchers as m

  found: set[str] = set()
  for call in m.findall(fn, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name()))):
    func = tp.cast(tp.Any, call).func
    if func.attr.value in _MUTATORS:
      found.add(func.value.value)
  for aug in m.findall(fn, m.AugAssign(target=m.Name())):
    found.add(tp.cast(tp.Any, aug).target.value)
  for target in m.findall(fn, m.AssignTarget(target=m.Subscript(value=m.Name()))):
    found.add(tp.cast(tp.Any, target).target.value.value)
  for deleted in m.findall(fn, m.Del(target=m.Subscript(value=m.Name()))):
    found.add(tp.cast(tp.Any, deleted).target.value.value)
  return found
