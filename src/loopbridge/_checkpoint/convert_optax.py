"""The optax state of a conversion: every params-shaped subtree of it (adam's `mu` and `nu`,
...) is converted by the same pairing as the params, the rest (counts) is moved as it is."""

from __future__ import annotations

import typing as tp

import jax
from flax import nnx

from .. import _compat
from .._core.errors import CheckpointError
from .._core.site import key_str
from .convert_align import Key, flatten, unflatten
from .convert_moves import Axes, checked_writes, to_linen, to_nnx
from .convert_pairs import Pair

# An optax state (nested tuples / NamedTuples / dicts of arrays); Linen variables.
OptState = object
Variables = tp.Mapping[str, object]


def _is_variable(x: object) -> bool:
  return isinstance(x, nnx.Variable)


def _nnx_param_paths(port_params: tp.Mapping[Key, nnx.Variable]) -> set[tuple[str, ...]]:
  return {k[1:] for k in port_params}


def _holds_value(leaf: object) -> bool:
  # flax 0.10 keeps a value-less Param (`nnx.Linear(use_bias=False).bias`) and optax states
  # of it: they hold nothing and are skipped, as in `nnx_variables`.
  return not (isinstance(leaf, nnx.Variable) and _compat.variable_value(leaf) is None)


def _state_paths(node: object) -> set[tuple[str, ...]]:
  flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=_is_variable)
  return {tuple(key_str(k) for k in path) for path, leaf in flat if _holds_value(leaf)}


def _nnx_params_like(paths: set[tuple[str, ...]]) -> tp.Callable[[object], bool]:
  return lambda x: isinstance(x, nnx.State) and _state_paths(x) == paths


def _linen_params_like(keys: set[Key]) -> tp.Callable[[object], bool]:
  return lambda x: isinstance(x, tp.Mapping) and set(flatten(x, ("params",))) == keys


_OPT_MISMATCH = (
  "the optax state does not have the structure the optimizer's own state has ({detail}). "
  "Fix: pass the state of the same optax transformation (e.g. optax.adam for both), created "
  "on the Linen params of this model (`tx.init(variables['params'])`), and an nnx.Optimizer "
  "built on this port with `wrt=nnx.Param`."
)


def _optimizer_parts(optimizer: nnx.Optimizer, port_params: tp.Mapping[Key, nnx.Variable]):
  if not isinstance(optimizer, nnx.Optimizer):
    raise CheckpointError(
      f"optimizer= takes an nnx.Optimizer built on the port, got {type(optimizer).__name__}."
    )
  is_params = _nnx_params_like(_nnx_param_paths(port_params))
  flat, _ = jax.tree_util.tree_flatten_with_path(
    optimizer.opt_state, is_leaf=lambda x: _is_variable(x) or is_params(x)
  )
  return flat, is_params


def opt_to_nnx(
  pairs: tp.Sequence[Pair],
  axes: Axes,
  opt_state: OptState,
  optimizer: nnx.Optimizer,
  port_params: dict[Key, nnx.Variable],
  linen_param_keys: set[Key],
  copy: bool,
) -> tuple[list[tuple[nnx.Variable, jax.Array]], object]:
  nflat, is_params = _optimizer_parts(optimizer, port_params)
  is_linen = _linen_params_like(linen_param_keys)
  lflat, _ = jax.tree_util.tree_flatten_with_path(opt_state, is_leaf=is_linen)
  if len(lflat) != len(nflat):
    raise CheckpointError(
      _OPT_MISMATCH.format(detail=f"{len(lflat)} parts against the optimizer's {len(nflat)}")
    )
  writes: list[tuple[nnx.Variable, jax.Array]] = []
  count: object = None
  for (npath, nnode), (lpath, lnode) in zip(nflat, lflat):
    where = jax.tree_util.keystr(lpath) or "<root>"
    if is_params(nnode):
      if not is_linen(lnode):
        raise CheckpointError(
          _OPT_MISMATCH.format(detail=f"`{where}` is not shaped like the Linen params")
        )
      values = to_nnx(pairs, flatten(tp.cast(Variables, lnode), ("params",)), "params", axes)
      targets = {("params", *p): v for p, v in _flat_variables(nnode).items()}
      writes += checked_writes(targets, values, f"optax state `{where}`", copy)
    else:
      if is_linen(lnode) or jax.tree_util.keystr(npath) != jax.tree_util.keystr(lpath):
        raise CheckpointError(_OPT_MISMATCH.format(detail=f"at `{where}`"))
      writes += checked_writes(
        {("opt_state", where): nnode}, {("opt_state", where): lnode}, "optax state", copy
      )
      if count is None and lpath and key_str(lpath[-1]) == "count":
        count = lnode
  return writes, count


def _flat_variables(node: object) -> dict[tuple[str, ...], nnx.Variable]:
  flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=_is_variable)
  return {tuple(key_str(k) for k in path): v for path, v in flat if _holds_value(v)}


def opt_to_linen(
  pairs: tp.Sequence[Pair],
  axes: Axes,
  optimizer: nnx.Optimizer,
  port_params: dict[Key, nnx.Variable],
  stored: dict[Key, jax.ShapeDtypeStruct],
) -> OptState:
  nflat, is_params = _optimizer_parts(optimizer, port_params)
  linen_keys = {k for k in stored if k[0] == "params"}
  abstract_params = unflatten({k[1:]: stored[k] for k in linen_keys})
  structure = jax.eval_shape(optimizer.tx.init, abstract_params)
  is_linen = _linen_params_like(linen_keys)
  lflat, treedef = jax.tree_util.tree_flatten(structure, is_leaf=is_linen)
  if len(lflat) != len(nflat):
    raise CheckpointError(
      _OPT_MISMATCH.format(detail=f"{len(lflat)} parts against the optimizer's {len(nflat)}")
    )
  leaves = []
  for (npath, nnode), lnode in zip(nflat, lflat):
    if is_params(nnode) != is_linen(lnode):
      where = jax.tree_util.keystr(npath) or "<root>"
      raise CheckpointError(_OPT_MISMATCH.format(detail=f"at `{where}`"))
    if is_params(nnode):
      source = {
        ("params", *p): _compat.variable_value(v) for p, v in _flat_variables(nnode).items()
      }
      leaves.append(unflatten(to_linen(pairs, source, "params", axes))["params"])
    else:
      leaves.append(_compat.variable_value(tp.cast(nnx.Variable, nnode)))
  return jax.tree_util.tree_unflatten(treedef, leaves)
