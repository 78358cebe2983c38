"""Constructions built inside the line that calls them, as the planner pairs them (each function a
`Planner` method, bound in its class body): a list comprehension that builds and calls a
layer, and several constructions called on one line."""

from __future__ import annotations

import typing as tp

from ..trace.trace import Instance
from .find_sites import Site
from .names import available, names_in
from .source import libcst

# `rewrite_class.Planner`, whose methods these are; typed loosely so this module stays below it.
Planner = tp.Any


def _inline_comp_todo(self: Planner, site: Site) -> str | None:
  """Why a list comprehension that builds and calls a layer (`[nn.Dense(w)(x) for w in
  self.widths]`) is not drafted, or None: `__init__` builds the same list."""
  c = libcst()
  comp: tp.Any = site.comp
  for_in = comp.for_in
  if site.loop is not None or site.conditional:
    return "a list comprehension of layers inside a loop or under an `if`"
  if for_in.inner_for_in is not None or for_in.ifs or for_in.asynchronous:
    return "a list comprehension of layers with several `for`s or an `if`"
  if any(
    s is not site and s.kind == "construct" and s.target is site.target and s.lines == site.lines
    for s in self.sites
  ):
    return "a list comprehension of layers with another layer of its class on its lines"
  aliases = self.aliases.get(site.method, {})
  if not available(for_in.iter, self.init_namespace, set(aliases)):
    return "a list comprehension of layers over something the call gives"
  if not isinstance(for_in.target, (c.Name, c.Tuple)):
    return "a list comprehension of layers with an unusual target"
  self.used_aliases.update(n for n in names_in(for_in.iter) if n in aliases)
  return None


def _one_of_a_line(self: Planner, site: Site, made: list[Instance]) -> list[Instance]:
  """`nn.Dense(4)(nn.silu(nn.Dense(4)(x)))`: both constructions match the submodules the
  line called; each is the one called at its place in the order the calls finish (the
  inner first, then left to right), which is the trace's order."""
  peers = [
    s
    for s in self.sites
    if s.kind == "construct"
    and s.lines == site.lines
    and s.target is site.target
    and s.loop is None
    and s.outer_call is not None
    and s.local is None
    and s.lift is None
  ]
  if len(peers) < 2 or site not in peers or len(made) != len(peers):
    return made
  peers.sort(
    key=lambda s: (self.positions[s.outer_call].end.line, self.positions[s.outer_call].end.column)
  )
  return [made[peers.index(site)]]


def comprehension_targets(self: Planner, site: Site) -> set[str]:
  node = site.comp
  return set() if node is None else names_in(node.for_in.target)
