"""The symbolic trace: one abstract Linen `init` with symbols for the integer settings and the
input's axis sizes, so every width the trace records is an expression of them.

`jax.eval_shape` of `init` with `jax.export.symbolic_shape` symbols in the fields (and in the
sample's shapes) gives each param shape, each submodule's fields and each call's input shape as
an expression of those symbols: an MLP built from `layer_sizes=(a, b, c)` on `(B, C)` inputs has
kernels `(C, a)`, `(a, b)`, `(b, c)`. Which setting a width comes from is then read, not guessed
from coincidences of values.

A setting the model uses in Python control flow, in float arithmetic or in a check a symbol
cannot pass stays concrete, one setting at a time (a config object's other attributes stay
symbolic): the settings are added to the symbolic trace a group at a time, a group that fails
is split (first the settings the error names apart from the rest), and one that fails alone is
tried once more tied to an equal-valued input size (`assert x.shape[-1] == self.in_dim`) or as
a multiple of a smaller setting it divides (`qkv_features` a multiple of `num_heads`, which
attention checks; of its value where that setting stays concrete), else kept concrete and
listed (`Symbolic.concrete`). Input axes of equal size share one symbol (a model adds the
embeddings of `input_ids` and `position_ids`), and are tried one by one where that fails.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing as tp

import jax
from flax import linen as nn

from ...._compat import symbolic_safe_initializers, symbolic_safe_modules
from ...records import Call
from ..trace import Trace, trace
from .settings import Setting, settings, with_values

# At most this many abstract inits are spent finding the settings that stay concrete.
MAX_TRIALS = 64


@dataclasses.dataclass(frozen=True)
class InputAxis:
  """An axis of an array argument of the sample call: `where` is the position or keyword."""

  where: int | str
  axis: int
  value: int

  def label(self) -> str:
    arg = f"argument {self.where}" if isinstance(self.where, int) else f"{self.where}="
    return f"axis {self.axis} of the sample call's {arg}"


Candidate = Setting | InputAxis


@dataclasses.dataclass
class Symbolic:
  """The symbolic trace of the root, and what each symbol stands for."""

  trace: Trace
  # symbol name -> the setting or input axis it is (a setting tied to an input axis, or a
  # multiple of another setting, has no symbol of its own: see `bound`).
  symbols: dict[str, Candidate]
  # each setting's value in the symbolic module (a symbol, or an expression of them)
  bound: dict[Candidate, object]
  # settings kept concrete (their widths are matched by value, and checked elsewhere)
  concrete: tuple[Candidate, ...]
  # symbol name -> its value at the sample (a multiple's own symbol: the quotient)
  sample: dict[str, int] = dataclasses.field(default_factory=dict)
  # symbol name of a multiple -> the setting it is a multiple of
  divisors: dict[str, Candidate] = dataclasses.field(default_factory=dict)
  # symbol name of a multiple of a number -> that number (a setting kept concrete's value)
  factors: dict[str, int] = dataclasses.field(default_factory=dict)
  # the candidates and how each symbolic one entered the trial that made `trace`
  candidates: tuple[Candidate, ...] = ()
  plans: dict[int, Plan] = dataclasses.field(default_factory=dict)

  def concrete_settings(self) -> list[Setting]:
    return [c for c in self.concrete if isinstance(c, Setting)]


def input_axes(sample: Call) -> list[InputAxis]:
  """Every axis of size 2 or more of the sample call's top-level array arguments."""
  found: list[InputAxis] = []
  items: list[tuple[int | str, object]] = [*enumerate(sample.args), *sample.kwargs.items()]
  for where, value in items:
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
      continue
    shape = tuple(getattr(value, "shape", ()))
    found += [InputAxis(where, axis, int(n)) for axis, n in enumerate(shape) if int(n) >= 2]
  return found


# How a candidate enters one trial: its own symbol ("own"), the symbol of an equal-valued
# candidate ("share"), its own symbol times another candidate's symbol ("times"), times
# another candidate's value, that candidate staying concrete ("scaled"), or times a number
# ("multiple": an input width as a multiple of its own size, which an attention's heads divide),
# or an input axis as that many times an equal-or-smaller setting's symbol as at the sample
# ("per": a block adding its input to a layer `2 * self.b` wide).
Plan = tuple[str, int | None]
# Candidates (indices) tied to one symbol.
Unit = tuple[int, ...]


def _trial(
  module: nn.Module,
  sample: Call,
  streams: tp.Iterable[str],
  candidates: list[Candidate],
  plans: dict[int, Plan],
  config: int,
  modules: tp.Sequence[types.ModuleType] = (),
) -> tuple[Trace, dict[str, Candidate], dict[Candidate, object]]:
  """One abstract init with the planned candidates symbolic (raises what the init raises)."""
  from jax import export

  names = [f"_s{i}" for i in sorted(plans) if plans[i][0] not in ("share", "per")]
  made = export.symbolic_shape(", ".join(names)) if names else ()
  symbol = dict(zip(names, made))
  bound: dict[Candidate, object] = {}
  for i in sorted(plans, key=lambda i: plans[i][0] != "own"):  # partners are bound first
    kind, other = plans[i]
    if kind == "own":
      bound[candidates[i]] = symbol[f"_s{i}"]
    elif kind == "times":
      factor: tp.Any = bound[candidates[tp.cast(int, other)]]
      bound[candidates[i]] = factor * symbol[f"_s{i}"]
    elif kind == "scaled":
      bound[candidates[i]] = candidates[tp.cast(int, other)].value * symbol[f"_s{i}"]
    elif kind == "multiple":
      bound[candidates[i]] = tp.cast(int, other) * symbol[f"_s{i}"]
  for i, (kind, other) in plans.items():
    if kind not in ("share", "per"):
      continue
    partner = candidates[tp.cast(int, other)]
    shared: tp.Any = bound[partner]
    # "per": an input axis as many times the setting as at the sample
    bound[candidates[i]] = (
      shared if kind == "share" else candidates[i].value // partner.value * shared
    )
  values = {c.location: v for c, v in bound.items() if isinstance(c, Setting)}
  symbolic_module = with_values(module, values) if values else module.clone(parent=None)
  args = list(sample.args)
  kwargs = dict(sample.kwargs)
  shapes: dict[int | str, list[object]] = {}
  for c, v in bound.items():
    if isinstance(c, InputAxis):
      holder = args[c.where] if isinstance(c.where, int) else kwargs[c.where]
      shapes.setdefault(c.where, list(tp.cast(tp.Any, holder).shape))[c.axis] = v
  for where, shape in shapes.items():
    holder = tp.cast(tp.Any, args[where] if isinstance(where, int) else kwargs[where])
    abstract = jax.ShapeDtypeStruct(tuple(shape), holder.dtype)
    if isinstance(where, int):
      args[where] = abstract
    else:
      kwargs[where] = abstract
  # jax 0.12's initializers, flax's DenseGeneral and the user's `int(x.shape[-1])` on symbols
  with symbolic_safe_initializers(), symbolic_safe_modules(modules):
    traced = trace(symbolic_module, [(sample.method, tuple(args), kwargs)], streams, config)
  return traced, {n: candidates[int(n[2:])] for n in names}, bound


# Modules of these packages are never the user's.
_LIBRARIES = ("flax", "jax", "jaxlib", "numpy", "loopbridge", "optax", "transformers", "builtins")


def user_modules(module: nn.Module) -> list[types.ModuleType]:
  """The modules the user's model code lives in: the root class's module and every loaded
  module of its top-level package (score_sde's `models.layers` for `models.layerspp`)."""
  name = type(module).__module__
  top = name.split(".")[0]
  if top in _LIBRARIES:
    return []
  return [
    m
    for n, m in list(sys.modules.items())
    if isinstance(m, types.ModuleType) and (n in (top, name) or n.startswith(f"{top}."))
  ]


def _units(candidates: list[Candidate]) -> list[Unit]:
  """The candidates tried together: input axes of equal size share one symbol (the batch and
  sequence axes of `input_ids` and of `position_ids`, which the model adds), each setting is
  its own."""
  axes: dict[int, list[int]] = {}
  out: list[list[int]] = []
  for i, c in enumerate(candidates):
    if isinstance(c, InputAxis) and c.value in axes:
      axes[c.value].append(i)
      continue
    out.append([i])
    if isinstance(c, InputAxis):
      axes[c.value] = out[-1]
  return [tuple(u) for u in out]


def _planned(units: tp.Iterable[Unit]) -> dict[int, Plan]:
  """Each unit's first candidate with a symbol of its own, the rest sharing it."""
  plans: dict[int, Plan] = {}
  for unit in units:
    plans[unit[0]] = ("own", None)
    plans.update(dict.fromkeys(unit[1:], ("share", unit[0])))
  return plans


def _named(error: BaseException | None, chunk: list[Unit]) -> list[Unit]:
  """The units of `chunk` whose symbols the error's message names (jax names the symbols of
  an inconclusive comparison or a mismatched shape; a model's own check prints them)."""
  names = set(re.findall(r"\b_s(\d+)\b", str(error))) if error is not None else set()
  return [u for u in chunk if str(u[0]) in names]


def symbolic_trace(
  module: nn.Module, sample: Call, streams: tp.Iterable[str], config: int
) -> Symbolic | None:
  """The symbolic trace of the sample call (`config`: the index its instances carry), or None
  when not even the concrete settings trace symbolically (then widths are matched by value)."""
  candidates: list[Candidate] = [*input_axes(sample), *settings(module)]
  if not candidates:
    return None
  trials = 0
  error: BaseException | None = None
  modules = user_modules(module)  # where the user's `int(x.shape[-1])` is made symbol-safe

  def attempt(plans: dict[int, Plan]):
    nonlocal trials, error
    trials += 1
    try:
      return _trial(module, sample, streams, candidates, plans, config, modules)
    except Exception as e:  # a setting a symbol cannot stand for: the caller narrows the plan
      error = e
      return None

  own: Plan = ("own", None)
  everything: dict[int, Plan] = dict.fromkeys(range(len(candidates)), own)
  found = attempt(everything)
  kept: dict[int, Plan] = {}
  if found is None:
    # Group testing over units: add them a chunk at a time; a chunk that fails is split
    # (the units its error names apart from the rest, else in halves); tied input axes that
    # fail together are tried one by one; a unit that fails alone gets its alternatives.
    queue = [_units(candidates)]
    last = None
    settled: list[int] = []  # the candidates found to stay concrete
    while queue and trials < MAX_TRIALS:
      chunk = [u for u in queue.pop(0) if u[0] not in kept]
      if not chunk:
        continue
      result = attempt({**kept, **_planned(chunk)})
      if result is not None:
        kept.update(_planned(chunk))
        last = result
        continue
      if len(chunk) > 1:
        named = _named(error, chunk)
        if named and len(named) < len(chunk):
          queue[:0] = [[u for u in chunk if u not in named], *([u] for u in named)]
        else:
          half = len(chunk) // 2
          queue[:0] = [chunk[:half], chunk[half:]]
        continue
      first, *rest = chunk[0]
      if rest:
        queue[:0] = [[(i,)] for i in chunk[0]]
        continue
      plan = _alternative(candidates, first, kept, attempt, settled)
      if plan is not None:
        kept, last = plan
      else:
        settled.append(first)
    # Once every setting that stays concrete is known, each is tried once more as a multiple
    # of another one's value (`dim` tried before `n_heads` was found concrete), else of its own.
    for index in list(settled):
      if trials >= MAX_TRIALS:
        break
      plan = _scaled(candidates, index, kept, attempt, settled)
      if plan is None and isinstance(candidates[index], Setting) and trials < MAX_TRIALS:
        plan = _own_multiple(candidates, index, kept, attempt)
      if plan is not None:
        kept, last = plan
        settled.remove(index)
    if not kept:
      return None
    found = last if last is not None else attempt(kept)
    if found is None:
      return None
  else:
    kept = everything
  traced, symbols, bound = found
  concrete = tuple(c for i, c in enumerate(candidates) if i not in kept)
  sizes: dict[str, int] = {}
  divisors: dict[str, Candidate] = {}
  factors: dict[str, int] = {}
  for name, c in symbols.items():
    kind, other = kept[int(name[2:])]
    sizes[name] = c.value
    if kind == "times":
      divisors[name] = candidates[tp.cast(int, other)]
      sizes[name] = c.value // divisors[name].value
    elif kind == "scaled":
      factors[name] = candidates[tp.cast(int, other)].value
      sizes[name] = c.value // factors[name]
    elif kind == "multiple":
      factors[name] = tp.cast(int, other)
      sizes[name] = c.value // factors[name]
  return Symbolic(
    traced, symbols, bound, concrete, sizes, divisors, factors, tuple(candidates), dict(kept)
  )


def retraced(
  found: Symbolic, module: nn.Module, sample: Call, streams: tp.Iterable[str]
) -> Symbolic | None:
  """`found`'s trial made again at `module`, another configuration with the same integer
  settings (a flag flipped): its trace, or None where the settings differ or it fails."""
  candidates = [*input_axes(sample), *settings(module)]
  if tuple(candidates) != found.candidates or not found.plans:
    return None
  config = next(iter(found.trace.instances.values())).config if found.trace.instances else 0
  try:
    traced, symbols, bound = _trial(
      module, sample, streams, candidates, found.plans, config, user_modules(module)
    )
  except Exception:  # the flipped flag reads a setting as a number: no symbolic trace there
    return None
  return dataclasses.replace(found, trace=traced, symbols=symbols, bound=bound)


def _alternative(
  candidates: list[Candidate],
  index: int,
  kept: dict[int, Plan],
  attempt: tp.Callable[[dict[int, Plan]], tp.Any],
  settled: tp.Collection[int],
) -> tuple[dict[int, Plan], tp.Any] | None:
  """The plans that let a candidate failing with a symbol of its own be symbolic: tied to an
  equal-valued candidate (an input axis the model asserts equal to a setting), or a multiple of
  a smaller setting it divides (`qkv_features` of `num_heads`), that setting's symbol or, where
  it was found to stay concrete (`settled`), its value, or the input axes that follow it; an
  input axis, else, a multiple of its own size."""
  value = candidates[index].value
  usable = [j for j in range(len(candidates)) if j != index and kept.get(j, ("own",))[0] == "own"]
  partners = [j for j in usable if candidates[j].value == value]
  # An input axis first, then the settings already symbolic.
  partners.sort(key=lambda j: (not isinstance(candidates[j], InputAxis), j not in kept))
  for j in partners[:3]:
    plans: dict[int, Plan] = {**kept, j: ("own", None), index: ("share", j)}
    result = attempt(plans)
    if result is not None:
      return plans, result
  # Tied to an input axis that a model also divides (channels a group norm's groups divide,
  # the residual adding the input): both a multiple of their size, which meets every such
  # check the sample meets.
  for j in [j for j in partners[:3] if isinstance(candidates[j], InputAxis)][:1]:
    plans = {**kept, j: ("multiple", value), index: ("share", j)}
    result = attempt(plans)
    if result is not None:
      return plans, result
  if isinstance(candidates[index], Setting):
    divisors = [
      j
      for j in usable
      if isinstance(candidates[j], Setting)
      and 2 <= candidates[j].value < value
      and value % candidates[j].value == 0
    ]
    divisors.sort(key=lambda j: j not in kept)
    for j in divisors[:2]:
      plans = {**kept, j: ("own", None), index: ("times", j)}
      result = attempt(plans)
      if result is not None:
        return plans, result
    plan = _scaled(candidates, index, kept, attempt, settled)
    if plan is not None:
      return plan
    return _tied_axes(candidates, index, kept, attempt)
  return _own_multiple(candidates, index, kept, attempt)


def _own_multiple(
  candidates: list[Candidate],
  index: int,
  kept: dict[int, Plan],
  attempt: tp.Callable[[dict[int, Plan]], tp.Any],
) -> tuple[dict[int, Plan], tp.Any] | None:
  """A multiple of its own value, which meets every divisibility check the sample meets: an
  input width a model checks against a number it holds (`features % num_heads == 0`, the heads
  a literal), a setting a number the source writes divides (`GroupNorm(num_groups=32)` of `ch`
  channels; tried last, as it holds only at multiples of the sample's value)."""
  plans = {**kept, index: ("multiple", candidates[index].value)}
  result = attempt(plans)
  return (plans, result) if result is not None else None


def _tied_axes(
  candidates: list[Candidate],
  index: int,
  kept: dict[int, Plan],
  attempt: tp.Callable[[dict[int, Plan]], tp.Any],
) -> tuple[dict[int, Plan], tp.Any] | None:
  """A setting the input's width must follow (`x + nn.Dense(2 * self.b)(h)`): the input axes
  of a multiple of its value, kept concrete so far, as that many times its symbol (the setting
  a symbol of its own, or a multiple of its value where a number the source writes divides
  it)."""
  value = candidates[index].value
  sizes = sorted(
    {
      c.value
      for j, c in enumerate(candidates)
      if isinstance(c, InputAxis) and j not in kept and c.value > value and c.value % value == 0
    }
  )
  for size in sizes[:2]:
    axes = [
      j
      for j, c in enumerate(candidates)
      if isinstance(c, InputAxis) and c.value == size and j not in kept
    ]
    for own in (("own", None), ("multiple", value)):
      plans: dict[int, Plan] = {**kept, index: own, **dict.fromkeys(axes, ("per", index))}
      result = attempt(plans)
      if result is not None:
        return plans, result
  return None


def _scaled(
  candidates: list[Candidate],
  index: int,
  kept: dict[int, Plan],
  attempt: tp.Callable[[dict[int, Plan]], tp.Any],
  settled: tp.Collection[int],
) -> tuple[dict[int, Plan], tp.Any] | None:
  """A setting as the value of a divisor no symbol can stand for (`n_heads` in a loop's range)
  times a symbol, which passes `dim % n_heads == 0` where a lone symbol cannot (an equal one
  too: channels as many as a group norm's groups). Only a divisor found to stay concrete: the
  trace then holds the setting at multiples of it, as the model's own check does."""
  value = candidates[index].value
  if not isinstance(candidates[index], Setting):
    return None
  concrete = [
    j
    for j in settled
    if j != index
    and j not in kept
    and isinstance(candidates[j], Setting)
    and 2 <= candidates[j].value <= value
    and value % candidates[j].value == 0
  ]
  concrete.sort(key=lambda j: -candidates[j].value)
  for j in concrete[:2]:
    plans = {**kept, index: ("scaled", j)}
    result = attempt(plans)
    if result is not None:
      return plans, result
  return None
