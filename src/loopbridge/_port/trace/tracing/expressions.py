"""A width the symbolic trace gives (`symbolic.py`), written in the class's own names.

Each instance of a class holds its fields as the symbolic trace made them: `Block(self.hidden)`
gives the block's `features` the parent's `hidden` symbol. A width of the block is written in
the block's names where its symbols are the block's settings (`self.features`,
`self.layer_sizes[1]`, `self.config.mlp_dim`); where it needs a symbol the block does not hold
(the parent's `emb`, the width of the input the parent feeds it), no field of the block can say
it, and the parent passes it as an argument.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import re
import typing as tp

from flax import linen as nn

from .settings import Location, _config_attrs


def is_symbolic(value: object) -> bool:
  from jax import export

  return export.is_symbolic_dim(tp.cast(tp.Any, value))


def has_symbols(value: object) -> bool:
  if isinstance(value, (tuple, list)):
    return any(has_symbols(v) for v in value)
  return is_symbolic(value)


def _reads(value: object, at: str, depth: int, out: list[tuple[object, str]]) -> None:
  """(symbolic value, the read that gives it) of every symbol in `value` (a field's)."""
  if depth > 4:
    return
  if is_symbolic(value):
    out.append((value, at))
  elif isinstance(value, (tuple, list)):
    for i, item in enumerate(value):
      _reads(item, f"{at}[{i}]", depth + 1, out)
  elif isinstance(value, dict):
    for k, item in value.items():
      if isinstance(k, (str, int)):
        _reads(item, f"{at}[{k!r}]", depth + 1, out)
  elif (attrs := _config_attrs(value)) is not None or (attrs := _dict_keys(value)) is not None:
    # A config's own dict lists the attributes holding symbols too (which `_config_attrs`
    # leaves out where its copy of a symbol does not compare equal to the symbol).
    attrs = [*attrs, *(k for k in _dict_keys(value) or () if k not in attrs)]
    for name in attrs:
      try:
        item = getattr(value, name)
      except Exception:  # a property that fails: nothing read there
        continue
      _reads(item, f"{at}.{name}", depth + 1, out)


def _dict_keys(value: object) -> list[str] | None:
  """The settings of a config object holding symbols, which its constructor's checks refuse
  to rebuild (`n_inner == 2 * n_embd` cannot be decided): its `to_dict` keys."""
  to_dict = getattr(value, "to_dict", None)
  if isinstance(value, (type, nn.Module)) or not callable(to_dict):
    return None
  try:
    found = to_dict()
  except Exception:  # no dict of settings: nothing read there
    return None
  return [k for k in found if isinstance(k, str)] if isinstance(found, dict) else None


def reads(module: nn.Module) -> list[tuple[object, str]]:
  """The symbolic reads of a (symbolically traced) module's fields, in field order."""
  out: list[tuple[object, str]] = []
  for f in dataclasses.fields(module):
    if f.name not in ("parent", "name"):
      _reads(getattr(module, f.name, None), f"self.{f.name}", 0, out)
  return out


# jax writes these operations of symbols as calls.
_CALLS = {"floordiv": ast.FloorDiv(), "mod": ast.Mod()}


class _Named(ast.NodeTransformer):
  def __init__(self, names: tp.Mapping[str, str]):
    self.names = names
    self.missing = False

  def visit_Name(self, node: ast.Name) -> ast.AST:
    if node.id in ("max", "min", *_CALLS):  # a function jax writes, not a symbol
      return node
    if node.id not in self.names:
      self.missing = True
      return node
    return ast.parse(self.names[node.id], mode="eval").body

  def visit_Call(self, node: ast.Call) -> ast.AST:
    self.generic_visit(node)
    func = node.func
    if isinstance(func, ast.Name) and func.id in _CALLS and len(node.args) == 2:
      return ast.BinOp(node.args[0], _CALLS[func.id], node.args[1])
    if not (isinstance(func, ast.Name) and func.id in ("max", "min")):
      self.missing = True
    return node


# At most this many writings of one value: a symbol several settings hold (`in_features` and
# `out_features` both the parent's width) multiplies them.
_MAX_WRITINGS = 16


def writings(value: object, env: tp.Sequence[tuple[object, str]], depth: int = 0) -> list[str]:
  """Every way to write `value` (an int, a symbolic expression, or a tuple of them) in the
  names of `env`, the first read of each symbol first; [] when it needs a symbol `env` does
  not hold. Several where settings hold the same symbol: the caller keeps one every instance
  agrees on."""
  if isinstance(value, tuple):
    parts = [writings(v, env) for v in value]
    if any(not p for p in parts):
      return []
    out: list[str] = []
    for combo in itertools.islice(itertools.product(*parts), _MAX_WRITINGS):
      whole = _whole_field(list(combo), env)
      text = (
        whole
        if whole is not None
        else (f"({combo[0]},)" if len(combo) == 1 else f"({', '.join(combo)})")
      )
      if text not in out:
        out.append(text)
    return out
  if type(value) is int:
    return [repr(value)]
  if not is_symbolic(value):
    return []
  whole = [source for atom, source in env if _same(atom, value)]  # a read that is all of it
  if whole:
    return whole
  sources: dict[str, list[str]] = {}
  for atom, source in env:
    if str(atom).isidentifier():
      sources.setdefault(str(atom), []).append(source)
  symbols = list(sources)
  out = []
  for combo in itertools.islice(itertools.product(*sources.values()), _MAX_WRITINGS):
    named = _Named(dict(zip(symbols, combo)))
    tree = named.visit(ast.parse(str(value), mode="eval"))
    if named.missing:
      return _factored(value, env, depth)
    text = ast.unparse(tree)
    if text not in out:
      out.append(text)
  return out


def _factored(value: object, env: tp.Sequence[tuple[object, str]], depth: int) -> list[str]:
  """`self.config.hidden_size * self.config.mlp_ratio` for a value that is a read times what
  the rest of `env` writes, where a read is itself a product of symbols (a setting traced as a
  multiple of another) that the value holds but no read names alone; [] where none is."""
  if depth >= 2:
    return []
  for atom, source in env:
    if str(atom).isidentifier() or not is_symbolic(atom):
      continue
    try:
      rest = tp.cast(tp.Any, value) // atom
      if not _same(atom * rest, value):
        continue
    except Exception:  # not a multiple of this read
      continue
    found = writings(rest, env, depth + 1)
    if found:
      text = found[0] if re.fullmatch(r"[\w.\[\]'\" ]+|\d+", found[0]) else f"({found[0]})"
      return [source if text == "1" else f"{source} * {text}"]
  return []


def written(value: object, env: tp.Sequence[tuple[object, str]]) -> str | None:
  """The first of `writings`, or None when `value` needs a symbol `env` does not hold."""
  found = writings(value, env)
  return found[0] if found else None


def _same(a: object, b: object) -> bool:
  try:
    return bool(a == b)
  except Exception:  # symbols of another scope: not the same
    return False


def _whole_field(parts: list[str], env: tp.Sequence[tuple[object, str]]) -> str | None:
  """`self.features` for `(self.features[0], self.features[1])` when it has those 2 items."""
  prefix = parts[0].rsplit("[", 1)[0] if parts[0].endswith("[0]") else None
  if prefix is None or parts != [f"{prefix}[{i}]" for i in range(len(parts))]:
    return None
  items = [s[len(prefix) + 1 : -1] for _, s in env if s.startswith(prefix + "[")]
  count = sum(1 for item in items if item.isdigit())
  return prefix if count == len(parts) else None


def value_at(value: object, sample: tp.Mapping[str, int]) -> object:
  """`value` with each symbol at its sample value (an int, a tuple of them), or None."""
  if isinstance(value, tuple):
    return tuple(value_at(v, sample) for v in value)
  if type(value) is int:
    return value
  if not is_symbolic(value):
    return None
  names = {k: str(v) for k, v in sample.items()}
  named = _Named(names)
  text = ast.unparse(named.visit(ast.parse(str(value), mode="eval")))
  if named.missing:
    return None
  return eval(text, {"__builtins__": {"max": max, "min": min}})  # ints and + - * // % max min only


def location_text(location: Location) -> str:
  text = "self"
  for kind, key in location:
    text += f".{key}" if kind == "attr" else f"[{key!r}]"
  return text
