"""Linen variables that exist only once a method has made them: NNX attributes made on first use.

HF's decode cache declares `self.variable("cache", "cached_key", jnp.zeros, key.shape,
key.dtype)` inside `_concatenate_to_cache`: its shape is the call's, so `__init__` cannot build
it, and the model asks whether it exists yet (`self.has_variable("cache", "cached_key")` is
False until a call with `init_cache=True` made it). The NNX form a Flax user writes by hand keeps
both facts: the method creates the attribute when it is absent
(`if not hasattr(self, "cached_key"): self.cached_key = nnx.Cache(...)`), presence is
`hasattr`, and `self.variables["cache"]["cached_key"]` is the attribute's value. The variables
the same method declares in the same collection (HF's `cache_index`) are made the same way, so
they come into being together, as in Linen. Params are never made late: a param must exist
before the first call to be trained and converted, so a call-sized one stays a TODO.
"""

from __future__ import annotations

import typing as tp

from ..emit.literals import string_literal
from ..plan.names import available
from ..plan.source import dotted, libcst

if tp.TYPE_CHECKING:
  from ..plan.find_sites import Site


def _collection_and_name(site: Site) -> tuple[str, str] | None:
  args = site.node.args
  if len(args) < 2 or any(a.keyword is not None or a.star for a in args[:2]):
    return None
  col, name = string_literal(args[0].value), string_literal(args[1].value)
  return None if col is None or name is None else (col, name)


def declared(sites: tp.Iterable[Site]) -> set[tuple[str, str]]:
  """(collection, name) of every variable and param the class declares with literal names."""
  found: set[tuple[str, str]] = set()
  for s in sites:
    if s.kind == "variable" and (pair := _collection_and_name(s)) is not None:
      found.add(pair)
    elif s.kind == "param" and s.node.args and (name := string_literal(s.node.args[0].value)):
      found.add(("params", name))
  return found


def made_on_first_use(sites: tp.Iterable[Site], namespace: tp.Mapping[str, object]) -> set[str]:
  """The names of the variables drafted as attributes a method makes on first use: those a
  method (not setup) declares with arguments read from the call, and the variables the same
  method declares in the same collection."""
  variables: list[tuple[str, str, str]] = []
  late: set[tuple[str, str]] = set()
  for s in sites:
    pair = _collection_and_name(s) if s.kind == "variable" and s.method != "setup" else None
    if pair is None or pair[0] == "params" or not pair[1].isidentifier():
      continue
    variables.append((s.method, *pair))
    if not all(available(a.value, namespace, set()) for a in s.node.args[2:]):
      late.add((s.method, pair[0]))
  return {name for method, col, name in variables if (method, col) in late}


def creation(name: str, decl: str, unit: str) -> tp.Any:
  """The statement making the attribute when absent (libcst, indented by `unit`)."""
  c = libcst()
  code = f'if not hasattr(self, "{name}"):\n{unit}self.{name} = {decl}\n'
  return c.parse_statement(code, config=c.PartialParserConfig(default_indent=unit))


def presence(name: str) -> str:
  return f'hasattr(self, "{name}")'


def variable_reads(
  sites: tp.Iterable[Site], parents: tp.Mapping[tp.Any, tp.Any], known: set[tuple[str, str]]
) -> dict[int, tuple[tp.Any, str]]:
  """`self.variables["cache"]["cache_index"]` of a variable the class declares: id of the
  `self.variables` attribute -> (the outer subscript, the variable's name).

  Only the two-level read of one literal collection and name: any other use of Linen's
  variable dict (iterating it, reading a child's variables) stays a TODO.
  """
  c = libcst()
  found: dict[int, tuple[tp.Any, str]] = {}
  for s in sites:
    if s.kind != "self_api" or s.target != "variables" or dotted(s.node) != "self.variables":
      continue
    inner: tp.Any = parents.get(s.node)
    outer: tp.Any = parents.get(inner)
    if not (
      isinstance(inner, c.Subscript)
      and inner.value is s.node
      and isinstance(outer, c.Subscript)
      and outer.value is inner
    ):
      continue
    keys = [_single_key(inner), _single_key(outer)]
    if keys[0] is not None and keys[1] is not None and (keys[0], keys[1]) in known:
      found[id(s.node)] = (outer, keys[1])
  return found


def _single_key(subscript: tp.Any) -> str | None:
  c = libcst()
  if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, c.Index):
    return None
  return string_literal(subscript.slice[0].slice.value)
