"""flax's `ToLinen` wrapper: where it keeps its NNX module's graphdef and the sows inside it."""

from __future__ import annotations

import contextlib
import functools
import typing as tp
import warnings

import jax
from flax import nnx
from flax.nnx.bridge import wrappers as _bridge_wrappers


@functools.cache
def tolinen_stores_graphdef() -> bool:
  """Whether `nnx.bridge.ToLinen` keeps its module's graphdef in an 'nnx' collection (flax 0.10).

  Such a wrapper rebuilds its module with `nnx.merge(stored graphdef, state)` and makes the
  Variables itself; flax 0.11 and later keep no graphdef and `nnx.update` a fresh module with
  the Linen variables. Read from one tiny init, once (flax 0.12.0 and 0.11 lack
  `Variable.get_value` yet behave like 0.12.8 here, so no other feature tells them apart).
  """
  wrapper = _bridge_wrappers.ToLinen(nnx.Linear, args=(1, 1))
  variables = wrapper.init(jax.random.key(0), jax.numpy.ones((1, 1)))
  return "nnx" in variables


def nnx_sow_input(value: object, variable_type: object) -> object:
  """An NNX module's accumulator as `nnx.bridge.ToLinen` must be given it to reduce into.

  flax 0.11+'s wrapper `nnx.update`s a fresh module with the Linen variables: a raw array
  becomes a plain attribute, which `Module.sow` refuses ("Expected 'tot' to be a Variable"), so
  it gets a Variable of the sow's type. flax 0.10's makes the Variables itself (by collection).
  """
  if tolinen_stores_graphdef():  # flax 0.10
    return value
  if isinstance(variable_type, str):
    from flax.nnx import variablelib

    variable_type = variablelib.variable_type_from_name(variable_type, allow_register=True)
  return tp.cast(tp.Callable[[object], nnx.Variable], variable_type)(value)


def tolinen_graphdef_with(
  graphdef: object,
  variables: tp.Mapping[str, object],
  added: tp.Mapping[tuple[str, ...], tuple[str, object]],
) -> object:
  """flax 0.10 `nnx.bridge.ToLinen`'s stored graphdef, grown by NNX Variables its module
  creates in apply (the accumulators of custom-reduce sows), so they can be given back.

  0.10's wrapper rebuilds its NNX module with `nnx.merge(stored graphdef, state)`, which refuses
  a key the graphdef lacks ("Unknown keys"). The module is rebuilt here as the wrapper does it
  (public NNX API), given the new Variables, and split again: records stay out of it.
  `variables`: the wrapper's Linen variables (collection -> its subtree, 'nnx' left out);
  `added`: path inside the NNX module -> (collection, value). flax 0.12's wrapper keeps no
  graphdef: `graphdef` is returned as it is there.
  """
  if not tolinen_stores_graphdef() or not added:  # flax 0.11 and later
    return graphdef
  from flax.core import meta
  from flax.nnx.bridge import variables as bridge_variables
  from flax.nnx.statelib import State

  states = jax.tree_util.tree_map_with_path(
    lambda kp, x: bridge_variables.to_nnx_var(bridge_variables.get_col_name(kp), x).to_state(),
    dict(variables),
    is_leaf=lambda x: isinstance(x, meta.AxisMetadata),
  )
  state = State.merge(*(State(v) for v in states.values())) if states else State({})
  module = nnx.merge(tp.cast(tp.Any, graphdef), state)
  for path, (collection, value) in added.items():
    owner = module
    for key in path[:-1]:
      owner = getattr(owner, key)
    setattr(owner, path[-1], bridge_variables.to_nnx_var(collection, value))
  return nnx.split(module)[0]


@contextlib.contextmanager
def quiet_nnx_accumulators(active: bool) -> tp.Iterator[None]:
  """Silence flax 0.12 ToLinen's "Found unknown module paths in incoming state" warning, for one
  call that gives an NNX module its accumulators back (`nnx_sow_input`): they are unknown to
  the freshly built module until its `sow` reduces into them, which is the point."""
  if not active:
    yield
    return
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Found unknown module paths in incoming state")
    yield
