"""Site probes: finding an `lb.ToNNX` that `lb.lazy_init` reached only through a copy.

NNX transforms (`nnx.vmap`, `nnx.scan`, `nnx.remat`) call a copy merged from the module's
state: the copy's static attributes stay inside the transform, but its Variables come out,
stacked along the transform axis. So a copy that sows during `lb.lazy_init` leaves a
`SiteProbe` (zeros of the site's shape) per sow site on itself; after the call the pipeline
takes them off the model's nodes, and each tells which node sowed and the site's stacked shape.
"""

from __future__ import annotations

import typing as tp

import jax.numpy as jnp
import numpy as np
from flax import nnx

from .. import _compat
from . import recorder
from .bridge_settings import is_bridge
from .site import SowSite, flatten_value


class SiteProbe(nnx.Variable):
  """A zero value of one sow site's shape, left on the node during `lb.lazy_init`.

  Called by a copy inside an NNX transform (`nnx.vmap`, `nnx.scan`, `nnx.remat`), the node's
  static attributes stay in the transform but its Variables come out, stacked along the
  transform axis: the probe tells the pipeline which node sowed and the stacked shape.
  """


def _probe_value(site: SowSite, sown: object) -> jnp.ndarray:
  """Zeros of the site's shape, computed from the sown value so that they are batched (under
  `nnx.vmap`) exactly when the value is: a transform that does not stack the node then fails
  on the probe at lazy_init instead of on the buffers at a later call."""
  if isinstance(sown, tuple) and sown:
    first = sown[0]
    if site.treedef is not None:  # one leaf of a sown pytree
      leaves = flatten_value(first)[1]
      first = leaves[site.leaf_index][1] if site.leaf_index < len(leaves) else None
    if first is not None and np.shape(first) == tuple(site.shape):
      return jnp.asarray(first) * 0
  return jnp.zeros(site.shape, site.dtype)


def leave_probes(
  node: nnx.Module, sites: tp.Sequence[SowSite], sown: tp.Mapping[tuple[str, ...], object]
) -> None:
  """Put a probe per site on `node` (`sown`: the init's flat variables, records included)."""
  if sites:
    _compat.set_data_attribute(
      node,
      recorder.PROBES_ATTR,
      {"/".join(site.key): SiteProbe(_probe_value(site, sown.get(site.sow_key))) for site in sites},
    )


def take_probes(root: nnx.Module) -> dict[int, dict[str, SiteProbe]]:
  """Remove the probes lb.ToNNX nodes left during lazy_init: id(node) -> {site: probe}."""
  taken = {}
  for _, node in _compat.iter_graph(root):
    if is_bridge(node) and recorder.PROBES_ATTR in vars(node):
      taken[id(node)] = dict(getattr(node, recorder.PROBES_ATTR))
      delattr(node, recorder.PROBES_ATTR)
  return taken
