"""The evidence of the other configurations and of what a construction made, read by the
planner (each function a `Planner` method, bound in its class body): the submodules a
construction made in each traced configuration, a traced per-submodule value as an expression,
and the input widths of a setup layer no traced call reached."""

from __future__ import annotations

import dataclasses
import re
import typing as tp

from flax import linen as nn

from ..trace.trace import Instance, Trace
from . import passed_values, setup_local_values, stateless_layers
from .find_sites import Site
from .hoist import Hoist, match_child
from .previous_layer import OUTPUT_WIDTH, list_width

# `rewrite_class.Planner`, whose methods these are; typed loosely so this module stays below it.
Planner = tp.Any


def _made_elsewhere(self: Planner, site: Site) -> list[list[Instance]]:
  """Per instance of the class in the other configurations, what this construction made
  there (none of the user's instances made it: a branch only those take)."""
  return [
    self.made_by(site, inst, t)
    for t, parents in zip(self.ctx.alt_traces, self.resolver.alts)
    for inst in parents.values()
  ]


def alt_made(self: Planner, hoist: Hoist) -> list[Instance]:
  """What this construction made in the other configurations, in trace order."""
  return [k for made in self._made_elsewhere(hoist.site) for k in made]


def _alt_names(self: Planner, site: Site) -> set[tuple[str, ...]]:
  """The names of what this construction made in the other configurations; where none made
  it, a stateless layer's name as Linen would number it (`stateless_layers`)."""
  found = {tuple(k.path[-1] for k in made) for made in self._made_elsewhere(site) if made}
  return found or stateless_layers.untraced_names(self, site)


def traced(
  self: Planner,
  hoist: Hoist,
  get: tp.Callable[[Instance], object],
  hint: str,
  index: str | None,
  fallback: tp.Callable[[], str | None] | None = None,
) -> str:
  """The expression of a traced per-submodule value (per element of a list); `fallback`
  as `Resolver.expr` takes it (one value for the whole construction, not per element)."""
  name = f"{hoist.attr}_{hint}"
  if hoist.is_list:
    per = {p: tuple(get(k) for k in kids) for p, kids in hoist.children.items()}
    firsts = {p: t[0] for p, t in per.items() if t}
    alt_per = self.alt_lists(hoist, get)
    if all(all(v == t[0] for v in t) for d in (per, *alt_per) for t in d.values()):
      alt_firsts = [{p: t[0] for p, t in d.items() if t} for d in alt_per]
      return self.resolver.expr(firsts, name, alt_firsts)
    return list_width(self, hoist, get, name, index, per, alt_per)
  values = {p: get(k[0]) for p, k in hoist.children.items() if k}
  return self.resolver.expr(values, name, self.alt_children(hoist, get), fallback=fallback)


def setup_local_for(
  self: Planner, hoist: Hoist, get: tp.Callable[[Instance], object]
) -> str | None:
  """A width no field explains, as what `__init__` has where the layer is built, equal to
  `get` of what it made in every traced instance of every configuration, else None: the one
  local bound before it in setup, or in the compact method when the method's locals move
  (`setup_local_values`: GPT-2's `inner = n_inner if n_inner is not None else 4 * hidden`);
  else the one earlier layer whose output width it is (`self.Dense_0.out_features`, the input
  width of the layer its output feeds, whatever computed that width)."""
  if hoist.is_list:
    return None
  samples = _samples(self, hoist, get)
  if samples is None:
    return None
  statements = setup_local_values.setup_statements(
    self.src.text, hoist.site.lines[0], hoist.site.method
  )
  local = setup_local_values.matching_local(statements, self.src.namespace, samples)
  return local if local is not None else _earlier_output(self, hoist, samples)


def _samples(
  self: Planner, hoist: Hoist, get: tp.Callable[[Instance], object]
) -> list[tuple[object, object]] | None:
  """(parent module, `get` of what the construction made there) in every configuration."""
  samples: list[tuple[object, object]] = []
  try:
    for p, kids in hoist.children.items():
      if kids:
        samples.append((self.trace.instances[p].module, get(kids[0])))
    for found, parents in zip(self.alt_children(hoist, get), self.resolver.alts):
      samples += [(parents[p].module, v) for p, v in found.items() if p in parents]
  except Exception:  # a width this layer's trace does not give: no evidence
    return None
  return samples


def _last_samples(
  self: Planner, hoist: Hoist, get: tp.Callable[[Instance], object]
) -> list[tuple[object, object]] | None:
  """(parent module, `get` of the last layer of the list) in every configuration, in the
  order `_samples` gives them."""
  samples: list[tuple[object, object]] = []
  try:
    for p, kids in hoist.children.items():
      if kids:
        samples.append((self.trace.instances[p].module, get(kids[-1])))
    for found, parents in zip(self.alt_lists(hoist, get), self.resolver.alts):
      samples += [(parents[p].module, v[-1]) for p, v in found.items() if p in parents and v]
  except Exception:  # a width this layer's trace does not give: no evidence
    return None
  return samples


def _earlier_output(self: Planner, hoist: Hoist, mine: list[tuple[object, object]]) -> str | None:
  """`self.<attr>.out_features` of the one layer built earlier in the same method whose
  output width equals the width in every sample of `mine` (`_samples`), or
  `self.<attr>[-1].out_features` of the last layer of an earlier loop's list (the layer after
  an MLP's loop, whatever its length), else None."""
  if not mine:
    return None
  found: list[str] = []
  for other in self.hoists.values():
    out = OUTPUT_WIDTH.get(tp.cast(type, other.site.target))
    if (
      out is None
      or other is hoist
      or other.counter
      or other.site.method != hoist.site.method
      or other.site.lines[0] >= hoist.site.lines[0]
    ):
      continue
    linen_field, nnx_attr = out
    width = lambda k, f=linen_field: getattr(k.module, f, None)  # noqa: E731
    theirs = _last_samples(self, other, width) if other.is_list else _samples(self, other, width)
    if (
      theirs is not None
      and len(theirs) == len(mine)
      and all(
        pa is pb and setup_local_values.same_width(a, b) for (pa, a), (pb, b) in zip(theirs, mine)
      )
    ):
      found.append(f"self.{other.attr}{'[-1]' if other.is_list else ''}.{nnx_attr}")
  return found[0] if len(found) == 1 else None


def passed_widths(
  self: Planner, hoist: Hoist, widths: tp.Callable[[Instance], dict[str, object]]
) -> dict[str, str]:
  """The input widths of a setup layer no traced call reached, as expressions, from a value
  a trace saw that the source proves it would be given (`passed_values`); {} unproven."""
  attr = hoist.site.setup_attr
  found = None if attr is None or hoist.is_list else passed_values.origin(self.src.text, attr)
  if attr is None or found is None:
    return {}

  def at(parent: Instance, trace: Trace) -> dict[str, object]:
    value = passed_values.value_given(found, parent, trace)
    # Setup built it there (not called: no trace), or the branch that builds it did not run
    # at this configuration: the value is still what it would be given, and a width that
    # reads the layer's own settings then has none to read.
    child = parent.module.__dict__.get(attr)
    if value is None:
      return {}
    if not isinstance(child, nn.Module):
      child = passed_values.NO_SETTINGS
    stand_in = dataclasses.replace(
      parent,
      path=(*parent.path, attr),
      cls=hoist.site.target,
      module=child,
      variables={},
      inputs={"__call__": ((value,), {})},
      called_at=None,
      lifts=(),
    )
    try:
      return {k: v for k, v in widths(stand_in).items() if v is not None}
    except Exception:  # a shape the layer's widths cannot read: no evidence
      return {}

  here = {p: at(self.trace.instances[p], self.trace) for p in hoist.children}
  there = [
    {p: at(i, t) for p, i in parents.items()}
    for t, parents in zip(self.ctx.alt_traces, self.resolver.alts)
  ]
  names = {n for d in (here, *there) for w in d.values() for n in w}
  out: dict[str, str] = {}
  for name in sorted(names):
    values = {p: w[name] for p, w in here.items() if name in w}
    alt_values = [{p: w[name] for p, w in d.items() if name in w} for d in there]
    out[name] = self.resolver.expr(values, f"{attr}_{name}", alt_values)
  return out


def _made_by_line(self: Planner, hoist: Hoist) -> bool:
  """Whether the trace saw each of the user's submodules of this construction called from its
  own lines (`match_child`): then so are another configuration's, whatever their numbers
  (a loop of another length numbers the layer after it on: `Dense_3`, not `Dense_2`)."""
  kids = [k for ks in hoist.children.values() for k in ks]
  return (
    bool(kids)
    and hoist.site.setup_attr is None
    and all(match_child(hoist.site, self.src, k) for k in kids)
    and all(k.path[:-1] == p for p, ks in hoist.children.items() for k in ks)
  )


def alt_children(
  self: Planner, hoist: Hoist, get: tp.Callable[[Instance], object]
) -> list[dict[tuple[str, ...], object]]:
  """`get` of the (first) submodule at the same path in each derived configuration."""
  out: list[dict[tuple[str, ...], object]] = []
  # Every instance of the class there (a derived configuration may have more of them),
  # with the submodule of the same name.
  # (Its path under the parent: a layer of an nn.Sequential sits one level further down.)
  rel = next((kids[0].path[len(p) :] for p, kids in hoist.children.items() if kids), None)
  by_line = _made_by_line(self, hoist)
  for t, parents in zip(self.ctx.alt_traces, self.resolver.alts):
    found: dict[tuple[str, ...], object] = {}
    for p in parents:
      if rel is not None and not by_line:
        kid = t.instances.get((*p, *rel))
      else:  # no instance of the user's made it (a branch), or paired by line: as here
        made = self.made_by(hoist.site, parents[p], t)
        kid = made[0] if made else None
      if kid is None:
        continue
      try:
        found[p] = get(kid)
      except Exception:  # a derived configuration is evidence, not a must
        continue
    out.append(found)
  return out


def alt_lists(
  self: Planner, hoist: Hoist, get: tp.Callable[[Instance], object]
) -> list[dict[tuple[str, ...], tuple[object, ...]]]:
  """`get` of each layer of the list in each derived configuration (`Dense_0, Dense_1, ...`
  under the same parent; a derived configuration may make more of them)."""
  out: list[dict[tuple[str, ...], tuple[object, ...]]] = []
  first = next((kids[0].path[-1] for kids in hoist.children.values() if kids), "")
  # `Dense_0, Dense_1, ...` as Linen numbers them, or `0, 1, ...` (HF's `name=str(i)`).
  m = re.fullmatch(r"(?:(.+)_)?(\d+)", first)

  def named(n: int) -> str:
    assert m is not None
    return str(n) if m.group(1) is None else f"{m.group(1)}_{n}"

  # Another construction numbered on after this one (a second loop of ResBlocks): the run
  # keeps the user's length, which then no field decides.
  cap = None
  for p, kids in hoist.children.items():
    last = re.fullmatch(r"(?:.+_)?(\d+)", kids[-1].path[-1]) if kids else None
    after = None if m is None or last is None else named(int(last.group(1)) + 1)
    if after is not None and (*p, after) in self.trace.instances:
      cap = len(kids)
  by_line = _made_by_line(self, hoist)
  for t, parents in zip(self.ctx.alt_traces, self.resolver.alts):
    found: dict[tuple[str, ...], tuple[object, ...]] = {}
    for p in parents if m is not None else ():
      assert m is not None
      n = int(m.group(2))
      if by_line:
        layers = self.made_by(hoist.site, parents[p], t)
      else:
        layers = []
        while (*p, named(n)) in t.instances and (cap is None or len(layers) < cap):
          layers.append(t.instances[(*p, named(n))])
          n += 1
      try:
        found[p] = tuple(get(k) for k in layers)
      except Exception:  # a derived configuration is evidence, not a must
        continue
    out.append(found)
  return out


def alt_own(
  self: Planner, get: tp.Callable[[Instance], object]
) -> list[dict[tuple[str, ...], object]]:
  """`get` of the class's own instances in each derived configuration, by path."""
  out: list[dict[tuple[str, ...], object]] = []
  for alts in self.resolver.alts:
    found: dict[tuple[str, ...], object] = {}
    for p, inst in alts.items():
      try:
        found[p] = get(inst)
      except Exception:  # a derived configuration is evidence, not a must
        continue
    out.append(found)
  return out
