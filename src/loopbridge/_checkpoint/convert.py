"""Linen variables and optax state <-> a hand-ported NNX model and its `nnx.Optimizer`.

The stages: the units of both models (`convert_align`), every candidate pairing of their
leaves (`convert_match`, with the `rules=` of `leaf_rules`), the choice among candidates and
the check of the kept conversion by running both models (`convert_evidence`), and the moving
of arrays (`convert_moves`). This module runs them and writes: every array without a cast, so
a round trip is bit-exact. The same pairing converts every params-shaped subtree of an optax
state (adam's `mu` and `nu`, ...). Nothing is written until every value has been checked, so
a failed conversion leaves the port as it was.
"""

from __future__ import annotations

import operator
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from .. import _compat
from .._core.errors import CheckpointError
from .._diagnostics.compare_tolerance import HIGHEST, check_context, check_precision
from .convert_align import (
  CACHE,
  SKIPPED_COLLECTIONS,
  Key,
  Value,
  flatten,
  linen_units,
  nnx_units,
  nnx_variables,
  unflatten,
)
from .convert_call import check_call
from .convert_classes import split_classes
from .convert_evidence import Check, Sides, Verdict, decide
from .convert_match import pair_units
from .convert_moves import Axes, checked_writes, describe_value, to_linen, to_nnx
from .convert_optax import OptState, opt_to_linen, opt_to_nnx
from .convert_pairs import Pair
from .convert_probes import ProbeSpec
from .convert_report import ConversionReport, unproven_text
from .leaf_rules import LeafRule

# Linen variables.
Variables = tp.Mapping[str, object]


class Plan(list[Pair]):
  """The kept pairs of one conversion and the Linen layer axes the evidence chose."""

  def __init__(self, pairs: tp.Iterable[Pair], verdict: Verdict, sides: Sides):
    super().__init__(pairs)
    self.tolerance = sides.tol
    self.axes: Axes = verdict.axes
    self.checks: list[Check] = verdict.checks
    self.output_error = verdict.output_error
    self.values = verdict.values
    self.proven = sides.prove
    self.differing = verdict.differing
    # Whether a given Linen decode cache was converted (the sample call was a decode step).
    self.cache = any(k[0] == CACHE for k in verdict.values) if sides.forward else False


def _plan(
  linen_module: nn.Module,
  port: nnx.Module,
  sample_args: tuple[object, ...],
  mapping: tp.Mapping[str, str] | None,
  rules: tp.Sequence[LeafRule] | None,
  source: tp.Callable[[dict[Key, jax.ShapeDtypeStruct]], tp.Mapping[Key, Value]],
  forward: bool,
  sample_kwargs: tp.Mapping[str, tp.Any] | None,
  method: str | None,
  cache: tp.Mapping[str, object] | None = None,
  precision: str = HIGHEST,
  prove: bool = True,
  probes: ProbeSpec = None,
) -> tuple[Plan, dict[Key, jax.ShapeDtypeStruct]]:
  """Pair both models' leaves and decide every open candidate by running them (the caller runs
  this under `check_context(precision)`: full float32 matmuls by default, on every backend)."""
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
  if rules is not None and (
    isinstance(rules, (str, LeafRule)) or not isinstance(rules, tp.Sequence)
  ):
    raise CheckpointError(
      f"rules= takes a list of rules ([lb.checkpoint.split(...), ...]), got {rules!r}."
    )
  inputs = check_call(linen_module, port, sample_kwargs, method, probes)
  lunits, stored, modules = linen_units(linen_module, sample_args, sample_kwargs, method, cache)
  with_cache = any(k[0] == CACHE for k in stored)
  nunits = nnx_units(port, sample_args, sample_kwargs, method, with_cache)
  pairs = pair_units(lunits, nunits, mapping, rules)
  values = source(stored)
  axis_options = {(tp.cast(tuple, u.stack), col): o for u in lunits for col, o in u.axis_options}
  sides = Sides(
    linen_module,
    modules,
    port,
    sample_args,
    values,
    forward,
    sample_kwargs,
    method,
    precision,
    prove,
  )
  sides.probes = inputs
  verdict = decide(pairs, sides, axis_options)
  # A class of modules of equal shapes was decided as one pair (every assignment); from
  # here on (the report, an optax state's moves) it is one pair per module again.
  split = split_classes(pairs)
  pairs = [pair for pair, _ in split]
  verdict.checks = [verdict.checks[n] for _, n in split]
  return Plan(pairs, verdict, sides), stored


def _to_nnx(pairs: Plan, source: tp.Mapping[Key, Value], col: str | None) -> dict[Key, Value]:
  """Linen arrays by key -> NNX arrays by key (a whole stack moved once, or sliced and stacked)."""
  return to_nnx(pairs, source, col, pairs.axes)


def _to_linen(pairs: Plan, source: tp.Mapping[Key, Value], col: str | None) -> dict[Key, Value]:
  """NNX arrays by key -> Linen arrays by key (stacked along each Linen leaf's layer axis)."""
  return to_linen(pairs, source, col, pairs.axes)


# --- the two directions ---------------------------------------------------------------------


def _check_step(step: object) -> None:
  """`step=` is a count of optimizer updates: a non-negative integer."""
  try:
    value = None if isinstance(step, bool) else operator.index(tp.cast(tp.Any, step))
  except TypeError:
    value = None
  if value is None or value < 0:
    raise CheckpointError(
      f"lb.checkpoint.linen_to_nnx: step={step!r} is not an optimizer step. Why: step= is the "
      "count of updates the optimizer has made, written into optimizer.step. Fix: a "
      "non-negative int (e.g. step=1000), or leave it out to take the optax state's count."
    )


def linen_to_nnx(
  linen_module: nn.Module,
  variables: Variables,
  port: nnx.Module,
  *sample_args: object,
  opt_state: OptState | None = None,
  optimizer: nnx.Optimizer | None = None,
  mapping: tp.Mapping[str, str] | None = None,
  rules: tp.Sequence[LeafRule] | None = None,
  step: int | None = None,
  method: str | None = None,
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  precision: tp.Literal["highest", "model"] = HIGHEST,
  check: bool = True,
  copy: bool = True,
  probes: ProbeSpec = None,
) -> ConversionReport:
  """Fill a hand-ported NNX model (and its `nnx.Optimizer`) from Linen variables, in place.

  Both models run once abstractly on `sample_args` to find which modules hold which
  variables (per layer for stacks: `nn.scan` along any `variable_axes` axis, `nn.remat`,
  `layers_0...`; NNX lists or `nnx.vmap` stacks). Leaves pair by `rules=` and `mapping=`
  first, then by path, then by shapes in call order, then by leaf transforms (split, fuse,
  reshape, transpose) below a module path both sides share. Nothing is chosen by order
  alone: a Linen stack's layer axis is read from its `nn.scan` `variable_axes`; wherever
  several candidates fit (leaves of equal shapes under other names, a square kernel that may
  be stored transposed, a split's order, a layer axis that cannot be read when the depth
  equals a width, every assignment among modules of equal shapes), both models run on
  `sample_args` and on probes made from them (`probes=`: new values for the sample's data, so
  that a degenerate sample cannot make a wrong candidate agree), and each candidate is checked
  against Linen on every input, module by module where the modules ran outside transforms,
  else through the model's output; exactly one must agree. The kept conversion is checked the
  same way before anything is written. Every collection is converted (`params` into
  `nnx.Param`, `batch_stats` into `nnx.BatchStat`, ...); a Linen `cache` collection is
  converted (and run, as the call's decode state) only when the sample call creates one (a
  decode step of flax's `has_variable('cache', ...)` idiom), else left out with the port
  keeping its `nnx.Cache` values; values are never cast; each keeps the port's sharding.
  The port gets its own copy of each array by default, so a donating step on the port
  (`nnx.jit(..., donate_argnums=0)`) never deletes the caller's `variables` or `opt_state`,
  which stay usable with plain Linen (as `lb.checkpoint.load_linen_variables` does).

  Args:
    linen_module: the Linen model (unbound).
    variables: its variables, e.g. `{'params': ..., 'batch_stats': ...}` from `init` or a
      checkpoint.
    port: the NNX model, built with the same widths, depth and dtypes; filled in place.
    *sample_args: arguments of one forward call of both models (e.g. one batch).
    opt_state: the Linen optax state (`tx.init(variables['params'])`, trained or not).
    optimizer: the port's `nnx.Optimizer(port, tx, wrt=nnx.Param)` to fill from `opt_state`.
    mapping: `{linen_path: nnx_path}` for modules the automatic pairing cannot place
      (module paths joined with '/'; a prefix maps a subtree; a leaf path such as
      `'ln/scale': 'norm/alpha'` maps one variable).
    rules: leaf transforms the port applies (`lb.checkpoint.split`, `fuse`, `reshape`,
      `transpose`, `rename`), e.g. a fused gate/up `[2, D, F]` kept as two Linears.
    step: the optimizer step; by default the optax state's first `count`.
    method: the method both models run on the sample call (as in Linen's
      `apply(..., method=...)`); None for `__call__`.
    sample_kwargs: keyword arguments of that call (e.g. `{'train': False}`).
    precision: what both models run at when candidates are checked: 'highest' (the default)
      under `jax.default_matmul_precision('highest')`, so a TPU's float32 matmuls (one
      bfloat16 pass by default) cannot blur two candidates; 'model' at their own precision,
      with the looser tolerance that goes with it. The report names it (`tolerance`).
    check: False loads the weights into a port that is not right yet, to find where it
      differs (then `lb.compare`): a pairing the evidence cannot decide takes its first
      candidate (the report says "unproven"), and a port whose output differs is filled
      anyway, the report naming the first module pair whose outputs differ
      (`report.unproven`). Nothing is proven then: never save such a port as converted.
    copy: `False` moves the arrays instead, when memory is tight: where no transform changes
      a leaf, the port holds the very arrays given (no second copy on the device), so a
      donating step on the port deletes them; use `variables` and `opt_state` no more after
      that.
    probes: the inputs besides the sample that candidates are checked on: None draws two
      (new floats and token ids; integer positions, masks and keys kept as given, since two
      correct models need agree only on consistent inputs), `0` or `()` none, and
      `[(args, kwargs), ...]` your own (each a call both models take).

  Returns:
    A `ConversionReport` of what went where, how each pair was decided and the error of its
    check (`print` it, or `to_dict()`).

  Raises:
    TypeError: `copy` is not a bool.
    CheckpointError: a module without counterpart (named, with the `mapping=` fix); a
      mapping entry or rule that cannot be honoured (named); no candidate, or several, that
      reproduce the Linen output (listed as rules ready to paste); a converted port whose
      output differs; a shape or dtype that differs, variables that do not fit the Linen
      model, an optax state of another structure, or a `method=` either model lacks.
      Nothing is written then.

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
  if step is not None:
    _check_step(step)
  if not isinstance(copy, bool):
    raise TypeError(
      f"lb.checkpoint.linen_to_nnx: copy= must be True or False, got {copy!r}. Fix: copy=True "
      "(the default: the port gets its own arrays) or copy=False (move them)."
    )

  def checked_source(stored: dict[Key, jax.ShapeDtypeStruct]) -> dict[Key, Value]:
    keep = (CACHE,) if any(k[0] == CACHE for k in stored) else ()
    source = flatten(tp.cast(Variables, variables), keep=keep)
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
    return source

  check_precision(precision, "lb.checkpoint", CheckpointError)
  with check_context(precision):
    pairs, stored = _plan(
      linen_module,
      port,
      sample_args,
      mapping,
      rules,
      checked_source,
      True,
      sample_kwargs,
      method,
      tp.cast(tp.Mapping[str, object], variables.get(CACHE)),
      precision,
      check,
      probes,
    )
  targets = nnx_variables(port, cache=pairs.cache)
  writes = checked_writes(targets, pairs.values, "linen_to_nnx", copy)
  count: object = None
  optimizer_arrays = 0
  if optimizer is not None:
    port_params = {k: v for k, v in targets.items() if k[0] == "params"}
    linen_params = {k for k in stored if k[0] == "params"}
    opt_writes, count = opt_to_nnx(
      pairs, pairs.axes, opt_state, optimizer, port_params, linen_params, copy
    )
    writes += opt_writes
    optimizer_arrays = len(opt_writes)
    step_value = step if step is not None else count
    if step_value is not None:
      step_var = optimizer.step
      old = _compat.variable_value(step_var)
      value = jnp.asarray(step_value, dtype=jnp.result_type(old))
      writes.append((step_var, jnp.array(value, copy=True) if copy else value))
  for variable, value in writes:
    _compat.set_variable_value(variable, value)
  return ConversionReport.from_pairs(
    "linen_to_nnx",
    pairs,
    pairs.checks,
    optimizer_arrays=optimizer_arrays,
    step=None if optimizer is None else int(_compat.variable_value(optimizer.step)),
    output_error=pairs.output_error,
    layer_axes=pairs.axes,
    skipped=sorted(
      k for k in variables if k in SKIPPED_COLLECTIONS and not (k == CACHE and pairs.cache)
    ),
    tolerance=pairs.tolerance,
    unproven=None if pairs.proven else unproven_text(pairs.checks, pairs.differing),
  )


@tp.overload
def nnx_to_linen(
  port: nnx.Module,
  linen_module: nn.Module,
  *sample_args: object,
  optimizer: None = None,
  mapping: tp.Mapping[str, str] | None = None,
  rules: tp.Sequence[LeafRule] | None = None,
  method: str | None = None,
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  precision: tp.Literal["highest", "model"] = HIGHEST,
  probes: ProbeSpec = None,
  copy: bool = True,
) -> dict[str, object]: ...
@tp.overload
def nnx_to_linen(
  port: nnx.Module,
  linen_module: nn.Module,
  *sample_args: object,
  optimizer: nnx.Optimizer,
  mapping: tp.Mapping[str, str] | None = None,
  rules: tp.Sequence[LeafRule] | None = None,
  method: str | None = None,
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  precision: tp.Literal["highest", "model"] = HIGHEST,
  probes: ProbeSpec = None,
  copy: bool = True,
) -> tuple[dict[str, object], OptState]: ...
def nnx_to_linen(
  port: nnx.Module,
  linen_module: nn.Module,
  *sample_args: object,
  optimizer: nnx.Optimizer | None = None,
  mapping: tp.Mapping[str, str] | None = None,
  rules: tp.Sequence[LeafRule] | None = None,
  method: str | None = None,
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  precision: tp.Literal["highest", "model"] = HIGHEST,
  probes: ProbeSpec = None,
  copy: bool = True,
) -> dict[str, object] | tuple[dict[str, object], OptState]:
  """The Linen variables (and optax state) that hold what a hand-ported NNX model holds.

  The inverse of `linen_to_nnx`, paired and decided the same way (the port runs once on
  `sample_args` and the Linen model with each candidate is checked against it): rules run
  inverted, stacks are rebuilt along the Linen module's own layer axes, every collection is
  returned but the port's decode caches (`nnx.Cache`; Linen sizes its own by `init`), values
  are never cast.

  Args:
    port: the NNX model.
    linen_module: the Linen model (unbound) whose variables to produce.
    *sample_args: arguments of one forward call of both models.
    optimizer: the port's `nnx.Optimizer`; its state is returned as the optax state of the
      same transformation on the Linen params (the step is `optimizer.step`).
    mapping: `{linen_path: nnx_path}` for modules (or leaves) the pairing cannot place.
    rules: the same leaf rules as for `linen_to_nnx` (stated Linen -> NNX; run inverted).
    method: the method both models run on the sample call; None for `__call__`.
    sample_kwargs: keyword arguments of that call (e.g. `{'train': False}`).
    precision: what both models run at when candidates are checked: 'highest' (the default)
      or 'model' (their own, with the looser tolerance that goes with it), as for
      `linen_to_nnx`.
    probes: the inputs besides the sample that candidates are checked on, as for `linen_to_nnx`.
    copy: True (the default) hands back arrays of their own, so a donated step on the port
      (`nnx.jit(..., donate_argnums=0)`) cannot delete them; False hands back the port's own
      arrays where a value needs no transform (no second copy in memory).

  Returns:
    The Linen variables (`{'params': ..., 'batch_stats': ...}`), or `(variables, opt_state)`
    when an optimizer is given.

  Raises:
    CheckpointError: a module without counterpart (named, with the `mapping=` fix), a mapping
      entry or rule that cannot be honoured, candidates that the port's output cannot tell
      apart (listed), a converted Linen model whose output differs, a shape that differs,
      or a `method=` either model lacks.

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> port = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    >>> x = jnp.ones((1, 3))
    >>> variables = lb.checkpoint.nnx_to_linen(port, nn.Dense(2), x)
    >>> bool((nn.Dense(2).apply(variables, x) == port(x)).all())
    True
  """
  if not isinstance(copy, bool):
    raise TypeError(
      f"lb.checkpoint.nnx_to_linen: copy= must be True or False, got {copy!r}. Fix: copy=True "
      "(the default: the Linen variables get arrays of their own) or copy=False (share the "
      "port's arrays)."
    )
  targets = nnx_variables(port)
  check_precision(precision, "lb.checkpoint", CheckpointError)
  with check_context(precision):
    pairs, stored = _plan(
      linen_module,
      port,
      sample_args,
      mapping,
      rules,
      lambda _: {k: _compat.variable_value(v) for k, v in targets.items()},
      False,
      sample_kwargs,
      method,
      precision=precision,
      probes=probes,
    )
  values = pairs.values
  for key, abstract in stored.items():
    if key not in values:
      raise CheckpointError(f"nnx_to_linen: nothing converts into `{'/'.join(key)}`.")
    if np.shape(values[key]) != abstract.shape:
      raise CheckpointError(
        f"nnx_to_linen: `{'/'.join(key)}` would be {describe_value(values[key])} but the "
        f"Linen module creates {abstract.dtype}{list(abstract.shape)}. Build the Linen "
        "module with the port's widths and depth."
      )
  variables = unflatten({k: _own_array(v) if copy else v for k, v in values.items()})
  if optimizer is None:
    return variables
  port_params = {k: v for k, v in targets.items() if k[0] == "params"}
  opt_state = opt_to_linen(pairs, pairs.axes, optimizer, port_params, stored)
  return variables, jax.tree.map(_own_array, opt_state) if copy else opt_state


def _own_array(value: tp.Any) -> tp.Any:
  """A copy of a JAX array (same sharding), so no later donation of the port can delete it."""
  return jnp.array(value, copy=True) if isinstance(value, jax.Array) else value
