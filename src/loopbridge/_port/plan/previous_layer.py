"""A width of each layer of a list, where the layers differ: one element's, or the previous
layer's setting.

A list built in a loop feeds each layer the previous one's output, so each layer's input width
is the previous layer's width (`features`, `out_features`); a loop whose count is a setting
(`range(self.depth - 1)`) builds as many layers as that setting says. The sample's widths
indexed by the loop (`(4, 6)[len(layers)]`) hold only for the sample's count; the previous
layer's setting, `(4 if not layers else layers[-1].out_features)`, holds for any count. It is
written only where every traced configuration shows each layer's value equal to that setting
of the layer before it.
"""

from __future__ import annotations

import re
import typing as tp

from flax import linen as nn

from .hoist import Hoist, list_local
from .loop_target_width import loop_target_width

if tp.TYPE_CHECKING:
  from ..trace.trace import Instance

# The planner (`rewrite_class.Planner`), passed in; typed loosely so this module stays below it.
Planner = tp.Any

_MISSING = object()

# A flax layer -> (its Linen field of the output width, the NNX attribute holding it).
OUTPUT_WIDTH: dict[type, tuple[str, str]] = {
  nn.Dense: ("features", "out_features"),
  nn.Conv: ("features", "out_features"),
  nn.Embed: ("features", "features"),
}


def _equal(a: object, b: object) -> bool:
  try:
    return type(a) is type(b) and bool(a == b)
  except Exception:  # symbols of different scopes: not equal
    return False


def _value(get: tp.Callable[[Instance], object], kid: Instance) -> object:
  try:
    return get(kid)
  except Exception:  # a layer of another class in the list: no value of this construction's
    return _MISSING


def _width(value: object) -> bool:
  if isinstance(value, tuple):
    return bool(value) and all(_width(v) for v in value)
  from ..trace.tracing.expressions import is_symbolic

  return type(value) is int or is_symbolic(value)


Lists = dict[tuple[str, ...], tp.Sequence["Instance"]]


def _lists(planner: Planner, hoist: Hoist) -> list[Lists]:
  """The layers of the list under each parent (by its path), in each traced configuration
  (the user's first, then the resolver's `alts`), in list order."""
  return [dict(hoist.children), *planner.alt_lists(hoist, lambda k: k)]


def _dropped(planner: Planner, kid: Instance) -> set[str] | None:
  """The settings a drafted class's port does not keep as attributes (None: not drafted)."""
  port = planner.ctx.ported.get(kid.cls)
  return None if port is None else set(port.dropped)


def _chosen(pairs: list[tuple[Instance, object]], dropped: set[str]) -> str | None:
  """The one expression of the previous layer's settings (`self.features`, `2 * self.dim`,
  `self.features * self.heads`, as `width_exprs` tries them, simplest first) equal to each
  layer's value in every pair; None where none or several are."""
  from .width_exprs import candidates

  concrete = [(m, v) for m, v in pairs if type(v) is int]
  symbolic = [(m, v) for m, v in pairs if type(v) is not int]
  for tier, found in enumerate(candidates(pairs[0][0].module)):
    matched = [
      text
      for text, get in found
      if not any(f"self.{name}" in text for name in dropped)
      and all(_equal(get(m.module), v) for m, v in concrete)
      # A symbolic trace's settings are symbols: a read of one compares, arithmetic not.
      and (tier > 0 or all(_equal(get(m.module), v) for m, v in symbolic))
    ]
    if len(matched) == 1:
      return matched[0]
    if matched:
      return None
  return None


def _previous_output(hoist: Hoist, pairs: list[tuple[Instance, object]], local: str) -> str | None:
  """`layers[-1].out_features` where each layer's value is the output width of the flax layer
  before it (`nn.Dense(width)` in a loop: each next layer's input width), in every pair."""
  out = OUTPUT_WIDTH.get(tp.cast(type, hoist.site.target))
  if out is None or not pairs:
    return None
  linen_field, nnx_attr = out
  if not all(
    kid.cls is hoist.site.target and _equal(getattr(kid.module, linen_field, None), v)
    for kid, v in pairs
  ):
    return None
  return f"{local}[-1].{nnx_attr}"


def previous_setting(
  planner: Planner, hoist: Hoist, get: tp.Callable[[Instance], object], name: str, index: str
) -> str | None:
  """`(first if not layers else layers[-1].features)` for a list appended to (`index` is
  `len(layers)`), where every traced configuration shows each layer's value (`get`) equal to
  that setting of the layer before it; None where the evidence does not say so."""
  found = re.fullmatch(r"len\((\w+)\)", index)
  if found is None:
    return None
  local = found.group(1)
  # A flax layer's NNX port holds its output width (`nnx.Linear.out_features`).
  standard = hoist.site.target in OUTPUT_WIDTH
  pairs: list[tuple[Instance, object]] = []  # (the layer before, this layer's value)
  dropped: set[str] = set()
  firsts: list[dict[tuple[str, ...], object]] = []
  unknown_first = False  # a first layer of this class whose value no trace shows
  for lists in _lists(planner, hoist):
    first: dict[tuple[str, ...], object] = {}
    for parent, layers in lists.items():
      for k, kid in enumerate(layers):
        value = _value(get, kid)
        if value is _MISSING or value is None or kid.cls is not hoist.site.target:
          unknown_first |= k == 0 and kid.cls is hoist.site.target
          continue
        if not _width(value) or isinstance(value, tuple):
          return None
        if k == 0:
          first[parent] = value
          continue
        unkept = _dropped(planner, layers[k - 1])
        if unkept is None and not standard:
          return None  # a layer the draft does not write: its settings are not its port's
        dropped |= unkept or set()
        pairs.append((layers[k - 1], value))
    firsts.append(first)
  previous = _previous_output(hoist, pairs, local)
  if previous is None:
    chosen = _chosen(pairs, dropped) if pairs and not standard else None
    if chosen is None:
      return None  # no layer after another, or no single expression matches: no evidence
    previous = chosen.replace("self.", f"{local}[-1].")
  if not any(firsts):
    # No configuration builds this construction's layer first in its list. Where another
    # class comes first (diffusers' blocks), `layers[-1]` always exists. Where the first layer
    # is of this class but made no such value (a ResNet block's projection, made only where a
    # block changes the shape), nothing says what it would take, and `layers[-1]` of an empty
    # list would fail to build: no evidence.
    return None if unknown_first else previous
  if not firsts[0]:
    return None  # only another configuration's first layer: no expression of the user's
  at_first = planner.resolver.expr(firsts[0], name, firsts[1:])
  return f"({at_first} if not {local} else {previous})"


def list_width(
  planner: Planner,
  hoist: Hoist,
  get: tp.Callable[[Instance], object],
  name: str,
  index: str | None,
  per: tp.Mapping[tuple[str, ...], tuple[object, ...]],
  alt_per: tp.Sequence[tp.Mapping[tuple[str, ...], tuple[object, ...]]],
) -> str:
  """The width of the element `index` picks of a list whose elements differ (`per`: each
  parent's values in list order; `alt_per`: the same in each derived configuration)."""
  if index is not None and index.isdigit():
    # One element of the list (its literal's position): that element's own width.
    k = int(index)
    alt_kth = [{p: t[k] for p, t in d.items() if len(t) > k} for d in alt_per]
    return planner.resolver.expr({p: t[k] for p, t in per.items() if len(t) > k}, name, alt_kth)
  if index is not None and (found := previous_setting(planner, hoist, get, name, index)):
    return found
  if index is not None and index.isidentifier() and hoist.site.loop is not None:
    # A loop appends one layer per pass (`write_class`): its index is the list's length.
    counted = f"len({list_local(planner, hoist)})"
    if not hoist.counter and (found := previous_setting(planner, hoist, get, name, counted)):
      return found
  if hoist.counter and (found := loop_target_width(planner, hoist, per, alt_per)) is not None:
    return found
  return f"{planner.resolver.expr(per, name, alt_per)}[{index}]"
