"""Reading and writing a Variable's value and metadata, raw values and typed PRNG keys, on every
supported flax (flax 0.11 and 0.12 renamed the value slot and the metadata access)."""

from __future__ import annotations

import functools
import operator
import typing as tp

import jax
from flax import nnx


def collection_name(variable_type: type) -> str:
  """Linen collection name of an NNX Variable type (the function moved between versions)."""
  from flax.nnx import variablelib

  if hasattr(variablelib, "variable_name_from_type"):  # 0.12
    return variablelib.variable_name_from_type(variable_type)
  from flax.nnx.bridge import variables as bridge_variables  # 0.10

  # 0.10 only: the newest flax (the one type-checked against) has no such function.
  name_of = bridge_variables.variable_type_name  # pyright: ignore[reportAttributeAccessIssue]
  return name_of(variable_type)


def register_variable_type_source(collection: str, type_name: str) -> str:
  """The source line that pairs a Linen collection with an NNX Variable type, for a drafted
  port run on this flax (flax 0.12's `nnx.register_variable_name`, 0.10's bridge function);
  `overwrite=True`: the port's module may run several times."""
  if hasattr(nnx, "register_variable_name"):
    return f"nnx.register_variable_name({collection!r}, {type_name}, overwrite=True)"
  return (
    f"nnx.bridge.variables.register_variable_name_type_pair({collection!r}, {type_name}, "
    "overwrite=True)"
  )


def variable_value(variable: nnx.Variable) -> tp.Any:
  """The value inside a Variable.

  flax 0.12 deprecates `.value` for `get_value()`; 0.10 has only `.value`.
  """
  if hasattr(variable, "get_value"):
    return variable.get_value()
  return variable.value


def set_variable_value(variable: nnx.Variable, value: object) -> None:
  """Write a Variable's value in place, keeping the Variable object (loops need identity).

  0.12 deprecates assigning `.value` for `set_value()`; 0.10 has only `.value`.
  """
  if hasattr(variable, "set_value"):
    variable.set_value(value)
  else:
    variable.value = value


def set_variable_metadata(variable: nnx.Variable, name: str, value: object) -> None:
  """Change one metadata entry of a Variable in place.

  0.12 refuses attribute assignment for metadata (`set_metadata` only; 0.12.0 takes keyword
  arguments only, later releases also `(name, value)`); 0.10 has no `set_metadata` (a missing
  attribute is looked up on the value) and takes assignment.
  """
  if hasattr(type(variable), "set_metadata"):
    variable.set_metadata(**{name: value})
  else:
    setattr(variable, name, value)


def drop_variable_metadata(variable: nnx.Variable, name: str) -> None:
  """Remove one metadata entry of a Variable in place (a no-op when it has none).

  0.12 replaces the whole metadata with `set_metadata(dict)`; 0.11 has `get_metadata` but no
  `set_metadata` (attribute deletion removes an entry); 0.10 keeps metadata as instance
  attributes.
  """
  if hasattr(type(variable), "set_metadata"):
    metadata = dict(variable.get_metadata())
    if name in metadata:
      del metadata[name]
      variable.set_metadata(metadata)
    return
  held = variable.get_metadata() if hasattr(variable, "get_metadata") else vars(variable)
  if name in held:
    delattr(variable, name)


# flax 0.12 keeps the value in the slot `_raw_value` and checks the trace level in
# `__setattr__` (even under `set_raw_value(..., _unsafe_bypass_check=True)`); 0.10 keeps it in
# the instance attribute `raw_value` and checks in `_setattr`.
_RAW_SLOT = "_raw_value" if "_raw_value" in getattr(nnx.Variable, "__slots__", ()) else None


def get_raw_value(variable: nnx.Variable) -> tp.Any:
  """A Variable's stored value without hooks or copies (what `nnx.split` puts in the state).

  flax 0.12 has `get_raw_value()` (the `.raw_value` property warns); 0.10 has the attribute only.
  """
  if _RAW_SLOT is not None:
    return object.__getattribute__(variable, _RAW_SLOT)
  return variable.raw_value


def set_raw_value(variable: nnx.Variable, value: object, *, check: bool = True) -> None:
  """Store a value in a Variable without hooks or copies (what `nnx.update` does with a state).

  flax 0.12 has `set_raw_value()` (the `.raw_value` setter warns); 0.10 has the attribute only.
  Both check the trace level on every write (~10 µs on 0.12); `check=False` skips that, for
  callers that know they run outside any trace (concrete values).
  """
  if _RAW_SLOT is not None:
    if check:
      variable.set_raw_value(value)
    else:
      object.__setattr__(variable, _RAW_SLOT, value)
  elif check:
    variable.raw_value = value
  else:
    object.__setattr__(variable, "raw_value", value)


def raw_value_accessors() -> tuple[
  tp.Callable[[nnx.Variable], tp.Any], tp.Callable[[nnx.Variable, tp.Any], None]
]:
  """(get, set) of a Variable's stored value as C-level callables, for per-call hot paths.

  Same as `get_raw_value` / `set_raw_value(..., check=False)` without a Python frame per
  Variable: `lb.compile_step` moves every leaf of a model on each call, and on a tiny model
  those frames cost as much as jax's own dispatch. `set` skips the trace-level check, so it is
  only for concrete values. flax 0.12: the `_raw_value` slot's descriptor (the class's
  `__setattr__` checks traces); 0.10: the instance attribute `raw_value`.
  """
  if _RAW_SLOT is not None:
    slot = nnx.Variable.__dict__[_RAW_SLOT]  # a member descriptor: __get__/__set__ in C
    return operator.attrgetter(_RAW_SLOT), slot.__set__

  def set_value(variable: nnx.Variable, value: tp.Any) -> None:
    object.__setattr__(variable, "raw_value", value)

  return operator.attrgetter("raw_value"), set_value


@functools.cache
def key_data_accessors() -> (
  tuple[tp.Callable[[nnx.Variable], tp.Any], tp.Callable[[nnx.Variable], tp.Any]] | None
):
  """(key data, key impl) getters of a Variable holding a typed PRNG key array, C-level.

  jax flattens a typed key array argument through a Python callback on every call of a jitted
  function; its uint32 data goes through the C++ path. The attributes are jax internals that
  every supported jax has (0.5.3 to 0.10.2); None if they are gone (keys then go as they are).
  Probed on first use, not at import: making a key starts the JAX backend, after which
  `jax.config.update('jax_num_cpu_devices', ...)` is refused.
  """
  key = jax.random.key(0)
  if not (hasattr(key, "_base_array") and hasattr(key, "_impl")):
    return None
  name = _RAW_SLOT or "raw_value"
  return operator.attrgetter(f"{name}._base_array"), operator.attrgetter(f"{name}._impl")


def is_concrete_typed_key(value: object) -> bool:
  """A typed PRNG key array holding its data (not a tracer), as `key_data_accessors` reads."""
  dtype = getattr(value, "dtype", None)
  return (
    dtype is not None
    and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key)
    and hasattr(value, "_base_array")
  )


def state_leaf_type(leaf: object) -> type:
  """The Variable type of one leaf of an `nnx.State`.

  flax 0.10 State leaves are `VariableState` objects naming their type in `.type`; flax 0.12
  removed `VariableState` and State leaves are the Variables themselves.
  """
  if type(leaf).__name__ == "VariableState":
    return leaf.type  # pyright: ignore[reportAttributeAccessIssue]  # flax 0.10 only
  return type(leaf)
