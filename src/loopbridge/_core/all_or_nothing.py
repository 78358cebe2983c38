"""`lb.lazy_init` either succeeds or leaves the model exactly as it was.

Not everything can be validated before the model runs: which capacity keys match which sites
is known only from the call. A failure after the call (a capacity key matching no site) would
otherwise leave Linen's init done and the rng streams advanced, so a corrected retry would
initialize other parameters than a first correct call. The entry is therefore wrapped: every
Variable's value and every module's attributes are remembered (references only, nothing is
copied) and put back when it raises.
"""

from __future__ import annotations

import functools
import typing as tp
import warnings

from flax import nnx

from .. import _compat
from . import linen_vars
from .bridge_settings import is_bridge
from .call_target import root_of
from .errors import ParamsReinitializedWarning

_REINITIALIZED = (
  "lb.lazy_init re-initialized the parameters of {parts}, which already held parameters (from "
  "an earlier lazy_init, or loaded): they were replaced by fresh random values. Why: lazy_init "
  "runs Linen's init. Fix: to declare buffers for a new capacity or call signature and keep "
  "the parameters, use lb.preallocate(model, *args, capacity=...) instead."
)

_Snapshot = tuple[list[tuple[nnx.Variable, object]], list[tuple[nnx.Module, dict[str, object]]]]
Entry = tp.TypeVar("Entry", bound=tp.Callable[..., object])


def _snapshot(root: nnx.Module) -> _Snapshot:
  """Every Variable's value and every module's attributes (references only, nothing copied)."""
  values, attributes = [], []
  for _, node in _compat.iter_graph(root):
    if isinstance(node, nnx.Variable):
      values.append((node, _compat.variable_value(node)))
    elif isinstance(node, nnx.Module):
      attributes.append((node, dict(vars(node))))
  return values, attributes


def _restore(snapshot: _Snapshot) -> None:
  """Put back what `_snapshot` saw: values (rng counters too), attributes; drop new attributes."""
  values, attributes = snapshot
  for variable, value in values:
    _compat.set_variable_value(variable, value)
  for node, before in attributes:
    for name in [k for k in vars(node) if not k.startswith(_compat.NNX_INTERNAL_PREFIXES)]:
      if name not in before:
        delattr(node, name)
      elif vars(node)[name] is not before[name]:
        vars(node)[name] = before[name]  # the very object it held, as it was accepted then


def _holding_params(root: nnx.Module) -> list[str]:
  """Labels of the lb.ToNNX parts of `root` that hold Linen params already."""
  found = []
  for path, node in _compat.iter_graph(root):
    if is_bridge(node) and linen_vars.linen_variables(node).get("params"):
      where = f" at '{'/'.join(map(str, path))}'" if path else ""
      found.append(f"lb.ToNNX({type(_compat.linen_module_of(node)).__name__}){where}")
  return found


def all_or_nothing(entry: Entry) -> Entry:
  """`entry` (lazy_init) leaves the model as it was when it fails, and warns when it succeeds
  in replacing parameters the model held."""

  @functools.wraps(entry)
  def run(model: object, *args: object, **kwargs: object) -> object:
    root = root_of(model)
    if root is None:  # entry raises the clear error
      return entry(model, *args, **kwargs)
    snapshot, held = _snapshot(root), _holding_params(root)
    try:
      result = entry(model, *args, **kwargs)
    except BaseException:
      _restore(snapshot)
      raise
    if held:
      warnings.warn(
        _REINITIALIZED.format(parts=", ".join(held)), ParamsReinitializedWarning, stacklevel=2
      )
    return result

  return tp.cast(Entry, run)
