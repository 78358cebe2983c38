"""A width as an expression of the module's fields, chosen by evidence from several configurations.

Each sample is one instance of the class (at the user's configuration or a derived one) and the
number the trace saw there. The candidates are what a person writes in `__init__`: a field
(`self.features`), a config attribute (`self.config.emb_dim`), the product or sum of two of
them, or one times a float setting (`int(self.config.hidden_size * self.config.mlp_ratio)`).
One that equals the number in every sample is the expression; simpler forms win over compound
ones. Two that both match are not chosen between: the caller keeps the literal and says so in
the report.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing as tp

from flax import linen as nn

from ..emit.literals import literal
from ..trace import config_objects
from ..transforms.factory_fields import is_root, kept_partial

Atom = tuple[str, tp.Callable[[object], object]]


@dataclasses.dataclass(frozen=True)
class Found:
  """The expression (None when none or several match) and every one that matched."""

  expr: str | None
  matches: tuple[str, ...]


def _int(v: object) -> bool:
  return type(v) is int


def _float(v: object) -> bool:
  return type(v) is float


def atoms(module: object, kind: tp.Callable[[object], bool] = _int) -> list[Atom]:
  """Field and config-attribute reads of one instance that hold an integer (or what `kind`
  accepts)."""
  out: list[Atom] = []
  if not dataclasses.is_dataclass(module):
    return out
  for f in dataclasses.fields(module):
    if f.name in ("parent", "name"):
      continue
    value = getattr(module, f.name, None)
    if kind(value):
      out.append((f"self.{f.name}", lambda m, n=f.name: getattr(m, n, None)))
    elif _items(value, kind):  # a tuple of widths: its first and last (a stack's in and out)
      out += [
        (f"self.{f.name}[{i}]", lambda m, n=f.name, i=i: _item(getattr(m, n, None), i))
        for i in (0, -1)
      ]
    elif dataclasses.is_dataclass(value) and not isinstance(value, (type, nn.Module)):
      names = [g.name for g in dataclasses.fields(value)]
      out += _config_reads(f.name, value, names, kind)
    elif (found := config_objects.settings(value)) is not None:  # HF's PretrainedConfig
      out += _config_reads(f.name, value, list(found), kind)
    elif kept_partial(value) and is_root(module):  # kept (`factory_fields`)
      out += _partial_reads(f.name, tp.cast(tp.Any, value).keywords, kind)
  return out


def _partial_reads(field: str, keywords: dict, kind: tp.Callable[[object], bool]) -> list[Atom]:
  """`self.base_cls.keywords['width']`, and the first and last item of a bound tuple (the
  input and output widths of the MLP it builds)."""
  out: list[Atom] = []
  for k, v in keywords.items():
    read = f"self.{field}.keywords[{k!r}]"
    get = lambda m, f=field, k=k: getattr(getattr(m, f, None), "keywords", {}).get(k)  # noqa: E731
    if kind(v):
      out.append((read, get))
    elif _items(v, kind):
      out += [(f"{read}[{i}]", lambda m, g=get, i=i: _item(g(m), i)) for i in (0, -1)]
  return out


def _item(value: object, i: int) -> object:
  return value[i] if isinstance(value, (tuple, list)) and value else None


def _items(value: object, kind: tp.Callable[[object], bool]) -> bool:
  """A tuple or list of what `kind` accepts (not a NamedTuple, whose items are named)."""
  return (
    isinstance(value, (tuple, list))
    and not hasattr(value, "_fields")
    and bool(value)
    and all(kind(x) for x in value)
  )


def _config_reads(
  field: str, config: object, names: tp.Sequence[str], kind: tp.Callable[[object], bool]
) -> list[Atom]:
  return [
    (f"self.{field}.{a}", lambda m, n=field, a=a: getattr(getattr(m, n, None), a, None))
    for a in names
    if kind(getattr(config, a, None))
  ]


# `4 * self.emb_dim` (an MLP's hidden width): a read times a small constant.
_MULTIPLES = range(2, 9)


def candidates(module: object) -> list[list[Atom]]:
  """Tiers of candidates, simplest first: reads, a read times a small constant, products and
  sums of two reads, then a read times a float setting, truncated (`int(hidden * mlp_ratio)`)."""
  reads = atoms(module)
  scaled: list[Atom] = [
    (f"{k} * {e}", lambda m, f=f, k=k: _op(k, f(m), "*")) for e, f in reads for k in _MULTIPLES
  ]
  pairs: list[Atom] = []
  for (ea, fa), (eb, fb) in itertools.combinations(reads, 2):
    pairs.append((f"{ea} * {eb}", lambda m, fa=fa, fb=fb: _op(fa(m), fb(m), "*")))
    pairs.append((f"{ea} + {eb}", lambda m, fa=fa, fb=fb: _op(fa(m), fb(m), "+")))
  ratios: list[Atom] = [
    (f"int({ea} * {eb})", lambda m, fa=fa, fb=fb: _ratio(fa(m), fb(m)))
    for ea, fa in reads
    for eb, fb in atoms(module, _float)
  ]
  return [reads, scaled, pairs, ratios]


def _op(a: object, b: object, op: str) -> object:
  if not (_int(a) and _int(b)):
    return None
  return a * b if op == "*" else a + b  # pyright: ignore[reportOperatorIssue]


def _ratio(a: object, b: object) -> int | None:
  if not (_int(a) and _float(b)):
    return None
  return int(tp.cast(int, a) * tp.cast(float, b))


def _scalar(samples: tp.Sequence[tuple[object, int]]) -> Found:
  first = samples[0][0]
  for tier in candidates(first):
    matched = [e for e, get in tier if all(get(m) == v for m, v in samples)]
    if len(matched) == 1:
      return Found(matched[0], tuple(matched))
    if matched:
      return Found(None, tuple(matched))
  return Found(None, ())


def explain(samples: tp.Sequence[tuple[object, object]]) -> Found:
  """The expression equal to each sample's value on its instance (an int or a tuple of ints).

  A tuple is explained element by element; an element equal in every sample stays a literal.
  """
  values = [v for _, v in samples]
  if not samples:
    return Found(None, ())
  if all(isinstance(v, bool) for v in values):
    from ..transforms.bool_settings import explain_bool

    found = explain_bool(samples)
    return Found(found, (found,) if found else ())
  if all(_int(v) for v in values):
    return _scalar(tp.cast(tp.Sequence[tuple[object, int]], samples))
  if not all(isinstance(v, tuple) for v in values):
    return Found(None, ())
  length = len(tp.cast(tuple, values[0]))
  if any(len(tp.cast(tuple, v)) != length for v in values):
    return Found(None, ())
  parts: list[str] = []
  matched: list[str] = []
  for i in range(length):
    column = [tp.cast(tuple, v)[i] for v in values]
    if all(x == column[0] and type(x) is type(column[0]) for x in column):
      text = literal(column[0])
      if text is None:
        return Found(None, tuple(matched))
      parts.append(text)
      continue
    if not all(_int(x) for x in column):
      return Found(None, tuple(matched))
    found = _scalar([(m, tp.cast(tuple, v)[i]) for m, v in samples])
    matched += found.matches
    if found.expr is None:
      return Found(None, tuple(matched))
    parts.append(found.expr)
  return Found(f"({parts[0]},)" if length == 1 else f"({', '.join(parts)})", tuple(matched))
