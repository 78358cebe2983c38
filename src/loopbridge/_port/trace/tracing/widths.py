"""A class's width from the symbolic trace, for `Resolver.expr` (`values.py`).

The symbolic trace is the last of the traces the resolver reads (`Context.alt_traces`). A
width whose symbolic value is written in the class's own names is that expression; one that
needs a symbol the class does not hold becomes an argument its parent passes (never a field
of equal value); a width the symbolic trace gives as a number is a constant when no setting
was kept concrete. What none of this decides is matched by value, and named as such
(`Resolver.by_value`, the draft's `literals`).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing as tp

from .expressions import has_symbols, reads, value_at, writings
from .settings import Setting
from .symbolic import InputAxis, Symbolic

# The resolver (`values.Resolver`, which imports this module): read through its attributes.
Resolver = tp.Any

# What `symbolic_width` says when the width is the parent's to pass.
PASSED = "passed by the parent"


@dataclasses.dataclass
class SymbolicWidths:
  """What a resolver needs of the symbolic trace."""

  index: int  # of the symbolic trace among the resolver's `alts`
  found: Symbolic
  inputs: dict[str, str]  # symbol of a root input axis -> the root argument it becomes
  # Per trace the resolver reads, each symbol's value in that configuration (None: unknown).
  sizes: list[dict[str, int] | None] = dataclasses.field(default_factory=list)

  @property
  def exact(self) -> bool:
    """No setting was kept concrete: a number in the symbolic trace is a constant."""
    return not self.found.concrete


def input_names(found: Symbolic, root_cls: type, method: str | None) -> dict[str, str]:
  """Symbol of each root input axis -> the name of the root argument it becomes
  (`x_features` for the last axis of `x`, `x_axis1` for another)."""
  try:
    params = [
      p.name for p in inspect.signature(getattr(root_cls, method or "__call__")).parameters.values()
    ][1:]
  except (TypeError, ValueError):
    params = []
  out: dict[str, str] = {}
  for name, c in found.symbols.items():
    if not isinstance(c, InputAxis):
      continue
    arg = (
      c.where
      if isinstance(c.where, str)
      else (params[c.where] if c.where < len(params) else f"arg{c.where}")
    )
    rank = _rank(found, c)
    out[name] = f"{arg}_features" if c.axis == rank - 1 else f"{arg}_axis{c.axis}"
  return out


def _rank(found: Symbolic, axis: InputAxis) -> int:
  return 1 + max(c.axis for c in found.bound if isinstance(c, InputAxis) and c.where == axis.where)


def symbolic_width(
  resolver: Resolver,
  values: tp.Mapping[tuple[str, ...], object],
  alt_values: tp.Sequence[tp.Mapping[tuple[str, ...], object]],
) -> str | None:
  """The expression of `values` from the symbolic trace; `PASSED` when the class cannot say it
  (its parent passes it); None when the trace does not decide (matched by value)."""
  view = resolver.symbolic
  if view is None or view.index >= len(alt_values):
    return None
  symbolic = alt_values[view.index]
  if not values:
    # Made only at a branch configuration, where the symbolic trace was made too
    # (`branch_symbolic.py`): its value at the sample's numbers is what that trace says.
    values = {p: value_at(s, view.found.sample) for p, s in symbolic.items() if has_symbols(s)}
    if not values:
      return None
  instances = resolver.alts[view.index]
  texts: list[str] | None = None  # the writings every instance so far agrees on
  passed = False
  for path, value in values.items():
    inst = instances.get(path)
    if inst is None or path not in symbolic:
      return None
    sym = symbolic[path]
    if not has_symbols(sym):
      if not view.exact or not _ints(sym) or sym != value:
        return None  # a number from a setting kept concrete, or no width: matched by value
      texts = _agreed(texts, [repr(sym)])
      continue
    if value_at(sym, view.found.sample) != value:
      return None  # not the width this trace recorded: no evidence
    env = reads(inst.module)
    if resolver.root:
      env += [(s, n) for s, n in _input_symbols(view)]
    found = writings(sym, env)
    if not found:
      passed = True
      continue
    texts = _agreed(texts, found)
  if not _holds_elsewhere(view, symbolic, alt_values):
    return None  # another configuration (a branch) computes it otherwise: matched by value
  if passed or not texts:
    return None if resolver.root else PASSED
  text = texts[0]
  if resolver.root and _reads_inputs(view, text):
    # A width read from the root's input (`x.shape[-1]`): a constructor argument, as NNX
    # layers take their input width when built; the sample's number would be silently wrong
    # for an input of another size.
    add_inputs(resolver, view, text, len(alt_values))
  return text


def _agreed(texts: list[str] | None, found: list[str]) -> list[str]:
  """The writings of the instances so far that this instance can be written as too."""
  return list(found) if texts is None else [t for t in texts if t in found]


def _reads_inputs(view: SymbolicWidths, text: str) -> bool:
  return any(re.search(rf"\b{re.escape(n)}\b", text) for n in view.inputs.values())


def _holds_elsewhere(
  view: SymbolicWidths,
  symbolic: tp.Mapping[tuple[str, ...], object],
  alt_values: tp.Sequence[tp.Mapping[tuple[str, ...], object]],
) -> bool:
  """Whether the symbolic value, at each other traced configuration's settings, is the value
  traced there (the symbolic trace follows the user's branches only)."""
  for k, found in enumerate(alt_values):
    sizes = view.sizes[k] if k < len(view.sizes) else None
    if k == view.index or sizes is None:
      continue
    for path, value in found.items():
      if path in symbolic and value_at(symbolic[path], sizes) != value:
        return False
  return True


def _ints(value: object) -> bool:
  if isinstance(value, tuple):
    return all(_ints(v) for v in value)
  return type(value) is int


def _input_symbols(view: SymbolicWidths) -> list[tuple[object, str]]:
  found = view.found
  by_name = {name: found.bound[c] for name, c in found.symbols.items()}
  return [(by_name[s], n) for s, n in view.inputs.items()]


def add_inputs(resolver: Resolver, view: SymbolicWidths, text: str, alts: int) -> None:
  """The root arguments `text` reads for input axes: each an added argument of the root."""
  found = view.found
  for symbol, name in view.inputs.items():
    if name in resolver.extras or not re.search(rf"\b{re.escape(name)}\b", text):
      continue
    value = found.symbols[symbol].value  # the axis's size (a multiple's symbol is its quotient)
    alt: list[dict[tuple[str, ...], object]] = [{(): value} for _ in range(alts)]
    alt[view.index] = {(): found.bound[found.symbols[symbol]]}
    # The sample's size by default: the port builds as before for inputs of that size.
    resolver.add_extra(name, {(): value}, alt, default=repr(value))


def traced_symbolically(root: tp.Any, sample: tp.Any, streams: tp.Any) -> SymbolicWidths | None:
  """The symbolic trace of the root's sample call (None when nothing traces symbolically);
  its index among the traces is set by `symbolic_widths`."""
  from .symbolic import symbolic_trace

  found = symbolic_trace(root, sample, streams, 0)
  if found is None:
    return None
  return SymbolicWidths(-1, found, input_names(found, type(root), sample.method))


def symbolic_widths(view: SymbolicWidths, traces: list[tp.Any]) -> SymbolicWidths:
  """`view` made the last of `traces` (appended; its instances numbered as that configuration)."""
  sizes = [_sizes_at(view.found, t) for t in traces]
  traces.append(view.found.trace)
  for inst in view.found.trace.instances.values():
    inst.config = len(traces)
  return dataclasses.replace(view, index=len(traces) - 1, sizes=[*sizes, None])


def _sizes_at(found: Symbolic, traced: tp.Any) -> dict[str, int] | None:
  """Each symbol's value in the configuration of `traced` (its root's settings; the input's
  sizes are the sample's), or None when a setting does not read there. A setting left None
  there (an optional width flipped, `branch_configs.optional_changes`) has no value: an
  expression of it does not hold there."""
  from .settings import read

  root = traced.instances.get(())
  if root is None:
    return None
  values: dict[tp.Any, int] = {}
  for c in found.bound:
    if isinstance(c, InputAxis):
      values[c] = c.value
      continue
    try:
      value = read(root.module, c.location)
    except Exception:  # not a setting of that configuration
      return None
    if value is None:
      continue
    if type(value) is not int:
      return None
    values[c] = value
  out: dict[str, int] = {}
  for name, c in found.symbols.items():
    divisor = found.divisors.get(name)
    if c not in values or (divisor is not None and divisor not in values):
      continue
    if divisor is not None:
      out[name] = values[c] // values[divisor]
    else:
      out[name] = values[c] // found.factors.get(name, 1)
  return out


@dataclasses.dataclass(frozen=True)
class ByValue:
  """A width the symbolic trace did not decide: written `expression` by matching values."""

  cls: str
  hint: str
  expression: str
  value: object
  why: str

  def __str__(self) -> str:
    return f"{self.cls}: {self.hint} = {self.value!r}, written {self.expression} ({self.why})"


def _why(resolver: Resolver) -> str:
  view = resolver.symbolic
  if view is None:
    return "the symbolic trace did not run (a setting or size no symbol can stand for)"
  kept = [c.source() if isinstance(c, Setting) else c.label() for c in view.found.concrete]
  if not kept:
    return "a width the sample's configuration does not build, or a branch computes otherwise"
  return (
    "settings kept concrete in the symbolic trace: "
    + ", ".join(kept[:6])
    + (", ..." if len(kept) > 6 else "")
  )


def by_value(
  ctx: tp.Any, classes: tp.Sequence[type], kind: str = "by_value"
) -> tuple[ByValue, ...]:
  """Every width of the drafted classes matched by value (`kind="constants"`: every width
  the symbolic trace found constant)."""
  out: list[ByValue] = []
  for cls in classes:
    resolver = ctx.ported[cls].resolver
    if resolver is None:
      continue
    seen: set[tuple[str, str]] = set()
    for hint, text, value in getattr(resolver, kind):
      if (hint, text) not in seen:
        seen.add((hint, text))
        why = _why(resolver) if kind == "by_value" else "constant in the symbolic trace"
        out.append(ByValue(cls.__name__, hint, text, value, why))
  return tuple(out)


def by_value_notes(ctx: tp.Any, cls: type) -> list[tp.Any]:
  """Report rows for the widths of `cls` matched by value."""
  from ...records import Change

  port = ctx.ported[cls]
  return [
    Change(
      port.source.file,
      port.source.first_line,
      f"{b.hint} = {b.value!r} at the traced configuration",
      b.expression,
      f"matched by value, not read from the symbolic trace ({b.why}): right only where the "
      "check at a configuration where every setting is distinct passed (the verdict names "
      "the configurations checked)",
    )
    for b in by_value(ctx, [cls])
  ]


def input_notes(ctx: tp.Any, cls: type) -> list[tp.Any]:
  """Report rows for the root's constructor arguments that are sizes of its input."""
  from ...records import Change

  port = ctx.ported[cls]
  resolver = port.resolver
  view = getattr(resolver, "symbolic", None)
  if resolver is None or view is None or not resolver.root:
    return []
  out = []
  for symbol, name in view.inputs.items():
    if name not in resolver.extras:
      continue
    axis = view.found.symbols[symbol]
    size = axis.value
    out.append(
      Change(
        port.source.file,
        port.source.first_line,
        f"{axis.label()} = {size} in the sample",
        f"{name} (a constructor argument, the sample's {size} by default)",
        "a width read from the input's size: NNX layers take it when built; pass "
        f"{name}= for inputs of another size",
      )
    )
  return out


def input_axes(ctx: tp.Any, cls: type) -> dict[str, tuple[int | str, int]]:
  """Each root constructor argument that is a size of the input: name -> (the sample call's
  argument, position or keyword; the axis)."""
  resolver = ctx.ported[cls].resolver
  view = getattr(resolver, "symbolic", None)
  if resolver is None or view is None or not resolver.root:
    return {}
  out: dict[str, tuple[int | str, int]] = {}
  for symbol, name in view.inputs.items():
    axis = view.found.symbols[symbol]
    if name in resolver.extras and isinstance(axis, InputAxis):
      out[name] = (axis.where, axis.axis)
  return out
