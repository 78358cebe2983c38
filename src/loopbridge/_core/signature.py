"""Call signatures: which of a recorder's declared buffers one `lb.ToNNX` call writes.

A decoding program calls the same model on a prompt `(B, P, ...)` and then on one token
`(B, 1, ...)` per step; each call signature gets its own buffers, so records of different
signatures are never mixed and neither signature's declaration replaces the other's. A
signature is named by a label computed from the call (its method and the shapes and dtypes of
its arguments, and Python scalars among them by value), at declaration and again when a traced
call chooses its buffers. A call whose label was not declared (a step number passed as a
Python int, say) is matched by what it sows instead (`choose_slot`).
"""

from __future__ import annotations

import typing as tp

import jax
import numpy as np

from .site import SowSite, flatten_value


def _leaf_label(leaf: object) -> str | None:
  if isinstance(leaf, (bool, int, float, str)) or leaf is None:
    return repr(leaf)  # a Python scalar is part of the trace: `decode=True`, `length=3`
  shape = getattr(leaf, "shape", None)
  dtype = getattr(leaf, "dtype", None)
  if shape is None or dtype is None:
    return None  # another Python object: not part of the label
  try:
    name = np.dtype(dtype).name
  except TypeError:  # typed PRNG keys and other extended dtypes
    name = str(dtype)
  return f"{name}[{','.join(map(str, shape))}]"


def _arg_label(arg: object) -> str | None:
  leaves = [_leaf_label(x) for x in jax.tree.leaves(arg)]
  leaves = [x for x in leaves if x is not None]
  if not leaves:
    return None
  return leaves[0] if len(leaves) == 1 else "{" + ", ".join(leaves) + "}"


def label(args: tp.Sequence[object], kwargs: tp.Mapping[str, object], method: object) -> str:
  """A readable name of a call's signature, e.g. `"(float32[2,1,32])"` or
  `"decode(int32[2,1], cache_index=int32[])"`; equal for calls whose arrays have equal
  shapes and dtypes."""
  parts = [a for a in map(_arg_label, args) if a is not None]
  for name in sorted(kwargs):
    if name in ("mutable", "rngs"):
      continue
    value = _arg_label(kwargs[name])
    if value is not None:
      parts.append(f"{name}={value}")
  name = "" if method is None else getattr(method, "__name__", str(method))
  return f"{'' if name == '__call__' else name}({', '.join(parts)})"


# `site_values`: what one call sowed at one sow, arrays or pytrees of arrays (read by numpy).
def _fits(site_values: tp.Sequence[tp.Any], sites: tp.Sequence[SowSite]) -> bool:
  """Whether one call's values at one sow fit the sites (array or pytree leaves) declared."""
  if not sites:
    return all(not flatten_value(v)[1] for v in site_values)
  sites = sorted(sites, key=lambda s: s.leaf_index)
  for value in site_values:
    if sites[0].treedef is None:
      leaves = [value]
    else:
      treedef, flat = flatten_value(value)
      if treedef != sites[0].treedef:
        return False
      leaves = [leaf for _, leaf in flat]
    if len(leaves) != len(sites):
      return False
    for site, leaf in zip(sites, leaves):
      if tuple(np.shape(leaf)) != tuple(site.value_shape):
        return False
      if str(jax.numpy.result_type(leaf)) != site.dtype:
        return False
  return True


def choose_slot(
  sites: tp.Sequence[SowSite],
  call_label: str,
  records: tp.Mapping[tuple[str, ...], tp.Sequence[tp.Any]],
) -> int | None:
  """The signature slot one call writes: the one declared under its label, else the most
  recently declared one whose sites take every value the call sowed (`records`: sow key ->
  that call's values); None when none does."""
  by_slot: dict[int, list[SowSite]] = {}
  for site in sites:
    by_slot.setdefault(site.slot, []).append(site)
  for slot, its in by_slot.items():
    if its[0].signature == call_label:
      return slot
  for slot in sorted(by_slot, reverse=True):
    its = by_slot[slot]
    if all(_fits(values, [s for s in its if s.sow_key == key]) for key, values in records.items()):
      return slot
  return None
