"""Existing Linen variables (from `linen.init`, a Linen checkpoint or a conversion) in a
recording model: `from_linen_variables` builds an `lb.ToNNX` around them, `load_linen_variables`
writes them into an initialized one in place."""

from __future__ import annotations

import typing as tp

import jax.numpy as jnp
from flax import linen

from .. import _compat
from .._core import linen_vars, pipeline, recorder
from .._core.call_target import LinenMethod
from .._core.errors import CheckpointError, NotDeclaredError
from .._core.given_variables import describe, flat_values, plain_variables, unboxed_leaves
from .._core.to_nnx import ToNNX

Model = tp.TypeVar("Model")


_NO_CAPACITY_HERE = (
  "lb.checkpoint.from_linen_variables takes no {name}=: it builds the model around existing "
  "variables, and buffers are declared where every other model declares them. Why: one "
  "place declares capacity, so a model is recorded the same way however it was built. Fix: "
  "model = lb.checkpoint.from_linen_variables(module, variables, *args), then "
  "lb.preallocate(model, *args, {name}=...)."
)


def from_linen_variables(
  module: linen.Module,
  variables: tp.Mapping[str, object],
  *args: tp.Any,
  rngs: _compat.RngsArg = None,
  method: LinenMethod = None,
  **kwargs: tp.Any,
) -> ToNNX:
  """Wrap a Linen module around variables that already exist, without initializing.

  The variables (from `linen.init`, a Linen checkpoint, or a converted model) become the
  model's Variables as `lb.lazy_init` would have created them (partitioning metadata kept);
  the sample arguments are only traced abstractly to check the structure. No initializer
  runs and no rng stream is consumed. The model comes back with no record buffers: when the
  module sows, declare them with `lb.preallocate(model, *args, capacity=...)`.

  Args:
    module: the Linen module the variables belong to.
    variables: a Linen variables dict, e.g. `{'params': ..., 'batch_stats': ...}`.
    *args: sample inputs of the call the loop makes (shapes and dtypes only).
    rngs: the model's rng streams for later calls (e.g. dropout), as for `lb.ToNNX`.
    method: the Linen method the loop calls, default `__call__`.
    **kwargs: keyword arguments of that call.

  Returns:
    An initialized `lb.ToNNX` holding `variables`.

  Raises:
    CheckpointError: `variables` is not a dict, or its paths/shapes/dtypes differ from what
      `module.init` would create for these arguments.
    TypeError: `capacity=` or `overflow=` given (declare them with `lb.preallocate`).

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return nn.Dense(2)(x)
    >>> variables = Net().init(jax.random.key(0), jnp.ones((1, 3)))
    >>> model = lb.checkpoint.from_linen_variables(Net(), variables, jnp.ones((1, 3)))
    >>> model = lb.preallocate(model, jnp.ones((1, 3)), capacity=4)
    >>> bool((model(jnp.ones((1, 3))) == Net().apply(variables, jnp.ones((1, 3)))).all())
    True
  """
  for name in ("capacity", "overflow"):
    if name in kwargs:
      raise TypeError(_NO_CAPACITY_HERE.format(name=name))
  return pipeline.from_linen_variables(
    ToNNX(module, rngs=rngs), variables, *args, method=method, **kwargs
  )


def load_linen_variables(
  model: Model, variables: tp.Mapping[str, object], *, copy: bool = True
) -> Model:
  """Write a Linen variables dict into an initialized `lb.ToNNX`, in place.

  Use it to load Linen weights (e.g. a Linen checkpoint) into a model already declared with
  `lb.lazy_init`; buffers, counts and rng streams are left as they are. The model gets its
  own copy of each array by default, so a donating call of the model
  (`nnx.jit(..., donate_argnums=0)`, `lb.compile_step`) never deletes the caller's
  `variables`, which stay usable with plain Linen (as `lb.lazy_init` copies a sample array
  that init stored as it was).

  Args:
    model: an initialized `lb.ToNNX`.
    variables: a Linen variables dict with the model's structure (a subset of collections is
      fine, e.g. only `{'params': ...}`).
    copy: `False` moves the arrays instead, when memory is tight: the model holds the very
      arrays given (no second copy on the device), so a donating call deletes them; use
      `variables` no more after that.

  Returns:
    `model` (same Variables, new values).

  Raises:
    NotDeclaredError: `model` was not initialized.
    CheckpointError: a path the model does not have, or a different shape/dtype.
    TypeError: `copy` is not a bool.

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> model = lb.lazy_init(lb.ToNNX(nn.Dense(2), rngs=nnx.Rngs(0)), jnp.ones((1, 3)))
    >>> variables = nn.Dense(2).init(jax.random.key(7), jnp.ones((1, 3)))
    >>> out = lb.checkpoint.load_linen_variables(model, variables)(jnp.ones((1, 3)))
    >>> bool((out == nn.Dense(2).apply(variables, jnp.ones((1, 3)))).all())
    True
  """
  if not isinstance(model, ToNNX) or recorder.sites_of(model) is None:
    raise NotDeclaredError(
      "lb.checkpoint.load_linen_variables needs an lb.ToNNX after lb.lazy_init (it writes into the "
      "existing Variables). Fix: lb.lazy_init(model, *sample_args, capacity=...) first, or "
      "build the model directly with lb.checkpoint.from_linen_variables(module, variables, *args)."
    )
  if not isinstance(copy, bool):
    raise TypeError(
      f"lb.checkpoint.load_linen_variables: copy= must be True or False, got {copy!r}. Fix: "
      "copy=True (the default: the model gets its own arrays) or copy=False (move them)."
    )
  variables = plain_variables(variables, "lb.checkpoint.load_linen_variables")
  attrs = linen_vars.attrs(model)
  current = linen_vars.to_linen(attrs)
  have, want = unboxed_leaves(variables), unboxed_leaves(current)
  unknown = sorted(set(have) - set(want))
  differ = sorted(k for k in set(have) & set(want) if have[k] != want[k])
  if unknown or differ:
    detail = "; ".join(
      [
        f"{'/'.join(k)} given {describe(*have[k])} vs model {describe(*want[k])}"
        for k in differ[:8]
      ]
      + ([("not in the model: " + ", ".join("/".join(k) for k in unknown[:8]))] if unknown else [])
    )
    raise CheckpointError(
      f"lb.checkpoint.load_linen_variables: the variables do not fit the model: {detail}. "
      "Why: values "
      "are written into the existing Variables, which keep their shapes for NNX loops. Fix: "
      "initialize the model with sample arguments of the shapes the variables were made "
      "for, or build it with lb.checkpoint.from_linen_variables(module, variables, *args)."
    )
  for path, value in flat_values(variables).items():
    value = linen_vars.unbox(value, constrain=False)
    if isinstance(value, tuple) or not linen_vars.is_data(value):
      continue  # records, and static values the model already holds (a graphdef)
    # jnp.array copies even a jax.Array; jnp.asarray keeps it (a host array is put on the
    # device either way).
    value = jnp.array(value, copy=True) if copy else jnp.asarray(value)
    _compat.set_variable_value(recorder.get_nested(attrs, path[1:]), value)
  return model
