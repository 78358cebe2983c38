"""Configurations that take the branches the user's does not: the evidence for classes that only
a setting the sample leaves off builds.

HF's BEiT builds `FlaxBeitRelativePositionBias` only `if config.use_relative_position_bias`,
Dinov2 its SwiGLU MLP only `if config.use_swiglu_ffn`, Wav2Vec2 its layer-norm feature
extractor only `if config.feat_extract_norm == "layer"`. At the user's configuration no trace
sees those classes, so nothing gives their input widths, and the class that builds them would
keep a TODO. Here, a class the traced classes' sources name but no trace saw is *missing*; the
settings those sources read are changed one at a time (a boolean flipped, a string set to a
literal the source compares it with) and each configuration whose trace sees a missing class
is kept. A draft that still leaves work (a TODO, a construction no trace made) looks again,
keeping each change whose trace makes a submodule or a variable no trace made (big_vision's
`pool_type="map"` head, a `cls` token only `pool_type="tok"` makes). Each kept change is traced
again at every scaled configuration (`configs.py`), so the new classes' widths have the same
evidence as every other class's; the check runs the port at the change's first scaled
configuration (`class_check.py`): a branch is translated *and* checked.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

from flax import linen as nn

from ..errors import PortError
from ..plan.source import ClassSource
from ..plan.standard_layers import is_linen_layer
from ..records import Call
from . import config_objects
from .configs import changed
from .trace import Trace, trace

# At most this many changed settings are traced (each is one abstract init of the model), and
# at most this many kept (each is traced at every scaled configuration and checked once).
MAX_TRIES = 8
MAX_KEPT = 4

Knob = tuple[str, str | None]  # (field, config attribute or None)


def missing_classes(sources: tp.Iterable[ClassSource], traced: tp.Collection[type]) -> set[type]:
  """User-written Linen classes the sources name (a global of their module) but no trace saw
  (a base class of a traced one is no construction: its subclass was traced)."""
  found: set[type] = set()
  bases = {b for cls in traced for b in cls.__mro__[1:]}
  for src in sources:
    for word in set(re.findall(r"\b[A-Za-z_]\w*\b", src.text)):
      value = src.namespace.get(word)
      if (
        isinstance(value, type)
        and issubclass(value, nn.Module)
        and not is_linen_layer(value)
        and value not in traced
        and value not in bases
      ):
        found.add(value)
  return found


def _settings(value: object) -> dict[str, object]:
  if dataclasses.is_dataclass(value) and not isinstance(value, (type, nn.Module)):
    return {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
  return config_objects.settings(value) or {}


def _compared(text: str, name: str) -> list[str]:
  """The string literals `text` compares setting `name` with (`.name == "layer"`)."""
  pattern = rf"\.{re.escape(name)}\s*(?:==|!=)\s*([\"'])([^\"'\n]*)\1"
  found = [m.group(2) for m in re.finditer(pattern, text)]
  pattern = rf"\.{re.escape(name)}\s+(?:not\s+)?in\s*[(\[{{]([^)\]}}\n]*)"
  for m in re.finditer(pattern, text):
    found += [s for _, s in re.findall(r"([\"'])([^\"'\n]*)\1", m.group(1))]
  return list(dict.fromkeys(found))


def _optional_int(f: dataclasses.Field) -> bool:
  """A field annotated `Optional[int]` / `int | None` (a string under postponed annotations),
  or `int` with a None default (vqgan-jax's `out_channels: int = None`)."""
  words = set(re.findall(r"\w+", str(f.type)))
  optional = "Optional" in words or "None" in words or f.default is None
  return "int" in words and optional and "float" not in words


def _optional_float(f: dataclasses.Field) -> bool:
  """A field annotated `Optional[float]` / `float | None` (a rate: `dropout_rate`)."""
  words = set(re.findall(r"\w+", str(f.type)))
  return "float" in words and ("Optional" in words or "None" in words) and "int" not in words


# The value an optional float left None is set to: a rate below 1, as a dropout's.
_SET_FLOAT = 0.5


def _tested_unset(text: str, name: str, owner: str = r"self") -> bool:
  """The sources test `<owner>.<name>` for being set: `if self.n:`, `self.n is not None`,
  `self.n or 4 * d` (a default where it is unset), `a if self.n else b`."""
  attr = rf"{owner}\.{re.escape(name)}\b"
  return bool(
    re.search(rf"\b(?:if|and|or|not)\s+{attr}\s*(?::|and\b|or\b|else\b|\))", text)
    or re.search(rf"{attr}\s+is\s+(?:not\s+)?None", text)
    or re.search(rf"{attr}\s+or\b", text)
  )


def _fresh(module: nn.Module) -> int:
  """A width no integer field of `module` has (an optional width set where it was None)."""
  ints = [getattr(module, f.name, None) for f in dataclasses.fields(module)]
  return 1 + max([v for v in ints if type(v) is int] + [2])


def changes(module: nn.Module, text: str) -> list[dict[Knob, object]]:
  """One change of one setting per entry: each boolean the sources read (`text`) flipped, each
  string set to each other literal they compare it with, each optional width left None (that
  they test for being set, maskgit's `if self.hidden_size:`) set to a width no field has, each
  optional float left None that they test so (a dropout rate) set to 0.5."""
  out: list[dict[Knob, object]] = []
  fresh = _fresh(module)
  for f in dataclasses.fields(module):
    if f.name in ("parent", "name"):
      continue
    value = getattr(module, f.name, None)
    if value is None and _optional_int(f) and _tested_unset(text, f.name):
      out.append({(f.name, None): fresh})
      continue
    if value is None and _optional_float(f) and _tested_unset(text, f.name):
      out.append({(f.name, None): _SET_FLOAT})  # jaxrl's `if self.dropout_rate is not None:`
      continue
    inner = [(f.name, None, value)] + [(f.name, a, v) for a, v in _settings(value).items()]
    for field, attr, v in inner:
      name = attr or field
      if not re.search(rf"\b{re.escape(name)}\b", text):
        continue
      if type(v) is bool:
        out.append({(field, attr): not v})
      elif isinstance(v, str):
        for s in _compared(text, name):
          if s != v:
            out.append({(field, attr): s})
  return out


def optional_changes(module: nn.Module, text: str) -> list[dict[Knob, object]]:
  """One change per optional width the sources test for being set (`self.mlp_dim or 4 * d`,
  `config.n_inner if config.n_inner is not None else 4 * hidden`): set in the sample, left
  None; None in the sample, set to a width no field has. The two are different computations,
  and a draft written from one is wrong at the other unless a check there says otherwise."""
  out: list[dict[Knob, object]] = []
  fresh = _fresh(module)
  for f in dataclasses.fields(module):
    if f.name in ("parent", "name"):
      continue
    value = getattr(module, f.name, None)
    if _optional_int(f) and _tested_unset(text, f.name):
      out.append({(f.name, None): None if type(value) is int else fresh})
      continue
    inner = _settings(value) if not isinstance(value, (int, type(None))) else {}
    for attr, v in inner.items():
      if not _tested_unset(text, attr, r"\w+"):
        continue
      if v is None:
        out.append({(f.name, attr): fresh})
      elif type(v) is int:
        out.append({(f.name, attr): None})
  return out


def optional_configs(
  module: nn.Module,
  sources: tp.Mapping[type, ClassSource],
  traced: Trace,
  sample: Call,
  streams: tp.Iterable[str],
  first_index: int,
  scaled: tp.Callable[[nn.Module], list[nn.Module]],
) -> list[tuple[nn.Module, Trace, str]]:
  """Each configuration with an optional width flipped (`optional_changes`), or a flag or a
  compared string changed (`changes`), whose trace makes variables the sample's makes too,
  some of another shape (score_sde's `bias=False` embeds two widths, not three; one that makes
  only other variables is `branch_configs`'): (module, trace, what changed), at the user's
  numbers and at each scaled one, as `branch_configs` returns them.
  Its widths are evidence, and the check runs the port there, so a width written from the
  sample's side of a test is never `ok` unless it holds on the other side too."""
  text = "\n".join(s.text for s in sources.values())
  shapes = _shapes(traced)
  out: list[tuple[nn.Module, Trace, str]] = []
  tried: list[dict[Knob, object]] = []
  kept = 0
  for change in [*optional_changes(module, text), *changes(module, text)]:
    if change in tried or len(tried) >= MAX_TRIES or kept >= MAX_KEPT:
      continue
    tried.append(change)
    try:
      other = changed(module, change)
      got = trace(other, [(sample.method, sample.args, dict(sample.kwargs))], streams, 0)
    except Exception:  # a setting the model refuses: no evidence
      continue
    found = _shapes(got)
    common = found.keys() & shapes.keys()
    if not common or all(found[k] == shapes[k] for k in common):
      continue  # the same widths, or only other variables: `branch_configs`' to find
    kept += 1
    what = ", ".join(_describe(k, v) for k, v in change.items())
    out += variants(other, got, what, sample, streams, first_index + len(out), scaled)
  return out


def variants(
  other: nn.Module,
  got: Trace,
  what: str,
  sample: Call,
  streams: tp.Iterable[str],
  first_index: int,
  scaled: tp.Callable[[nn.Module], list[nn.Module]],
) -> list[tuple[nn.Module, Trace, str]]:
  """A kept change and its scaled variants, each traced and numbered as a configuration."""
  out: list[tuple[nn.Module, Trace, str]] = []
  variants = [(other, what)] + [
    (v, f"{what}, scaled" if n == 0 else f"{what}, scaled ({n + 1})")
    for n, v in enumerate(scaled(other))
  ]
  for variant, label in variants:
    index = first_index + len(out)
    try:
      traced = (
        got
        if variant is other
        else trace(variant, [(sample.method, sample.args, dict(sample.kwargs))], streams, index)
      )
    except Exception:  # the scaled variant may not build: the unscaled one still counts
      continue
    for inst in traced.instances.values():
      inst.config = index
    out.append((variant, traced, label))
  return out


def each_change(
  module: nn.Module,
  changes: tp.Sequence[tp.Mapping[tp.Any, object]],
  describe: tp.Callable[[tp.Mapping[tp.Any, object]], str],
  sample: Call,
  streams: tp.Iterable[str],
  first_index: int,
  scaled: tp.Callable[[nn.Module], list[nn.Module]],
  max_kept: int,
) -> list[tuple[nn.Module, Trace, str]]:
  """`variants` of each change (settings by location) Linen runs, at most `max_kept` of them,
  each at its first scaled configuration too; the first change is all of them at once, and
  where it runs the rest (each alone) add nothing."""
  from .tracing.settings import with_values

  out: list[tuple[nn.Module, Trace, str]] = []
  kept = 0
  call = [(sample.method, sample.args, dict(sample.kwargs))]
  first_scaled = lambda m: scaled(m)[:1]  # noqa: E731
  for n, change in enumerate(changes):
    if kept >= max_kept:
      break
    try:
      other = with_values(module, change, strict=True)
      got = trace(other, call, streams, 0)
    except Exception:  # a change Linen refuses (tied to another setting): no evidence
      continue
    kept += 1
    what = describe(change)
    out += variants(other, got, what, sample, streams, first_index + len(out), first_scaled)
    if n == 0:
      break  # all at once ran: each alone adds nothing
  return out


def _shapes(traced: Trace) -> dict[tuple[object, ...], object]:
  """Every variable's shape, by (path, collection, name)."""
  return {
    (path, col, name): tuple(getattr(v, "shape", ()))
    for path, inst in traced.instances.items()
    for (col, name), v in inst.variables.items()
  }


def branch_configs(
  module: nn.Module,
  sources: tp.Mapping[type, ClassSource],
  traces: tp.Sequence[Trace],
  sample: Call,
  streams: tp.Iterable[str],
  first_index: int,
  scaled: tp.Callable[[nn.Module], list[nn.Module]],
  read: tp.Callable[[type], ClassSource],
  mode: tp.Literal["classes", "paths"] = "classes",
) -> list[tuple[nn.Module, Trace, str]]:
  """Each configuration that traces a class missing from `traces`: (module, trace, what changed),
  at the user's numbers, then at each scaled one (`scaled`: the derived configurations of a
  module, so that the new classes' widths have the evidence the others have).

  `sources` grows with the classes found (`read` gives their source), so that a class one
  branch finds can name the next missing one.
  """
  seen = {i.cls for t in traces for i in t.instances.values()}
  missing = missing_classes(sources.values(), seen)
  made = set().union(*(_made(t) for t in traces))
  text = "\n".join(s.text for s in sources.values())
  out: list[tuple[nn.Module, Trace, str]] = []
  tried = kept = 0
  for change in changes(module, text):
    if tried >= MAX_TRIES or kept >= MAX_KEPT or (mode == "classes" and not missing):
      break
    tried += 1
    try:
      other = changed(module, change)
      got = trace(other, [(sample.method, sample.args, dict(sample.kwargs))], streams, 0)
    except Exception:  # a setting the model refuses (a PortError from the trace): no evidence
      continue
    new = {i.cls for i in got.instances.values()} - seen
    if not (new & missing if mode == "classes" else _made(got) - made):
      continue
    kept += 1
    made |= _made(got)
    what = ", ".join(_describe(k, v) for k, v in change.items())
    for cls in new:
      if not is_linen_layer(cls) and cls not in sources:
        try:
          sources = {**sources, cls: read(cls)}
        except PortError:
          continue
    seen |= new
    missing = missing_classes(sources.values(), seen)
    out += variants(other, got, what, sample, streams, first_index + len(out), scaled)
  return out


def _made(traced: Trace) -> set[tuple[object, ...]]:
  """Every submodule (path) and variable (path, collection, name) a trace saw."""
  out: set[tuple[object, ...]] = set()
  for path, inst in traced.instances.items():
    out.add(path)
    out.update((path, col, name) for col, name in inst.variables)
  return out


def _describe(knob: Knob, value: object) -> str:
  field, attr = knob
  return f"{field}.{attr}={value!r}" if attr else f"{field}={value!r}"
