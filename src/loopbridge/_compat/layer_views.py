"""One layer's view of a stacked Variable (the Variable kinds and the index link each flax
version keeps)."""

from __future__ import annotations

import typing as tp

import jax
from flax import nnx

from .variables import variable_value

# --- layer views (lb.layers.layer) ----------------------------------------------------------
# A layer view is a Variable of the stacked Variable's own type whose value reads and writes
# `parent[index]` (leading layer axis). flax 0.12 routes every read/write through
# `get_value(index=)` / `set_value(index=)` (and deprecates Variable hooks in favor of
# overriding those two); flax 0.10 routes them through the `.value` property. Both keep the
# link in two slots, so the link is not Variable metadata and never reaches a graphdef.
_VIEW_TYPES: dict[type, type] = {}


_NO_INDEX = object()


def _view_link(variable: tp.Any) -> tuple[tp.Any, tp.Any] | None:
  try:
    return (
      object.__getattribute__(variable, "_loopbridge_parent"),
      object.__getattribute__(variable, "_loopbridge_index"),
    )
  except AttributeError:  # crossed a transform boundary (re-created from its pytree): a copy
    return None


def _take(leaf: tp.Any, index: tp.Any) -> tp.Any:
  return jax.lax.dynamic_index_in_dim(leaf, index, 0, keepdims=False)


def _put(leaf: tp.Any, index: tp.Any, value: tp.Any) -> tp.Any:
  return jax.lax.dynamic_update_index_in_dim(leaf, jax.numpy.asarray(value, leaf.dtype), index, 0)


def _view_type(var_type: type) -> type:
  if var_type in _VIEW_TYPES:
    return _VIEW_TYPES[var_type]
  if hasattr(nnx.Variable, "get_value"):  # flax 0.12

    def get_value(self, *, index=_NO_INDEX):
      link = _view_link(self)
      if link is None:
        if index is _NO_INDEX:
          return var_type.get_value(self)
        return var_type.get_value(self, index=index)
      parent, i = link
      value = jax.tree.map(lambda leaf: _take(leaf, i), parent.get_value())
      return value if index is _NO_INDEX or index is Ellipsis else value[index]

    def set_value(self, value, *, index=_NO_INDEX):
      link = _view_link(self)
      if link is not None and index is not _NO_INDEX and index is not Ellipsis:
        value = self.get_value().at[index].set(value)
      if link is not None:
        parent, i = link
        parent.set_value(
          jax.tree.map(lambda full, new: _put(full, i, new), parent.get_value(), value)
        )
      self.set_raw_value(value)  # keep the snapshot (shape, dtype, pytree leaves) current

    namespace = {
      "__slots__": ("_loopbridge_parent", "_loopbridge_index"),
      "get_value": get_value,
      "set_value": set_value,
    }
  else:  # flax 0.10

    def _get(self):
      link = _view_link(self)
      if link is None:
        return var_type.value.fget(self)
      parent, i = link
      return jax.tree.map(lambda leaf: _take(leaf, i), parent.value)

    def _set(self, value):
      link = _view_link(self)
      if link is not None:
        parent, i = link
        parent.value = jax.tree.map(lambda full, new: _put(full, i, new), parent.value, value)
      var_type.value.fset(self, value)

    namespace = {
      "__slots__": ("_loopbridge_parent", "_loopbridge_index"),
      "value": property(_get, _set),
    }
  namespace["__module__"] = __name__
  namespace["__doc__"] = (
    f"A view of one layer of a stacked `{var_type.__name__}` (lb.layers.layer)."
  )
  view_type = type(var_type.__name__, (var_type,), namespace)
  _VIEW_TYPES[var_type] = view_type
  return view_type


def layer_view_variable(
  parent: nnx.Variable, index: tp.Any, snapshot: nnx.Variable
) -> nnx.Variable:
  """A Variable of `type(parent)` reading and writing `parent`'s value at `index` on axis 0.

  `snapshot` is an ordinary Variable already holding that slice (e.g. from `nnx.merge`); its
  value and metadata seed the view. Versions differ only inside `_view_type` (see above).
  """
  view_type = _view_type(type(parent))
  metadata = dict(snapshot.get_metadata())
  if hasattr(nnx.Variable, "get_value"):  # flax 0.12: constructor options live in metadata
    view = view_type(variable_value(snapshot), **metadata)
  else:
    view = view_type(snapshot.raw_value, **metadata)
  object.__setattr__(view, "_loopbridge_parent", parent)
  object.__setattr__(view, "_loopbridge_index", index)
  return view


def is_layer_view(value: object) -> bool:
  """Whether `value` is a Variable of a layer view (`layer_view_variable`)."""
  return type(value) in _VIEW_TYPES.values()


def plain_variable(variable: nnx.Variable) -> nnx.Variable:
  """`variable` itself, or for a layer view (`layer_view_variable`) a Variable of the stacked
  type holding the layer's current value and metadata.

  flax's bridge finds a Variable's Linen collection by its exact type in a registry; a view's
  type is a subclass that is not (and must not be) registered: flax 0.12 refuses it, 0.10
  registers it under its class name and looks for the collection 'Param'.
  """
  view_type = type(variable)
  base = next((t for t, v in _VIEW_TYPES.items() if v is view_type), None)
  if base is None:
    return variable
  metadata = dict(variable.get_metadata())
  return base(variable_value(variable), **metadata)
