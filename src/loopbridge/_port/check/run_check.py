"""The check that is part of drafting: build the port, convert the Linen variables, compare.

The drafted source runs as a fresh module (its lines registered with `linecache`, so a
traceback shows them); the Linen variables (the user's, or one fresh `init`) go in with
`lb.checkpoint.linen_to_nnx`; `lb.compare` then runs both models on the sample call and on
every extra call. A divergence is reported with the call, the module path and the drafted
line that built that module.
"""

from __future__ import annotations

import itertools
import linecache
import sys
import types
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict

from ... import _compat
from ..._checkpoint.convert import linen_to_nnx
from ..._core.errors import CheckpointError
from ..._diagnostics.compare import compare
from ..._diagnostics.compare_tolerance import HIGHEST
from ..records import Call, Check
from ..trace.trace import rng_streams

_COUNTER = itertools.count()


def exec_source(source: str, filename: str, name: str) -> types.ModuleType:
  """Run `source` as a fresh module named `name` whose tracebacks show the drafted lines."""
  module = types.ModuleType(name)
  module.__file__ = filename
  linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
  sys.modules[name] = module
  exec(compile(source, filename, "exec"), module.__dict__)
  return module


def unique_name(root: str) -> str:
  return f"loopbridge_port_draft_{next(_COUNTER)}_{root}"


def _method_port(port: nnx.Module, method: str | None) -> nnx.Module:
  """The port whose `__call__` runs `method` (the Linen side receives `method=` from compare)."""
  cls = type(port)

  def __call__(self, *args, method: str | None = None, **kwargs):
    return getattr(cls, method or "__call__")(self, *args, **kwargs)

  view = nnx.clone(port)
  view.__class__ = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__})
  return view


def drafted_line(source: str, path: str) -> int | None:
  """The drafted line that builds the module at `path` (its last named attribute)."""
  names = [p for p in path.replace("[", "/").replace("]", "").split("/") if p and not p.isdigit()]
  for name in reversed(names):
    for i, line in enumerate(source.splitlines(), 1):
      if line.strip().startswith((f"self.{name} =", f"self.{name}:")):
        return i
  return None


def run_check(
  linen_module: nn.Module,
  variables: tp.Mapping[str, object],
  port: nnx.Module,
  calls: tp.Sequence[Call],
  source: str,
  unpaired: tp.Sequence[str] = (),
  precision: str = HIGHEST,
) -> Check:
  """Compare `port` (already holding the converted variables) with Linen on every call."""
  reports = []
  for call in calls:
    kwargs: dict[str, tp.Any] = dict(call.kwargs)
    candidate = port
    if call.method is not None:
      kwargs["method"] = call.method
      candidate = _method_port(port, call.method)
    try:
      mapping = dict.fromkeys(unpaired) or None
      report = compare(
        (linen_module, variables),
        candidate,
        *call.args,
        mapping=mapping,
        precision=tp.cast(tp.Any, precision),
        **kwargs,
      )
    except Exception as e:
      return Check(False, tuple(reports), None, f"{call.label()}: {type(e).__name__}: {e}")
    reports.append(report)
    if not report.ok:
      div = report.first_divergence
      where = "" if div is None else (div.candidate_path or "(the top level)")
      line = drafted_line(source, where) if div is not None else None
      at = f", drafted line {line}" if line else ""
      return Check(False, tuple(reports), f"{call.label()}: {where}{at}", None)
  return Check(True, tuple(reports), None, None)


def _linen_path(path: tuple[object, ...]) -> tuple[str, ...]:
  """An NNX path as Linen names it: a list's `layers/0` is Linen's `layers_0`."""
  out: list[str] = []
  for part in path:
    if isinstance(part, int) and out:
      out[-1] = f"{out[-1]}_{part}"
    else:
      out.append(str(part))
  return tuple(out)


def _caches(port: nnx.Module) -> dict[tuple[str, ...], nnx.Variable]:
  return {
    _linen_path(tuple(path)): node
    for path, node in _compat.iter_graph(port)
    if isinstance(node, nnx.Cache)
  }


def convert(
  linen_module: nn.Module,
  variables: tp.Mapping[str, object],
  port: nnx.Module,
  call: Call,
  precision: str = HIGHEST,
  mapping: tp.Mapping[str, str] | None = None,
) -> None:
  """Fill `port` with the Linen variables, pairing by the sample call (and `mapping`).

  A decode cache sized by an `init` on the full length (as decoding code does) is not what the
  sample call's `init` makes: the rest is converted with a cache of the sample's size, then the
  user's cache goes into the port's cache variables by path (the draft names them as Linen).
  """
  kwargs = dict(call.kwargs)
  given: dict[tp.Any, tp.Any] = flatten_dict(
    dict(tp.cast(tp.Mapping[str, tp.Any], variables.get("cache", {})))
  )
  sample = jax.eval_shape(
    lambda: nn.Module.init(linen_module, rng_streams(()), *call.args, method=call.method, **kwargs)
  )
  sized: dict[tp.Any, tp.Any] = flatten_dict(dict(sample.get("cache", {})))
  if not given or {k: v.shape for k, v in sized.items()} == {
    k: np.shape(v) for k, v in given.items()
  }:
    linen_to_nnx(
      linen_module,
      variables,
      port,
      *call.args,
      method=call.method,
      sample_kwargs=kwargs,
      precision=tp.cast(tp.Any, precision),
      mapping=mapping,
    )
    return
  caches = _caches(port)
  missing = [k for k in given if k not in caches]
  if missing:
    raise CheckpointError(
      f"the cache variables {['/'.join(k) for k in missing[:5]]} have no counterpart in the "
      "port by path; convert them by hand."
    )
  for key, value in sized.items():  # the sample's cache, for the pairing of everything else
    _compat.set_variable_value(caches[key], jnp.zeros(value.shape, value.dtype))
  stand_in = {
    **variables,
    "cache": unflatten_dict({k: jnp.zeros(v.shape, v.dtype) for k, v in sized.items()}),
  }
  linen_to_nnx(
    linen_module,
    stand_in,
    port,
    *call.args,
    method=call.method,
    sample_kwargs=kwargs,
    precision=tp.cast(tp.Any, precision),
  )
  for key, value in given.items():  # the port's own copy, as linen_to_nnx gives it
    _compat.set_variable_value(caches[key], jnp.array(value, copy=True))
