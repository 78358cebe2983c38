"""One call's sows of an `lb.ToNNX` matched to its buffers: a sown pytree's records leaf by
leaf, and the errors for a sow that fits no declared buffer or call signature."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import buffers as _buffers
from . import recorder
from . import site as _site
from .errors import NotDeclaredError

_SOW_WITHOUT_BUFFER = (
  "this call sowed into '{label}', a site with no buffer. Why: buffers are declared for the "
  "sows of the call signature given to lazy_init/preallocate, and this call makes a different "
  "one (other method, arguments or branch). Fix: declare it before the loop with "
  "lb.preallocate(model, *args, capacity=..., method=..., **kwargs); buffers already declared "
  "are kept."
)

_NO_SIGNATURE = (
  "this call of lb.ToNNX({model}), signature {label!r}, matches none of its declared call "
  "signatures ({declared}): it sows {sown}. Why: each call signature records into buffers "
  "declared for it, so records of a prompt and of decode steps are never mixed. Fix: declare "
  "this signature before the loop with lb.preallocate(model, *args, capacity=..., "
  "**kwargs); the signatures already declared keep their buffers and records."
)


def _describe_sown(value: object) -> object:
  return jax.tree.map(lambda v: f"{jnp.result_type(v)}{list(np.shape(v))}", value)


_PYTREE_CHANGED = (
  "sow site {label} was declared for a pytree of structure {declared} and this call sows "
  "{got}. Why: each array leaf of a sown pytree has its own preallocated buffer, so the "
  "structure must stay the same inside NNX loops. Fix: declare this call signature with "
  "lb.preallocate(model, *args, capacity=..., **kwargs) before the loop (a changed structure "
  "starts that site's buffers anew), or sow the two structures under different names."
)


def _pytree_records(
  node: nnx.Module,
  path: tuple[str, ...],
  value: tuple,
  buffers: dict,
  label: str,
  slot: int,
) -> list[tuple[_buffers.Buffer, int, list, str]]:
  """(buffer, count index, values, label) per array leaf of one call's pytree sows at `path`."""
  sites = sorted(
    (
      s
      for s in (recorder.sites_of(node) or ())
      if s.sow_key == path and s.treedef is not None and s.slot == slot
    ),
    key=lambda s: s.leaf_index,
  )
  flat = [_site.flatten_value(v) for v in value]
  if not sites:
    if all(not leaves for _, leaves in flat):
      return []  # pytrees without array leaves (e.g. a captured None): nothing to record
    raise NotDeclaredError(_SOW_WITHOUT_BUFFER.format(label=label))
  treedef = sites[0].treedef
  for got, _ in flat:
    if got != treedef:
      raise NotDeclaredError(_PYTREE_CHANGED.format(label=label, declared=treedef, got=got))
  out = []
  for site in sites:
    buffer = recorder.get_nested(buffers, site.key)
    leaf_label = f"{label}{''.join(f'[{k}]' for k in site.leaf)}"
    leaves = [leaves[site.leaf_index][1] for _, leaves in flat]
    for leaf in leaves:
      _buffers.check_value(buffer, leaf, leaf_label)
    out.append((buffer, site.count_index, leaves, leaf_label))
  return out
