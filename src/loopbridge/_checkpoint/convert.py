"""Linen variables and optax state <-> a hand-ported NNX model and its `nnx.Optimizer`.

The pairing of variables comes from the two models' own calls (`convert_align`); this module
moves the numbers: slices stacks layer by layer, stacks them again on the other side (along
the Linen `variable_axes` axis or the NNX stack's axis 0), and writes every array without a
cast, so a round trip is bit-exact. The same pairing converts every params-shaped subtree of
an optax state (adam's `mu` and `nu`, ...). Nothing is written until every value has been
checked, so a failed conversion leaves the port as it was.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from .. import _compat
from .._core.errors import CheckpointError
from .._core.site import key_str
from .convert_align import (
  Key,
  Pair,
  Value,
  align,
  flatten,
  linen_units,
  nnx_units,
  nnx_variables,
  unflatten,
)
from .convert_report import ConversionReport

# An optax state (nested tuples / NamedTuples / dicts of arrays); Linen variables.
OptState = object
Variables = tp.Mapping[str, object]


def _plan(
  linen_module: nn.Module,
  port: nnx.Module,
  sample_args: tuple[object, ...],
  mapping: tp.Mapping[str, str] | None,
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> tuple[list[Pair], dict[Key, jax.ShapeDtypeStruct]]:
  if not isinstance(linen_module, nn.Module):
    raise CheckpointError(
      f"the Linen model must be a flax.linen Module (unbound, e.g. `Model()`), got "
      f"{type(linen_module).__name__}. Fix: pass the Linen module, then its variables."
    )
  if not isinstance(port, nnx.Module):
    raise CheckpointError(
      f"the port must be an nnx.Module built with the checkpoint's widths and depth, got "
      f"{type(port).__name__}."
    )
  lunits, stored = linen_units(linen_module, sample_args, sample_kwargs, method)
  return align(lunits, nnx_units(port, sample_args, sample_kwargs, method), mapping), stored


def _to_nnx(pairs: list[Pair], source: tp.Mapping[Key, Value], col: str | None) -> dict[Key, Value]:
  """Linen arrays by key -> NNX arrays by key (stacks sliced and stacked again)."""
  whole: dict[Key, Value] = {}
  pieces: dict[Key, dict[int, jax.Array]] = {}
  for pair in pairs:
    for lk, nk in pair.leaves:
      if col is not None and lk[0] != col:
        continue
      value = source[(lk[0], *pair.linen.path, lk[1])]
      axis = pair.linen.leaves[lk].axis
      if axis is not None:
        value = jax.lax.index_in_dim(
          jnp.asarray(value), tp.cast(int, pair.linen.layer), axis, False
        )
      key = (nk[0], *pair.nnx.path, nk[1])
      if pair.nnx.leaves[nk].axis is None:
        whole[key] = value
      else:
        pieces.setdefault(key, {})[tp.cast(int, pair.nnx.layer)] = jnp.asarray(value)
  for key, layers in pieces.items():
    whole[key] = jnp.stack([layers[i] for i in range(len(layers))])
  return whole


def _to_linen(
  pairs: list[Pair], source: tp.Mapping[Key, Value], col: str | None
) -> dict[Key, Value]:
  """NNX arrays by key -> Linen arrays by key (stacked along each Linen leaf's layer axis)."""
  whole: dict[Key, Value] = {}
  pieces: dict[Key, tuple[int, dict[int, jax.Array]]] = {}
  for pair in pairs:
    for lk, nk in pair.leaves:
      if col is not None and lk[0] != col:
        continue
      value = source[(nk[0], *pair.nnx.path, nk[1])]
      if pair.nnx.leaves[nk].axis is not None:
        value = jnp.asarray(value)[tp.cast(int, pair.nnx.layer)]
      key = (lk[0], *pair.linen.path, lk[1])
      axis = pair.linen.leaves[lk].axis
      if axis is None:
        whole.setdefault(key, value)  # a variable shared by every layer: the first layer's
      else:
        pieces.setdefault(key, (axis, {}))[1][tp.cast(int, pair.linen.layer)] = jnp.asarray(value)
  for key, (axis, layers) in pieces.items():
    whole[key] = jnp.stack([layers[i] for i in range(len(layers))], axis=axis)
  return whole


def _desc(value: Value | jax.ShapeDtypeStruct) -> str:
  return f"{jnp.result_type(value)}{list(np.shape(value))}"


def _checked_writes(
  targets: tp.Mapping[Key, nnx.Variable], values: tp.Mapping[Key, Value], what: str
) -> list[tuple[nnx.Variable, jax.Array]]:
  """(Variable, new value) for every target, each checked; the new value on the old placement."""
  writes = []
  for key, variable in targets.items():
    if key not in values:
      raise CheckpointError(f"{what}: nothing converts into `{'/'.join(key)}`.")
    old, new = _compat.variable_value(variable), values[key]
    if np.shape(old) != np.shape(new) or jnp.result_type(old) != jnp.result_type(new):
      raise CheckpointError(
        f"{what}: `{'/'.join(key)}` is {_desc(new)} in the source but {_desc(old)} in the "
        "target. Build the target with the source's widths, depth and dtypes (values are "
        "never cast, so a round trip stays bit-exact)."
      )
    sharding = getattr(old, "sharding", None)
    placed = jax.device_put(new, sharding) if sharding is not None else jnp.asarray(new)
    writes.append((variable, placed))
  return writes


# --- optax state ----------------------------------------------------------------------------


def _is_variable(x: object) -> bool:
  return isinstance(x, nnx.Variable)


def _nnx_param_paths(port_params: tp.Mapping[Key, nnx.Variable]) -> set[tuple[str, ...]]:
  return {k[1:] for k in port_params}


def _state_paths(node: object) -> set[tuple[str, ...]]:
  flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=_is_variable)
  return {tuple(key_str(k) for k in path) for path, _ in flat}


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


def _opt_to_nnx(
  pairs: list[Pair],
  opt_state: OptState,
  optimizer: nnx.Optimizer,
  port_params: dict[Key, nnx.Variable],
  linen_param_keys: set[Key],
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
      values = _to_nnx(pairs, flatten(tp.cast(Variables, lnode), ("params",)), "params")
      targets = {("params", *p): v for p, v in _flat_variables(nnode).items()}
      writes += _checked_writes(targets, values, f"optax state `{where}`")
    else:
      if is_linen(lnode) or jax.tree_util.keystr(npath) != jax.tree_util.keystr(lpath):
        raise CheckpointError(_OPT_MISMATCH.format(detail=f"at `{where}`"))
      writes += _checked_writes(
        {("opt_state", where): nnode}, {("opt_state", where): lnode}, "optax state"
      )
      if count is None and lpath and key_str(lpath[-1]) == "count":
        count = lnode
  return writes, count


def _flat_variables(node: object) -> dict[tuple[str, ...], nnx.Variable]:
  flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=_is_variable)
  return {tuple(key_str(k) for k in path): v for path, v in flat}


def _opt_to_linen(
  pairs: list[Pair],
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
      leaves.append(unflatten(_to_linen(pairs, source, "params"))["params"])
    else:
      leaves.append(_compat.variable_value(tp.cast(nnx.Variable, nnode)))
  return jax.tree_util.tree_unflatten(treedef, leaves)


# --- the two directions ---------------------------------------------------------------------


def linen_to_nnx(
  linen_module: nn.Module,
  variables: Variables,
  port: nnx.Module,
  *sample_args: object,
  opt_state: OptState | None = None,
  optimizer: nnx.Optimizer | None = None,
  mapping: tp.Mapping[str, str] | None = None,
  step: int | None = None,
  method: str | None = None,
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
) -> ConversionReport:
  """Fill a hand-ported NNX model (and its `nnx.Optimizer`) from Linen variables, in place.

  Both models run once abstractly on `sample_args`; each Linen module that holds variables is
  paired with the port's module holding the same variable names and shapes, by path, then by
  call order (so a port with its own attribute names works), per layer for stacks (`nn.scan`
  along any `variable_axes` axis, `nn.remat`, `layers_0...`; NNX lists or `nnx.vmap` stacks).
  Every collection is converted (`params` into `nnx.Param`, `batch_stats` into
  `nnx.BatchStat`, ...). Values are never cast; each keeps the port's sharding. A stack's layer
  axis is the axis its stored arrays have beyond what a layer sees; when the number of layers
  equals a width, so that several axes fit, the first fitting axis is taken: check the port
  with `lb.compare` then.

  Args:
    linen_module: the Linen model (unbound).
    variables: its variables, e.g. `{'params': ..., 'batch_stats': ...}` from `init` or a
      checkpoint.
    port: the NNX model, built with the same widths, depth and dtypes; filled in place.
    *sample_args: arguments of one forward call of both models (e.g. one batch).
    opt_state: the Linen optax state (`tx.init(variables['params'])`, trained or not).
    optimizer: the port's `nnx.Optimizer(port, tx, wrt=nnx.Param)` to fill from `opt_state`.
    mapping: `{linen_path: nnx_path}` for modules the automatic pairing cannot place
      (module paths joined with '/'; a prefix maps a subtree).
    step: the optimizer step; by default the optax state's first `count`.
    method: the method both models run on the sample call (as in Linen's
      `apply(..., method=...)`); None for `__call__`.
    sample_kwargs: keyword arguments of that call (e.g. `{'train': False}`).

  Returns:
    A `ConversionReport` of what went where (`print` it, or `to_dict()`).

  Raises:
    CheckpointError: a module without counterpart (named, with the `mapping=` fix), a shape
      or dtype that differs, variables that do not fit the Linen model, or an optax state of
      another structure. Nothing is written then.

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Port(nnx.Module):
    ...   def __init__(self):
    ...     self.proj = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    ...   def __call__(self, x):
    ...     return self.proj(x)
    >>> x = jnp.ones((1, 3))
    >>> variables = nn.Dense(2).init(jax.random.key(1), x)
    >>> report = lb.checkpoint.linen_to_nnx(nn.Dense(2), variables, port := Port(), x)
    >>> bool((port(x) == nn.Dense(2).apply(variables, x)).all())
    True
  """
  if not isinstance(variables, tp.Mapping):
    raise CheckpointError(
      f"variables must be the Linen variables dict ({{'params': ...}}), got "
      f"{type(variables).__name__}."
    )
  if (opt_state is None) != (optimizer is None):
    raise CheckpointError(
      "opt_state= and optimizer= go together: the Linen optax state is converted into the "
      "nnx.Optimizer's state. Pass both, or neither to convert the model only."
    )
  pairs, stored = _plan(linen_module, port, sample_args, mapping, sample_kwargs, method)
  source = flatten(variables)
  missing = ["/".join(k) for k in stored if k not in source]
  extra = ["/".join(k) for k in source if k not in stored]
  wrong = [
    f"{'/'.join(k)}: {list(np.shape(source[k]))} vs {list(stored[k].shape)}"
    for k in stored
    if k in source and np.shape(source[k]) != stored[k].shape
  ]
  if missing or extra or wrong:
    problems = [
      f"{label} {found[:10]}"
      for label, found in (
        ("missing", missing),
        ("not created by the module", extra),
        ("other shapes at", wrong),
      )
      if found
    ]
    raise CheckpointError(
      "the variables do not fit the Linen module on these sample arguments: "
      + "; ".join(problems)
      + ". Fix: pass the variables of this very Linen model (same widths and depth)."
    )
  targets = nnx_variables(port)
  writes = _checked_writes(targets, _to_nnx(pairs, source, None), "linen_to_nnx")
  count: object = None
  optimizer_arrays = 0
  if optimizer is not None:
    port_params = {k: v for k, v in targets.items() if k[0] == "params"}
    opt_writes, count = _opt_to_nnx(
      pairs, opt_state, optimizer, port_params, {k for k in stored if k[0] == "params"}
    )
    writes += opt_writes
    optimizer_arrays = len(opt_writes)
    step_value = step if step is not None else count
    if step_value is not None:
      step_var = optimizer.step
      old = _compat.variable_value(step_var)
      writes.append((step_var, jnp.asarray(step_value, dtype=jnp.result_type(old))))
  for variable, value in writes:
    _compat.set_variable_value(variable, value)
  return ConversionReport.from_pairs(
    "linen_to_nnx",
    pairs,
    optimizer_arrays=optimizer_arrays,
    step=None if optimizer is None else int(_compat.variable_value(optimizer.step)),
  )


@tp.overload
def nnx_to_linen(
  port: nnx.Module,
  linen_module: nn.Module,
  *sample_args: object,
  optimizer: None = None,
  mapping: tp.Mapping[str, str] | None = None,
) -> dict[str, object]: ...
@tp.overload
def nnx_to_linen(
  port: nnx.Module,
  linen_module: nn.Module,
  *sample_args: object,
  optimizer: nnx.Optimizer,
  mapping: tp.Mapping[str, str] | None = None,
) -> tuple[dict[str, object], OptState]: ...
def nnx_to_linen(
  port: nnx.Module,
  linen_module: nn.Module,
  *sample_args: object,
  optimizer: nnx.Optimizer | None = None,
  mapping: tp.Mapping[str, str] | None = None,
) -> dict[str, object] | tuple[dict[str, object], OptState]:
  """The Linen variables (and optax state) that hold what a hand-ported NNX model holds.

  The inverse of `linen_to_nnx`, paired the same way: stacks are rebuilt along the Linen
  module's own layer axes, every collection is returned, values are never cast.

  Args:
    port: the NNX model.
    linen_module: the Linen model (unbound) whose variables to produce.
    *sample_args: arguments of one forward call of both models.
    optimizer: the port's `nnx.Optimizer`; its state is returned as the optax state of the
      same transformation on the Linen params (the step is `optimizer.step`).
    mapping: `{linen_path: nnx_path}` for modules the automatic pairing cannot place.

  Returns:
    The Linen variables (`{'params': ..., 'batch_stats': ...}`), or `(variables, opt_state)`
    when an optimizer is given.

  Raises:
    CheckpointError: a module without counterpart (named, with the `mapping=` fix) or a shape
      that differs.

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> port = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    >>> x = jnp.ones((1, 3))
    >>> variables = lb.checkpoint.nnx_to_linen(port, nn.Dense(2), x)
    >>> bool((nn.Dense(2).apply(variables, x) == port(x)).all())
    True
  """
  pairs, stored = _plan(linen_module, port, sample_args, mapping)
  targets = nnx_variables(port)
  values = _to_linen(pairs, {k: _compat.variable_value(v) for k, v in targets.items()}, None)
  for key, abstract in stored.items():
    if key not in values:
      raise CheckpointError(f"nnx_to_linen: nothing converts into `{'/'.join(key)}`.")
    if np.shape(values[key]) != abstract.shape:
      raise CheckpointError(
        f"nnx_to_linen: `{'/'.join(key)}` would be {_desc(values[key])} but the Linen module "
        f"creates {abstract.dtype}{list(abstract.shape)}. Build the Linen module with the "
        "port's widths and depth."
      )
  variables = unflatten(values)
  if optimizer is None:
    return variables
  port_params = {k: v for k, v in targets.items() if k[0] == "params"}
  return variables, _opt_to_linen(pairs, optimizer, port_params, stored)
