"""A bool the port needs (whether a layer is built) told by a bool setting: a field, or an
attribute of a config field (HF's `self.config.tie_word_embeddings`), or its negation.

Found only where the traced configurations disagree (a constant value says nothing of which
setting it follows) and exactly one setting follows it in all of them.

Hooks: `width_exprs.explain` (values of bool) and `tied_embeddings` (layers built only where
called).
"""

from __future__ import annotations

import dataclasses
import typing as tp

from flax import linen as nn


def explain_bool(samples: tp.Sequence[tuple[object, object]]) -> str | None:
  """The expression on `self` equal to each sample's bool on its module (None: none, several,
  or the values never differ)."""
  if len({v for _, v in samples}) != 2:
    return None
  found: list[str] = []
  for expr in bool_settings(samples[0][0]):
    values = [read(module, expr) for module, _ in samples]
    if all(v is want for v, (_, want) in zip(values, samples)):
      found.append(expr)
    elif all(isinstance(v, bool) and v is not want for v, (_, want) in zip(values, samples)):
      found.append(f"not {expr}")
  return found[0] if len(found) == 1 else None


def bool_settings(module: object) -> list[str]:
  """`self.<field>` and `self.<field>.<attr>` (a config object's) holding a bool."""
  if not dataclasses.is_dataclass(module):
    return []
  out: list[str] = []
  for f in dataclasses.fields(module):
    if f.name in ("parent", "name"):
      continue
    value = getattr(module, f.name, None)
    if isinstance(value, bool):
      out.append(f"self.{f.name}")
    elif hasattr(value, "__dict__") and not isinstance(value, (nn.Module, type)):
      out.extend(
        f"self.{f.name}.{k}"
        for k, v in sorted(vars(value).items())
        if isinstance(v, bool) and k.isidentifier() and not k.startswith("_")
      )
  return out


def read(module: object, expr: str) -> object:
  """The value of `self.a.b` on `module`."""
  value: object = module
  for part in expr.split(".")[1:]:
    value = getattr(value, part, None)
  return value
