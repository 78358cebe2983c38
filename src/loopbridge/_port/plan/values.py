"""Per-instance values -> one expression: a literal, a field, or a new constructor argument.

A class is written once for all its instances. A number the trace gives (an input width, a
shape, whether a conditional layer exists) becomes a literal when every instance agrees, a
field when it equals that field in every instance, and otherwise a constructor argument of
its own whose value each instance's parent passes (so no value is ever guessed).
"""

from __future__ import annotations

import dataclasses
import typing as tp

from ..emit.literals import literal
from ..trace.trace import Instance
from ..trace.tracing.widths import PASSED, SymbolicWidths, add_inputs, symbolic_width
from .width_exprs import explain

_MISSING = object()


@dataclasses.dataclass
class Extra:
  """A constructor argument the draft adds: its name and each instance's value."""

  name: str
  values: dict[tuple[str, ...], object]  # instance path -> value
  # Per derived configuration, instance path -> value there (what builds the port at it).
  alt: list[dict[tuple[str, ...], object]] = dataclasses.field(default_factory=list)

  def value_of(self, inst: Instance) -> object:
    """The value for an instance of the user's configuration or of a derived one (where the
    derived trace gave none, the user's at the same path)."""
    if inst.config and inst.config <= len(self.alt) and inst.path in self.alt[inst.config - 1]:
      return self.alt[inst.config - 1][inst.path]
    return self.values.get(inst.path)

  # Source of its default (a root's input width: the sample's), or None (always passed).
  default: str | None = None

  def parameter(self) -> str:
    """`name: int` (`name: int = 6` with a default) in the constructor's signature."""
    text = f"{self.name}: {self.annotation()}"
    return text if self.default is None else f"{text} = {self.default}"

  def annotation(self) -> str:
    seen = [*self.values.values(), *(v for d in self.alt for v in d.values())]
    if self.default == "None" and all(v is None for v in seen):
      return "int | None"  # a width given only to build a layer no call reached
    sample = next(iter(seen))
    return type(sample).__name__ if isinstance(sample, (bool, int, float, tuple)) else "object"


class Resolver:
  """Turns per-instance values into expressions for one class (owns its added arguments)."""

  def __init__(
    self,
    instances: tp.Sequence[Instance],
    fields: tp.Sequence[str],
    alts: tp.Sequence[tp.Mapping[tuple[str, ...], Instance]] = (),
    root: bool = False,
    symbolic: SymbolicWidths | None = None,
  ):
    self.instances = list(instances)
    self.fields = list(fields)
    self.extras: dict[str, Extra] = {}
    # The class's instances in each derived configuration's trace, by path.
    self.alts = list(alts)
    # The drafted root: no parent can explain its numbers, so one nothing explains is kept a
    # literal (and reported) rather than becoming an argument the user must find a value for.
    self.root = root
    # (hint, value, why) of each number kept a literal although it changed with the config.
    self.unexplained: list[tuple[str, object, str]] = []
    # Hints of the values of constructions no trace made (written `None`).
    self.untraced: list[str] = []
    # The symbolic trace, the last of `alts` (`tracing/widths.py`), when it ran.
    self.symbolic = symbolic
    # (hint, expression written, sample value) of each width the symbolic trace did not
    # decide: matched by value, so right only where a check at other values says so.
    self.by_value: list[tuple[str, str, object]] = []
    # (hint, number, number) of each width the symbolic trace found constant: no setting or
    # input size moves it, yet an array a field holds may (`check/array_sizes.py`).
    self.constants: list[tuple[str, str, object]] = []

  def expr(
    self,
    values: tp.Mapping[tuple[str, ...], object],
    hint: str,
    alt_values: tp.Sequence[tp.Mapping[tuple[str, ...], object]] = (),
    from_input: bool = False,
    fallback: tp.Callable[[], str | None] | None = None,
  ) -> str:
    """The expression (valid in `__init__`) equal to `values[path]` in every instance: from
    the symbolic trace where it decides (`tracing/widths.py`), else matched by value
    (`matched`), and then recorded in `by_value`."""
    found = symbolic_width(self, values, alt_values)
    if found == PASSED:
      return self._added(values, hint, alt_values)
    if found is not None:
      if found.isdigit():
        self.constants.append((hint, found, int(found)))
      return found
    concrete = list(alt_values)
    if self.symbolic is not None and self.symbolic.index < len(concrete):
      concrete[self.symbolic.index] = {}  # symbols are no values to match
    text = self.matched(values, hint, concrete, from_input, fallback, alt_values)
    # An added argument is the parent's to pass (its own expression is recorded there). A
    # construction only another configuration makes (a branch) is named by its value there.
    seen = values or next((d for d in concrete if d), {})
    if text not in self.extras and seen and all(_width_like(v) for v in seen.values()):
      self.by_value.append((hint, text, next(iter(seen.values()))))
    return text

  def matched(
    self,
    values: tp.Mapping[tuple[str, ...], object],
    hint: str,
    alt_values: tp.Sequence[tp.Mapping[tuple[str, ...], object]] = (),
    from_input: bool = False,
    fallback: tp.Callable[[], str | None] | None = None,
    full_alts: tp.Sequence[tp.Mapping[tuple[str, ...], object]] | None = None,
  ) -> str:
    """The expression equal to `values[path]` in every instance, matched by value.

    `alt_values` holds the same number in each derived configuration (`configs.py`): a value
    that changes with the fields becomes the field expression that matches everywhere.
    `from_input`: a size of the call's input; one no field explains is a constructor argument
    (as NNX's `in_features`), never the sample's number.
    `fallback`: another expression the caller can prove (a setup local equal everywhere),
    asked where nothing here explains the value, before a literal or an added argument.
    """
    proven = fallback if fallback is not None else lambda: None
    distinct = list(values.values())
    elsewhere = [v for d in alt_values for v in d.values()]
    if not distinct and not elsewhere:
      # No trace made this construction (a branch no traced configuration takes, as HF's
      # cross-attention): nothing says its value. `None`, named in the report, fails loudly
      # where the branch runs; every field matched vacuously (the first, `self.config`, won).
      self.untraced.append(hint)
      return "None"
    same = bool(distinct) and all(
      v == distinct[0] and type(v) is type(distinct[0]) for v in distinct
    )
    if (
      same
      and not from_input
      and all(v == distinct[0] and type(v) is type(distinct[0]) for v in elsewhere)
    ):
      text = literal(distinct[0])
      if text is not None:
        return text
    if elsewhere:
      found = explain(self._samples(values, alt_values))
      if found.expr is not None:
        return found.expr
      if not distinct:
        # Only a configuration the user's does not take made it (a branch, `branch_configs`):
        # no instance of the user's can take a value, so the one seen there is written.
        text = literal(elsewhere[0])
        if text is not None and any(v != elsewhere[0] for v in elsewhere):
          if (local := proven()) is not None:
            return local
          self.unexplained.append(
            (
              hint,
              elsewhere[0],
              "only other configurations built it, "
              "and no field, config attribute, or product or sum of two matches it in all",
            )
          )
        if text is not None:
          # The root's input size where it equals the width in every configuration that built
          # it (all at the sample's input): the check runs the port there at another size.
          return self._input_size(alt_values) or text
      text = literal(distinct[0]) if same and not from_input and self.root else None
      if text is not None:
        if (local := proven()) is not None:
          return local
        why = (
          f"both {' and '.join(found.matches)} match in every configuration traced"
          if found.matches
          else "no field, config attribute, or product or sum of two matches it in every "
          "configuration traced"
        )
        self.unexplained.append((hint, distinct[0], why))
        return text
    for name in self.fields if distinct else ():
      if all(
        type(v) in (int, bool, tuple) and _field(inst, name) == v
        for inst in self.instances
        if (v := values.get(inst.path, _MISSING)) is not _MISSING
      ):
        return f"self.{name}"
    if (local := proven()) is not None:
      return local
    return self._added(values, hint, alt_values if full_alts is None else full_alts)

  def _input_size(self, alt_values: tp.Sequence[tp.Mapping[tuple[str, ...], object]]) -> str | None:
    """The root's input-size argument (`x_features`) equal to `alt_values` wherever they hold
    a value, or None."""
    if not self.root or not any(alt_values):
      return None
    for extra in self.extras.values():
      if (
        extra.default is not None
        and extra.default != "None"
        and all(
          k < len(extra.alt) and extra.alt[k].get(path, _MISSING) == v
          for k, found in enumerate(alt_values)
          for path, v in found.items()
        )
      ):
        return extra.name
    # One not added yet (the param built before the layer that reads it): the one root input
    # axis of that size, where no other has it (several: no evidence which).
    seen = {v for found in alt_values for v in found.values()}
    view = self.symbolic
    if view is None or len(seen) != 1:
      return None
    size = seen.pop()
    axes = [n for s, n in view.inputs.items() if view.found.symbols[s].value == size]
    same = [s for s in view.found.symbols.values() if getattr(s, "value", None) == size]
    if len(axes) != 1 or len(same) != 1:
      return None  # several axes, or a setting, of that size: no evidence which
    add_inputs(self, view, axes[0], len(alt_values))
    return axes[0] if axes[0] in self.extras else None

  def add_extra(
    self,
    name: str,
    values: dict[tuple[str, ...], object],
    alt: list[dict[tuple[str, ...], object]],
    default: str | None = None,
  ) -> None:
    """Add a constructor argument by name (a root's input width, `tracing/widths.py`)."""
    self.extras[name] = Extra(name, values, alt, default)

  def _added(
    self,
    values: tp.Mapping[tuple[str, ...], object],
    hint: str,
    alt_values: tp.Sequence[tp.Mapping[tuple[str, ...], object]],
  ) -> str:
    """A constructor argument holding each instance's value (the parent passes it)."""
    for extra in self.extras.values():
      if extra.values == dict(values) and (
        not any(alt_values) or _same_alts(extra.alt, alt_values)
      ):
        return extra.name
    for extra in self.extras.values():
      # A layer only some instances build (a shortcut under `in != out`) whose width is
      # another argument's wherever it is built, in every configuration: that argument.
      if _covered(extra.values, values) and (
        not any(alt_values)
        or all(_covered(a, b) for a, b in zip(extra.alt, alt_values, strict=False))
      ):
        return extra.name
    name = hint
    n = 1
    while name in self.extras or name in self.fields:
      n += 1
      name = f"{hint}_{n}"
    self.extras[name] = Extra(name, dict(values), [dict(d) for d in alt_values])
    return name

  def _samples(
    self,
    values: tp.Mapping[tuple[str, ...], object],
    alt_values: tp.Sequence[tp.Mapping[tuple[str, ...], object]],
  ) -> list[tuple[object, object]]:
    """(instance's module, value) in every configuration that has both."""
    out: list[tuple[object, object]] = [
      (i.module, values[i.path]) for i in self.instances if i.path in values
    ]
    for alts, found in zip(self.alts, alt_values):
      out += [(alts[p].module, v) for p, v in found.items() if p in alts]
    return out


def _covered(
  wider: tp.Mapping[tuple[str, ...], object], values: tp.Mapping[tuple[str, ...], object]
) -> bool:
  """Whether `wider` holds each value of `values` (None: an instance that builds no such
  layer) at its path, `values` having one at least."""
  found = {p: v for p, v in values.items() if v is not None}
  try:
    return bool(found) and all(p in wider and wider[p] == v for p, v in found.items())
  except Exception:  # symbols that cannot be compared: not the same argument
    return False


def _same_alts(
  a: tp.Sequence[tp.Mapping[tuple[str, ...], object]],
  b: tp.Sequence[tp.Mapping[tuple[str, ...], object]],
) -> bool:
  try:
    return list(map(dict, a)) == list(map(dict, b))
  except Exception:  # symbols that cannot be compared: not the same argument
    return False


def _width_like(value: object) -> bool:
  """An int or a tuple of ints (no flag, dtype or name)."""
  if isinstance(value, tuple):
    return bool(value) and all(_width_like(v) for v in value)
  return type(value) is int


def _field(inst: Instance, name: str) -> object:
  return getattr(inst.module, name, _MISSING)
