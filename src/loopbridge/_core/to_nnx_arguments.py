"""An `lb.ToNNX`'s arguments checked and combined: constructor options refused early, a
`method=` name checked, Linen's `mutable=` filter merged with the recorded collections, and the
rng count Variables a call advances."""

from __future__ import annotations

import typing as tp

import jax
from flax import linen, nnx
from flax.core import scope as flax_scope

from .. import _compat
from .call_target import LinenMethod

# Linen's `mutable=`: which collections a call may change (None: the enclosing module's choice).
MutableFilter = (
  bool | str | tp.Collection[str] | flax_scope.DenyList | tp.Callable[[str], bool] | None
)


def _merge_mutable(user_mutable: MutableFilter, record_cols: tp.Collection[str]) -> MutableFilter:
  """The Linen `mutable=` filter for apply: the user's choice plus every recorded collection."""
  if user_mutable is True or not record_cols:
    return user_mutable if user_mutable is not None else False
  if user_mutable in (None, False):
    return sorted(record_cols)
  if isinstance(user_mutable, str):
    return sorted({user_mutable, *record_cols})
  if isinstance(user_mutable, flax_scope.DenyList):
    # Linen names the denied collections by one str or a collection of them.
    deny = user_mutable.deny
    deny = {deny} if isinstance(deny, str) else set(tp.cast(tp.Collection[str], deny))
    return flax_scope.DenyList(tuple(sorted(deny - set(record_cols))))
  if isinstance(user_mutable, (list, tuple, set, frozenset)):
    return sorted({*user_mutable, *record_cols})
  # A callable filter: Linen filters are `str | Sequence | bool | DenyList | callable`.
  user_filter = tp.cast(tp.Callable[[str], bool], user_mutable)
  return lambda col: col in record_cols or user_filter(col)


def _check_rngs_and_capture(rngs: object, capture: object) -> None:
  """Refuse constructor options that would fail only later, inside Linen, with a raw error."""
  if rngs is not None and not isinstance(rngs, (nnx.Rngs, jax.Array)):
    raise TypeError(
      f"lb.ToNNX: rngs= must be an nnx.Rngs (or None for a module without randomness), got "
      f"{type(rngs).__name__}. Why: the wrapper draws Linen's 'params', 'dropout', ... keys "
      f"from its streams. Fix: rngs=nnx.Rngs({rngs if isinstance(rngs, int) else 0})."
    )
  if not (isinstance(capture, bool) or callable(capture)):
    raise TypeError(
      f"lb.ToNNX: capture_intermediates= must be True, False or a filter function "
      f"(module, method_name) -> bool, as for Linen's apply, got {capture!r}. Fix: e.g. "
      "capture_intermediates=True, or lambda mdl, name: name == '__call__'."
    )


def _rng_counts(rngs: _compat.RngsArg) -> list[nnx.Variable | None]:
  """The count Variables a call advances when it draws from the wrapper's own streams."""
  if rngs is None or isinstance(rngs, jax.Array):
    return []
  return [getattr(stream, "count", None) for _, stream in rngs.items()]


def _creates_params(mutable: MutableFilter) -> bool:
  """Whether a Linen `mutable=` filter lets a call create parameters (`params` mutable)."""
  if mutable in (None, False):
    return False
  # Linen's own filter test takes callables too (its type says less).
  return bool(flax_scope.in_filter(tp.cast(flax_scope.CollectionFilter, mutable), "params"))


def _check_method(module: linen.Module, method: LinenMethod) -> None:
  """A `method=` name must name a method of the Linen module (Linen's own error says less)."""
  if not isinstance(method, str) or callable(getattr(type(module), method, None)):
    return
  methods = sorted(
    n
    for n, v in vars(type(module)).items()
    if callable(v) and (not n.startswith("_") or n == "__call__") and n != "setup"
  )
  raise AttributeError(
    f"method={method!r} is not a method of the Linen module {type(module).__name__} "
    f"(its methods: {', '.join(methods) or 'none'}). Why: lb.ToNNX calls the Linen module "
    "with module.apply(..., method=...), which needs a method defined on its class. Fix: "
    "pass one of those names, or the function itself (e.g. method=MyModule.decode)."
  )
