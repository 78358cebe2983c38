"""A width of each layer a loop builds under an `if` (a counted list), as the loop's own target
(`f` of `for i, f in enumerate(self.features)`, `4 * mult`, `self.ch * mult`).

`__init__` replays the loop's headers and tests to build such a list (`write_class`), so the
targets are in scope where each layer is built. The same headers and tests run here on each
traced instance of the class (its Linen fields are the settings they read), collecting the
targets at each layer built; an expression of one target that equals each layer's traced
value in every configuration, a tuple of any length included, is the width. Only one that
matches in every configuration is written; else the caller keeps its evidence-less fallback.
"""

from __future__ import annotations

import typing as tp

from .width_exprs import atoms

if tp.TYPE_CHECKING:
  from .hoist import Hoist

# `rewrite_class.Planner`, typed loosely so this module stays below it.
Planner = tp.Any

# `4 * mult`: a target times a small constant.
_MULTIPLES = range(2, 9)


def _replayed(planner: Planner, hoist: Hoist) -> tp.Callable[[object], list[dict]] | None:
  """A function running the `__init__` replay of the list's loops on a Linen instance, giving
  the targets bound at each layer built; None where there is no replay."""
  planned = planner.counter_nest.get(id(hoist.site.node))
  if planned is None:
    return None
  _, lines, depth = planned
  unit = "  "
  body = "\n".join(unit + ln.replace(planner.module.default_indent, unit) for ln in lines)
  text = (
    f"def _replay(self):\n{unit}_found = []\n{body}\n"
    f"{unit * (depth + 1)}_found.append(dict(locals()))\n{unit}return _found\n"
  )
  namespace = dict(planner.src.namespace)
  try:
    exec(compile(text, "<replay>", "exec"), namespace)
  except Exception:  # a replay this cannot compile: no evidence
    return None
  return tp.cast(tp.Callable[[object], list[dict]], namespace["_replay"])


def _candidates(env: dict, module: object) -> list[tuple[str, tp.Callable[[dict], object]]]:
  names = [n for n, v in env.items() if n not in ("self", "_found") and type(v) is int]
  out: list[tuple[str, tp.Callable[[dict], object]]] = [(n, lambda e, n=n: e.get(n)) for n in names]
  out += [(f"{k} * {n}", lambda e, n=n, k=k: k * e[n]) for n in names for k in _MULTIPLES]
  out += [
    (f"{field} * {n}", lambda e, n=n, get=get: _times(get(module), e[n]))
    for n in names
    for field, get in atoms(module)
  ]
  return out


def _times(a: object, b: object) -> object:
  return a * b if type(a) is int and type(b) is int else None  # pyright: ignore[reportOperatorIssue]


def loop_target_width(
  planner: Planner,
  hoist: Hoist,
  per: tp.Mapping[tuple[str, ...], tuple[object, ...]],
  alt_per: tp.Sequence[tp.Mapping[tuple[str, ...], tuple[object, ...]]],
) -> str | None:
  """The one expression of a loop target equal to each layer's value (`per`: each parent's
  layers in order; `alt_per`: the same in each other configuration), else None."""
  replay = _replayed(planner, hoist)
  if replay is None:
    return None
  samples: list[tuple[object, list[dict], tuple[object, ...]]] = []
  configs = [(per, planner.trace.instances), *zip(alt_per, planner.resolver.alts)]
  for values, instances in configs:
    for path, layers in values.items():
      inst = instances.get(path)
      if inst is None or not all(type(v) is int for v in layers):
        continue  # a symbolic trace's values, or no instance: no evidence here
      try:
        envs = replay(inst.module)
      except Exception:  # the replay reads something this instance does not have
        return None
      if len(envs) != len(layers):
        return None
      samples.append((inst.module, envs, layers))
  if not samples or not samples[0][1]:
    return None
  # Each sample's candidates by their text (the targets, and settings, are each instance's).
  tables = [(dict(_candidates(envs[0], m)), envs, layers) for m, envs, layers in samples]
  matched = [
    text
    for text in tables[0][0]
    if all(
      text in table and all(table[text](e) == v for e, v in zip(envs, layers))
      for table, envs, layers in tables
    )
  ]
  return matched[0] if len(matched) == 1 else None
