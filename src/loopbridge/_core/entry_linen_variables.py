"""The entry `from_linen_variables`: declare an `lb.ToNNX` around Linen variables that already
exist, checked by one abstract init (public as `lb.checkpoint.from_linen_variables`)."""

from __future__ import annotations

import typing as tp

import jax
from flax import nnx

from .. import _compat
from . import discovery_session, given_variables, linen_vars, observe_linen
from .bridge_settings import bridge_settings
from .call_target import LinenMethod
from .entry_common import declare_alone

Model = tp.TypeVar("Model")


def from_linen_variables(
  model: Model,
  variables: object,
  *args: tp.Any,
  method: LinenMethod = None,
  what: str = "lb.checkpoint.from_linen_variables",
  **kwargs: tp.Any,
) -> Model:
  """Declare a new `lb.ToNNX` around Linen variables that already exist, initializing nothing.

  The third entry beside `lazy_init` and `preallocate` (public as
  `lb.checkpoint.from_linen_variables`, which builds the wrapper). One abstract init (no
  FLOPs, the wrapper's rng streams untouched) shows what the module creates for these
  arguments: its variables check the given ones' structure, and what it sowed is set apart as
  records. The model is declared with no sites (so it counts as initialized);
  `lb.preallocate` adds the buffers with the capacity the user gives there.

  Args:
    model: a new `lb.ToNNX` (not initialized).
    variables: a Linen variables dict, e.g. `{'params': ..., 'batch_stats': ...}`.
    *args: sample inputs of the call the loop makes (shapes and dtypes only).
    method: the Linen method the loop calls, default `__call__`.
    what: the public name, for messages.
    **kwargs: keyword arguments of that call.

  Returns:
    `model`, holding `variables`.

  Raises:
    CheckpointError: `variables` is not a dict, or its paths/shapes/dtypes differ from what
      the module's `init` would create for these arguments.

  Examples:
    >>> import jax, jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> from loopbridge._core import pipeline
    >>> variables = nn.Dense(2).init(jax.random.key(0), jnp.ones((1, 3)))
    >>> model = pipeline.from_linen_variables(lb.ToNNX(nn.Dense(2)), variables, jnp.ones((1, 3)))
    >>> sorted(lb.linen_variables(model)["params"])
    ['bias', 'kernel']
  """
  node = tp.cast(nnx.bridge.ToNNX, model)
  module = _compat.linen_module_of(node)
  given = given_variables.plain_variables(variables, what)
  rng_source = _compat.rngs_of(node)
  rng_names = [n for n, _ in rng_source.items()] if isinstance(rng_source, nnx.Rngs) else []
  rng_keys = {name: jax.random.key(0) for name in {"params", *rng_names} if name != "default"}
  # mutable=True: init returns what it sowed too (intermediates included), set apart below.
  capture = bridge_settings(node).capture_intermediates
  with observe_linen.observe() as calls:
    expected = jax.eval_shape(
      lambda: module.init(
        rng_keys, *args, method=method, mutable=True, capture_intermediates=capture, **kwargs
      )
    )
  found = observe_linen.classify(expected, calls)
  expected = given_variables.without(expected, found.record_paths)
  # Collections linen.init returns but the user may have dropped (e.g. sown 'intermediates'
  # records) are not state; compare only collections that hold state.
  given = given_variables.without(given, found.record_paths)
  given = {col: tree for col, tree in given.items() if tree}
  given = given_variables.with_static_values(given, expected)
  given_variables.check_structure(given, expected, what, type(module).__name__)
  # The arrays are used as given (e.g. host-loaded): partitioning stays metadata, and the
  # standard NNX recipe (nnx.get_partition_spec + device_put) places them.
  with _compat.no_eager_sharding():
    linen_vars.set_variables(node, given)
  report = discovery_session.BridgeReport(node, type(module).__name__, [], found.dropped, {})
  declare_alone(node, report, args, kwargs)
  return model
