"""A discovery's findings as declaration parts: one per bridged node, per bridged copy inside an
NNX transform, and per module with native sows; and the index of a graph's nodes by path."""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
from flax import nnx

from .. import _compat
from . import declare, discovery_session, linen_vars, observe_native, recorder, site_probe
from .bridge_settings import bridge_settings, is_bridge
from .call_target import model_name
from .errors import NotDeclaredError
from .site import SowSite

# Where a part sits in the graph (path from the root) and what it reported; None: a copy.
Items = list[tuple[tuple | None, discovery_session.BridgeReport]]


def _merge_reports(items: Items) -> Items:
  """One report per bridged node: a node called k times per call sows k times per site."""
  merged: dict[tuple, discovery_session.BridgeReport] = {}
  for path, r in items:
    # A node called with two signatures in one call declares both (a prompt, then a step).
    key = (path, r.signature) if path is not None else ("<transient>", id(r))
    into = merged.get(key)
    if into is None:
      merged[key] = dataclasses.replace(
        r, sites=list(r.sites), dropped=list(r.dropped), new_accumulators=dict(r.new_accumulators)
      )
      continue
    by_key = {s.key: i for i, s in enumerate(into.sites)}
    for s in r.sites:
      if s.key not in by_key:
        into.sites.append(s)
        continue
      old = into.sites[by_key[s.key]]
      if (old.shape, old.dtype) != (s.shape, s.dtype):
        raise NotDeclaredError(
          f"sow site {'/'.join(s.key)} of lb.ToNNX({r.label}) receives {old.shape} "
          f"{old.dtype} in one call and {s.shape} {s.dtype} in another, within one call of "
          "the model. Why: one buffer holds one value shape. Fix: sow the two under "
          "different names, or declare and run the two call signatures separately."
        )
      into.sites[by_key[s.key]] = dataclasses.replace(old, per_call=old.per_call + s.per_call)
    into.dropped.extend(d for d in r.dropped if d not in into.dropped)
    into.new_accumulators.update(r.new_accumulators)
  return [(None if k[:1] == ("<transient>",) else k[0], r) for k, r in merged.items()]


def _bridge_parts(
  items: Items,
  node_at: dict[tuple, nnx.Module],
  what: str,
  transient_ok: bool = False,
) -> list[declare.Part]:
  """Declaration parts of the bridged nodes a call reached; `items` are (path or None, report).

  Path-less reports (copies inside NNX transforms) are left to `_transformed_parts` when
  `transient_ok` (lazy_init, where probes locate them).
  """
  parts = []
  for path, report in _merge_reports(items):
    if path is None:
      if transient_ok or (not report.sites and not report.new_accumulators):
        continue  # a part that sows nothing needs no buffers, wherever it runs
      raise TypeError(
        f"{what} found lb.ToNNX({report.label}) called inside an NNX transform (nnx.vmap, "
        "nnx.scan, ...) of the model, where it cannot tell which submodule it is. Fix: call "
        "lb.preallocate on that lb.ToNNX directly with the arguments it receives there."
      )
    node = node_at[path]
    assert is_bridge(node)  # only an lb.ToNNX reports in a discovery session
    settings = bridge_settings(node)
    sites, accumulators = _for_signature(report), report.new_accumulators
    if report.layers is not None:  # one layer of a stack ran: every layer gets the site
      n = report.layers
      sites = [
        dataclasses.replace(s, shape=(n, *s.shape), stack_axes=s.stack_axes + 1) for s in sites
      ]
      accumulators = {k: (f, _stacked_abstract(v, n)) for k, (f, v) in accumulators.items()}
    linen_vars.add_accumulators(node, accumulators)
    parts.append(declare.Part(path, node, sites, settings.spec, report.dropped))
  return parts


def _stacked_abstract(tree: object, layers: int) -> object:
  """Abstract values with a leading layer axis (what a stack of `layers` holds)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct((layers, *x.shape), x.dtype), tree)


def _for_signature(report: discovery_session.BridgeReport) -> list[SowSite]:
  """The report's sites, each marked with the call signature it is declared for."""
  return [dataclasses.replace(s, signature=report.signature) for s in report.sites]


def _transformed_parts(
  items: Items,
  node_at: dict[tuple, nnx.Module],
  probes_of: dict[int, dict[str, site_probe.SiteProbe]],
  what: str,
) -> list[declare.Part]:
  """Parts of the lb.ToNNX nodes initialized by a copy inside an NNX transform.

  Such a copy reports with no path (`nnx.vmap`/`nnx.scan`/`nnx.remat` call a merged copy), and
  its static attributes do not leave the transform; its Variables do, stacked along the
  transform axis. A node of the model still undeclared after the call, of a class a path-less
  report names, is such a node; the `SiteProbe`s it sowed give each site's stacked shape, so
  its buffers are `(*stack, capacity, *value)` like a stacked native module's.
  """
  transient = [r for path, r in items if path is None]
  if not transient:
    return []
  reached = {id(r.node) for path, r in items if path is not None}
  # Only nodes the call did initialize: they hold Linen variables (or probes) now.
  candidates = [
    (path, node)
    for path, node in node_at.items()
    if is_bridge(node)
    and id(node) not in reached
    and recorder.sites_of(node) is None
    and (linen_vars.attrs(node) or id(node) in probes_of)
  ]
  parts, used = [], set()
  for path, node in candidates:
    label = model_name(node)
    reports = [r for r in transient if r.label == label]
    if not reports:
      continue
    probes = probes_of.get(id(node), {})
    sites: dict[tuple, SowSite] = {}
    for report in reports:
      for site in _for_signature(report):
        probe = probes.get("/".join(site.key))
        if probe is None:
          continue
        stacked = tuple(_compat.variable_value(probe).shape)
        axes = len(stacked) - len(site.shape)
        if axes < 0 or stacked[axes:] != tuple(site.shape):
          continue
        sites[(site.signature, *site.key)] = dataclasses.replace(
          site, shape=stacked, stack_axes=axes
        )
        used.add(id(report))
    settings = bridge_settings(node)
    parts.append(
      declare.Part(
        path,
        node,
        [sites[k] for k in sorted(sites)],
        settings.spec,
        [d for r in reports for d in r.dropped],
      )
    )
  for report in transient:
    if (report.sites or report.new_accumulators) and id(report) not in used:
      raise TypeError(
        f"{what} found lb.ToNNX({report.label}) called inside an NNX transform (nnx.vmap, "
        "nnx.scan, ...) of the model, where it cannot tell which submodule it is. Fix: call "
        "lb.preallocate on that lb.ToNNX directly with the arguments it receives there."
      )
  return parts


def _native_parts(
  findings: observe_native.NativeFindings, node_at: tp.Callable[[tuple], nnx.Module]
) -> list[declare.Part]:
  parts = []
  for path, sites in sorted(findings.sites.items(), key=lambda kv: tuple(map(str, kv[0]))):
    parts.append(declare.Part(path, node_at(path), sorted(sites, key=lambda s: s.key)))
  return parts


def _remove_tuples(node_at: tp.Callable[[tuple], object], paths: tp.Iterable[tuple]) -> None:
  """Delete the tuples flax's own `sow` left during discovery: buffers replace them."""
  for path in paths:
    module = node_at(tuple(path[:-1]))
    if isinstance(module, nnx.Module) and path[-1] in vars(module):
      delattr(module, path[-1])


def _graph_index(root: nnx.Module) -> tuple[dict[int, tuple], dict[tuple, tp.Any]]:
  path_of, node_at = {}, {}
  for path, node in _compat.iter_graph(root):
    path_of.setdefault(id(node), tuple(path))
    node_at[tuple(path)] = node
  return path_of, node_at


def _flat_state(root: nnx.Module) -> dict[tuple, object]:
  return observe_native.flat_state(_compat.split_graph(root)[1])
