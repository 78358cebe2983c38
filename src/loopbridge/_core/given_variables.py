"""Linen variables given from outside (`linen.init`'s dict, a Linen checkpoint): checked as given.

`lb.checkpoint.from_linen_variables` builds an `lb.ToNNX` around such a dict without
initializing, and `lb.checkpoint.load_linen_variables` writes one into an initialized model;
both compare the dict's paths, shapes and dtypes with what the module has (or creates) before
using a value. Sown records (tuples) are not state, and static values (the graphdef flax 0.10's
`nnx.bridge.ToLinen` keeps in its 'nnx' collection) are neither loaded nor compared.
"""

from __future__ import annotations

import typing as tp

import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from flax import traverse_util
from flax.core import FrozenDict, meta, unfreeze

from . import linen_vars
from .errors import CheckpointError

Variables = dict[str, tp.Any]  # a Linen variables dict: {'params': {...}, ...}
Leaves = dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype]]


def describe(shape: tp.Sequence[int], dtype: npt.DTypeLike) -> str:
  """`(2, 3) float32`: a value's shape and dtype in messages."""
  return f"{tuple(shape)} {dtype if isinstance(dtype, str) else np.dtype(dtype).name}"


def plain_variables(variables: object, what: str) -> Variables:
  """`variables` as a plain dict (a FrozenDict is thawed); CheckpointError for a non-mapping."""
  if not isinstance(variables, tp.Mapping):
    raise CheckpointError(
      f"{what} needs a Linen variables dict like linen.init returns "
      f"({{'params': {{...}}, ...}}), got {type(variables).__name__}."
    )
  return unfreeze(variables) if isinstance(variables, FrozenDict) else dict(variables)


def _is_leaf(_: object, value: object) -> bool:
  return isinstance(value, (meta.AxisMetadata, tuple))


def flat_values(variables: tp.Mapping[str, object]) -> dict[tuple[str, ...], object]:
  """Every variable (boxes and sown tuples as leaves) by its path."""
  return dict(traverse_util.flatten_dict(dict(variables), is_leaf=_is_leaf))


def unboxed_leaves(tree: tp.Mapping[str, object]) -> Leaves:
  """(shape, dtype) of every array variable by its path; records and static values left out."""
  out = {}
  for path, value in flat_values(tree).items():
    if isinstance(value, tuple):  # a sown record, not state
      continue
    value = linen_vars.unbox(value, constrain=False)
    if not linen_vars.is_data(value):  # static structure (a graphdef): not loaded, not compared
      continue
    out[tuple(map(str, path))] = (tuple(np.shape(value)), np.dtype(jnp.result_type(value)))
  return out


def check_structure(given: Variables, expected: Variables, what: str, module_name: str) -> None:
  """CheckpointError listing every path, shape or dtype in which `given` differs from `expected`."""
  have, want = unboxed_leaves(given), unboxed_leaves(expected)
  missing = sorted(set(want) - set(have))
  extra = sorted(set(have) - set(want))
  differ = sorted(k for k in set(have) & set(want) if have[k] != want[k])
  if not (missing or extra or differ):
    return
  lines = []
  if differ:
    lines.append(
      "different shape/dtype: "
      + "; ".join(
        f"{'/'.join(k)} given {describe(*have[k])} vs module {describe(*want[k])}"
        for k in differ[:8]
      )
    )
  if missing:
    lines.append("missing: " + ", ".join("/".join(k) for k in missing[:8]))
  if extra:
    lines.append("not in the module: " + ", ".join("/".join(k) for k in extra[:8]))
  hint = ""
  if "params" not in given and any(k[0] == "params" and k[1] in given for k in want):
    hint = " (it looks like a bare params tree: pass {'params': params})"
  raise CheckpointError(
    f"{what}: the variables do not match what {module_name} creates for these sample "
    f"arguments{hint}: " + "; ".join(lines) + ". Why: the variables are used as they are, "
    "without initializing, so they must have exactly the module's structure. Fix: pass the "
    "dict linen.init (or the Linen checkpoint) produced for this module, with sample "
    "arguments of the shapes it was initialized with."
  )


def with_static_values(variables: Variables, expected: tp.Mapping[str, object]) -> Variables:
  """`variables` plus the static values init creates that they lack (flax 0.10's ToLinen keeps
  its graphdef in an 'nnx' collection, which a params-only dict or a checkpoint has not)."""
  flat = flat_values(variables)
  for path, value in flat_values(expected).items():
    if (
      path not in flat
      and not isinstance(value, tuple)
      and not linen_vars.is_data(linen_vars.unbox(value, constrain=False))
    ):
      flat[path] = value
  return traverse_util.unflatten_dict(flat)


def without(variables: tp.Mapping[str, object], paths: set[tuple[str, ...]]) -> Variables:
  """`variables` minus the given leaf paths (sown records are not state)."""
  flat = traverse_util.flatten_dict(dict(variables), is_leaf=lambda _, v: isinstance(v, tuple))
  return traverse_util.unflatten_dict({p: v for p, v in flat.items() if p not in paths})
