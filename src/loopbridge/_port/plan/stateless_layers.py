"""A flax layer without variables (`nn.Dropout`) under a branch no trace took.

A layer with variables needs a trace to say its widths; one without needs nothing but its
arguments, which the source gives. jaxrl's MLP builds `nn.Dropout(rate=self.dropout_rate)`
only `if self.dropout_rate is not None`, and a critic that builds the MLP never sets the rate:
no configuration of the critic takes the branch. Such a layer is named as Linen would number
it past the ones the traces saw (`Dropout_0`), and built in `__init__` under the source's own
tests; where `__init__` cannot evaluate them the construction stays a TODO.
"""

from __future__ import annotations

import typing as tp

from flax import linen as nn

from .find_sites import Site

# The flax layers that make no variables.
STATELESS: tuple[type, ...] = (nn.Dropout,)

# `rewrite_class.Planner`, typed loosely so this module stays below it.
Planner = tp.Any


def untraced_names(planner: Planner, site: Site) -> set[tuple[str, ...]]:
  """`{("Dropout_k",)}`: the name of a stateless layer no trace built, its number past every
  one the traces (of every configuration) saw under this class and every one named so far;
  empty where the site is no such layer or sits under no test `__init__` can evaluate."""
  if site.target not in STATELESS or not site.guards:
    return set()
  if site.loop is None and planner.written_guard(site.guards, site.method) is None:
    return set()
  prefix = tp.cast(type, site.target).__name__
  taken = {h.attr for h in planner.hoists.values()}
  traces = [planner.trace, *planner.ctx.alt_traces]
  for t in traces:
    for inst in planner.instances:
      taken |= {k.path[-1] for k in t.children(inst.path)}
  n = 0
  while f"{prefix}_{n}" in taken:
    n += 1
  return {(f"{prefix}_{n}",)}
