"""Decode caches as NNX writes them: an `init_cache(input_shape, dtype)` method, not `__init__`.

Linen sizes a decode cache by the input its `init` was given (decoding code inits on the full
length, then feeds one token per call). A port that builds the cache in `__init__` bakes the
sample's size: the one-token cache trap. `nnx.MultiHeadAttention` has `init_cache` for this;
each drafted class holding a decode attention (or a module or list of modules that does) gets
one that sizes them all for inputs of `input_shape = (batch, max_length)`.
"""

from __future__ import annotations

import typing as tp

from flax import linen as nn
from flax import nnx
from flax.traverse_util import flatten_dict

from ..plan.source import libcst

# One line: a formatter re-indents a docstring's continuation lines.
_DOC = '"""Size the decode caches for inputs of `input_shape` = (batch, max_length)."""'


def method(entries: tp.Sequence[tuple[str, str]], unit: str) -> str:
  """The source of the `init_cache` method over `entries` (attribute, kind)."""
  lines = ['def init_cache(self, input_shape: tuple[int, ...], dtype="float32"):']
  lines.append(f"{unit}{_DOC}")
  for attr, kind in entries:
    if kind == "attention":
      lines.append(
        f"{unit}self.{attr}.init_cache((*input_shape, self.{attr}.in_features), dtype=dtype)"
      )
    elif kind == "module":
      lines.append(f"{unit}self.{attr}.init_cache(input_shape, dtype=dtype)")
    else:
      lines.append(f"{unit}for layer in self.{attr}:")
      lines.append(f"{unit}{unit}layer.init_cache(input_shape, dtype=dtype)")
  return "\n".join(lines) + "\n"


def add_method(code: str, entries: tp.Sequence[tuple[str, str]]) -> str:
  """`code` (one class) with the `init_cache` method appended to its body."""
  c = libcst()
  module = c.parse_module(code)
  unit = module.default_indent
  fn = c.parse_statement(method(entries, unit), config=c.PartialParserConfig(default_indent=unit))
  fn = fn.with_changes(leading_lines=[c.EmptyLine()])
  body: list[tp.Any] = list(module.body)
  for i, stmt in enumerate(body):
    if isinstance(stmt, c.ClassDef):
      inner = [*stmt.body.body, fn]
      body[i] = stmt.with_changes(body=stmt.body.with_changes(body=inner))
  return module.with_changes(body=body).code


def size_caches(
  port: nnx.Module, variables: tp.Mapping[str, object] | None, sample: tp.Any
) -> None:
  """Call the port's `init_cache` for the Linen cache it is to hold: the user's (inited on the
  full length), else the one the sample call's init makes."""
  init_cache = getattr(port, "init_cache", None)
  if init_cache is None:
    return
  cache = (variables or {}).get("cache")
  if not cache:
    import jax

    from ..trace.trace import rng_streams

    module, call = sample
    made = jax.eval_shape(
      lambda: nn.Module.init(module, rng_streams(()), *call.args, method=call.method, **call.kwargs)
    )
    cache = made.get("cache", {})
  keys = [v for k, v in flatten_dict(dict(cache)).items() if k[-1] == "cached_key"]  # pyright: ignore[reportArgumentType, reportCallIssue]
  if keys:
    key = tp.cast(tp.Any, keys[0])
    init_cache(tuple(key.shape)[:-2], dtype=key.dtype)


def cache_shapes(
  variables: tp.Mapping[str, object] | None,
) -> dict[tuple[str, ...], dict[str, tuple[int, ...]]]:
  """Module path -> {name: shape} of the `cache` collection of the user's variables."""
  cache = (variables or {}).get("cache")
  found: dict[tuple[str, ...], dict[str, tuple[int, ...]]] = {}
  if isinstance(cache, tp.Mapping):
    for path, value in flatten_dict(dict(cache)).items():
      found.setdefault(tuple(path[:-1]), {})[path[-1]] = tuple(getattr(value, "shape", ()))
  return found
