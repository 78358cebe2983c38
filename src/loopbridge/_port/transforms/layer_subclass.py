"""A user subclass of a flax layer (HF OPT's `class ...Embedding(nn.Embed)` with its own setup).

Its port subclasses the layer's NNX counterpart, so the methods it inherits and calls
(`super().__call__`, `self.attend`) are NNX's; they read the attributes the port sets from the
inherited fields, which NNX's layer keeps under the same names. The counterpart's `__init__` is
not called: the subclass's own setup makes the layer's variables. A subclass whose `__call__`
replaces the layer's is a plain module (`own_call_subclass.py`); any other subclass of a flax
layer is one TODO for the class.
"""

from __future__ import annotations

import dataclasses
import types

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Subclassable:
  """A flax layer whose subclasses are drafted: its NNX name and its fields' defaults."""

  nnx_name: str
  defaults: dict[str, str]  # inherited field -> its default, written as the port's source


def _table() -> dict[type, Subclassable]:
  from flax import linen as nn

  embed = {
    "dtype": "None",
    "param_dtype": "jnp.float32",
    # Linen's and NNX's default (flax's `default_embed_init`).
    "embedding_init": 'nnx.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)',
    # NNX's own: nnx.Embed calls it with a tuple of arrays, Linen's with the arrays.
    "promote_dtype": "nnx.nn.dtypes.promote_dtype",
  }
  return {nn.Embed: Subclassable("Embed", embed)}


# Names the defaults above read, for the port's imports where the user's module lacks them.
NAMESPACE = {"jnp": jnp, "types": types}


def flax_layer_base(cls: type) -> type | None:
  """The flax layer `cls` subclasses (HF OPT's `class ...Embedding(nn.Embed)`), if any: its
  inherited fields, `super().__call__` and variables are that layer's."""
  from ..plan.standard_layers import is_linen_layer, lookup

  # Only a layer of the table (nn.Embed, nn.Dense, ...): abstract bases such as
  # nn.RNNCellBase hold no layer of their own.
  return next((b for b in cls.__mro__[1:] if is_linen_layer(b) and lookup(b) is not None), None)


def abstract_counterpart(base: object) -> str | None:
  """`nnx.RNNCellBase` for Linen's `nn.RNNCellBase`: a flax base class holding no layer or
  field of its own whose NNX namesake is an NNX module (the methods a subclass inherits are
  NNX's: `initialize_carry`'s NNX signature, `num_feature_axes`)."""
  from flax import linen as nn
  from flax import nnx

  if not (isinstance(base, type) and issubclass(base, nn.Module) and base is not nn.Module):
    return None
  if not base.__module__.startswith("flax.linen") or any(
    f.name not in ("parent", "name") for f in dataclasses.fields(base)
  ):
    return None
  counterpart = getattr(nnx, base.__name__, None)
  if isinstance(counterpart, type) and issubclass(counterpart, nnx.Module):
    return f"nnx.{base.__name__}"
  return None


def subclassable(base: type | None) -> Subclassable | None:
  return _table().get(base) if base is not None else None


def unsupported_reason(cls: type, base: type) -> str | None:
  """Why the subclass `cls` of the flax layer `base` is not drafted, or None when it is."""
  spec = subclassable(base)
  name = f"{base.__module__}.{base.__qualname__}"
  if spec is None:
    return None  # not a layer of the table: the caller's general reason
  if "setup" not in vars(cls):
    return (
      f"{cls.__qualname__} subclasses flax's own layer {name} without a setup of its own; the "
      f"draft ports a subclass whose setup makes the variables. Use nnx.{spec.nnx_name} with "
      "the same arguments (its Linen source is kept below)"
    )
  fields = [f for f in dataclasses.fields(base) if f.name not in ("parent", "name")]
  unknown = [
    f.name
    for f in fields
    if f.name not in spec.defaults
    and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
  ]
  if unknown:
    return (
      f"{cls.__qualname__} subclasses {name}, whose fields {unknown} the draft has no NNX "
      "default for; write it by hand (its Linen source is kept below)"
    )
  return None


def inherited_default(base: type | None, field: str) -> str | None:
  """The port's default (source) for a field a subclass inherits from the flax layer `base`."""
  spec = subclassable(base)
  return None if spec is None else spec.defaults.get(field)
