"""The check that tells a port of the class from a port of one instance.

The sample call alone passes a port that bakes the sample's numbers. After it, the port is
compared with Linen's own `apply` on calls the library makes: the sample's inputs with random
values of the same dtypes (integers within the sample's range, so token ids stay in the
vocabulary), the same at another batch size where the Linen model runs with it, and the sample
call at a derived configuration (`configs.py`), where a fresh Linen `init` is converted into a
port built with that configuration's arguments.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from ..._core.errors import CheckpointError
from ..records import Call, Check
from ..trace.trace import rng_streams
from ..transforms.cache_idiom import size_caches
from .run_check import convert, run_check


def _random_like(value: object, key: jax.Array, batch: int | None) -> object:
  """An array of the sample's dtype (and shape, with axis 0 set to `batch`), random values."""
  if not isinstance(value, (jax.Array, np.ndarray)) or value.ndim == 0:
    return value
  shape = tuple(value.shape)
  if batch is not None:
    shape = (batch, *shape[1:])
  dtype = value.dtype
  if jnp.issubdtype(dtype, jnp.floating):
    return jax.random.normal(key, shape, dtype)
  if jnp.issubdtype(dtype, jnp.integer):
    low, high = int(np.min(value)), int(np.max(value))
    return jax.random.randint(key, shape, low, high + 1, dtype)
  if dtype == jnp.bool_:
    return jax.random.bernoulli(key, 0.5, shape)
  return value


def _batch(call: Call) -> int | None:
  sizes = {
    int(a.shape[0])
    for a in (*call.args, *call.kwargs.values())
    if isinstance(a, (jax.Array, np.ndarray)) and a.ndim
  }
  return sizes.pop() if len(sizes) == 1 else None


def _resized(call: Call, batch: int | None, seed: int) -> Call | None:
  """The call with random inputs (at batch size `batch`, None: the sample's), or None when
  the sample's arrays do not share one batch size to change."""
  old = _batch(call)
  if batch is not None and old is None:
    return None
  keys = iter(jax.random.split(jax.random.key(seed), len(call.args) + len(call.kwargs)))

  def one(a: object) -> object:
    size = (
      batch if isinstance(a, (jax.Array, np.ndarray)) and a.ndim and a.shape[0] == old else None
    )
    return _random_like(a, next(keys), size)

  args = [one(a) for a in call.args]
  kwargs = {k: one(v) for k, v in call.kwargs.items()}
  return Call(*args, method=call.method, **kwargs)


def _runs_in_linen(module: nn.Module, variables: tp.Mapping[str, object], call: Call) -> bool:
  mutable = [c for c in variables if c != "params"] or False
  try:
    jax.eval_shape(
      lambda: nn.Module.apply(
        module,
        tp.cast(tp.Any, variables),
        *call.args,
        method=call.method,
        mutable=mutable,
        rngs=rng_streams(()),
        **call.kwargs,
      )
    )
  except Exception:  # a shape the model does not take is not checked
    return False
  return True


def random_calls(
  module: nn.Module, variables: tp.Mapping[str, object], sample: Call
) -> tuple[Call, ...]:
  """Random-valued inputs shaped as the sample, and at the sample's batch size + 1 (each kept
  where Linen runs with it)."""
  out = []
  batch = _batch(sample)
  for size, seed in ((None, 11), (None if batch is None else batch + 1, 12)):
    if seed == 12 and size is None:
      continue
    call = _resized(sample, size, seed)
    if call is not None and _runs_in_linen(module, variables, call):
      out.append(call)
  return tuple(out)


def at_config(
  linen_module: nn.Module,
  port: nnx.Module,
  sample: Call,
  source: str,
  unpaired: tp.Sequence[str],
  precision: str,
) -> Check:
  """The port built at a derived configuration against Linen there, on the sample call."""
  variables = nn.Module.init(
    linen_module, rng_streams(()), *sample.args, method=sample.method, **sample.kwargs
  )
  size_caches(port, variables, (linen_module, sample))
  try:
    convert(linen_module, variables, port, sample, precision)
  except CheckpointError as e:
    # More equal-shaped layers than the converter tries to pair (a count a distinct-valued
    # configuration raised): paired in call order, which the comparison below checks.
    mapping = getattr(e, "call_order_mapping", None)
    if mapping is None:
      raise
    convert(linen_module, variables, port, sample, precision, mapping)
  return run_check(linen_module, variables, port, (sample,), source, unpaired, precision)


def checked_at(
  result: tp.Any, module: nn.Module, build: tp.Callable[[], nnx.Module], call: Call
) -> Check:
  """The port `build` makes against `module` on `call`; a port that does not build or convert
  is the check's verdict, not an exception."""
  try:
    port = build()
    return at_config(module, port, call, result.source, result.unpaired, result.check_precision)
  except Exception as e:  # reported as the check's verdict
    return build_failed(e)


def inits_in_linen(module: nn.Module, call: Call) -> bool:
  """Whether Linen's `init` of `module` runs on `call` (shapes only)."""
  try:
    jax.eval_shape(
      lambda: nn.Module.init(module, rng_streams(()), *call.args, method=call.method, **call.kwargs)
    )
  except Exception:  # a size the model does not take
    return False
  return True


def merged(first: Check, more: Check, where: str) -> Check:
  """The verdict of both checks (`where` says which inputs or configuration the second ran)."""
  reports = (*first.reports, *more.reports)
  if not first.equal:
    return first
  checked = (*first.checked, where)
  if more.error is not None:
    return Check(False, reports, None, f"{where}: {more.error}", checked)
  if not more.equal:
    return Check(False, reports, f"{where}: {more.first_divergence}", None, checked)
  return Check(True, reports, None, None, checked)


def check_class(result: tp.Any, first: Check, port: nnx.Module, variables: tp.Any) -> Check:
  """After the sample call's check (`first`): random inputs, another batch size, and the
  first other configuration the draft traced."""
  if not first.equal:
    return first
  sample = result.calls[0]
  verdict = first
  extra = random_calls(result.linen_module, variables, sample)
  if extra:
    more = run_check(
      result.linen_module,
      variables,
      port,
      extra,
      result.source,
      result.unpaired,
      result.check_precision,
    )
    verdict = merged(verdict, more, "random inputs shaped as the sample")
  labels = result.config_labels or ("",) * len(result.configs)
  checked = [0, *_branch_checks(labels)] if result.configs else []
  if not getattr(result, "literals", ()):
    # Every width read from the symbolic trace, an expression of the settings at any of
    # them: the distinct-valued configurations are evidence the widths were read from (their
    # traces), not checks to run; with a width matched by value, each of them is checked
    # (`tracing/distinct.py`), as only there a wrong match shows.
    checked = [k for k in checked if not labels[k].startswith("every setting distinct")]
  for k in checked:
    if not verdict.equal:
      break
    other, _ = result.configs[k]
    described = labels[k] or _describe(result.linen_module, other)
    where = f"another configuration ({described})"
    more = checked_at(result, other, lambda k=k: result.build(config=k + 1), sample)
    verdict = merged(verdict, more, where)
  return _at_other_input_size(result, verdict)


def _branch_checks(labels: tp.Sequence[str]) -> list[int]:
  """The configurations to check besides the first scaled one: per branch configuration
  (`branch_configs.py`), its first scaled variant (which also tests the widths of the classes
  only the branch builds), or the branch at the user's numbers where that did not build."""
  out: list[int] = []
  for k, label in enumerate(labels):
    if label and not label.endswith("scaled") and "scaled (" not in label:
      scaled = next((j for j, other in enumerate(labels) if other == f"{label}, scaled"), None)
      out.append(k if scaled is None else scaled)
  return out


def other_input_size(result: tp.Any) -> tuple[Call, dict[str, int], str] | None:
  """The sample call at other input sizes, the root's size arguments there (`x_features`), and
  what changed; None when nothing changes or Linen does not run at those sizes.

  Changed: each input axis the root takes as an argument, and the last axis of each float
  array (a feature width, which a Linen layer infers from the input: a port that wrote the
  sample's number is wrong there), each to a size no setting and no other axis of the sample
  has. Where Linen refuses that, the arguments' axes alone.
  """
  from ..records import PortOf

  sizes: dict[str, tp.Any] = getattr(result, "input_sizes", {})
  sample: Call = result.calls[0]
  if any(isinstance(v, PortOf) for v in result.init_kwargs.values()):
    # A port handed in (`lb.port.PortOf`) is built with its own instance's input widths,
    # which another input size changes and the draft cannot say: not checked.
    return None
  arrays = call_arrays(sample)
  if any(where not in arrays or axis >= arrays[where].ndim for where, axis in sizes.values()):
    return None
  taken = int_settings(result.linen_module) | {int(d) for a in arrays.values() for d in a.shape}

  def free(size: int, step: int) -> int:
    """The first size after `size`, counting by `step`, that nothing in the sample has."""
    new = size + step
    while new in taken:
      new += step
    taken.add(new)
    return new

  by_argument = {(where, axis) for where, axis in sizes.values()}
  features = {
    (where, a.ndim - 1)
    for where, a in arrays.items()
    if a.ndim >= 2 and jnp.issubdtype(a.dtype, jnp.floating)
  }
  # The next free size, else the next free multiple (a width that heads must divide).
  tries = [
    (axes, step)
    for axes in (by_argument | features, by_argument)
    for step in ("one", "multiple")
    if axes
  ]
  for axes, step in tries:
    old = {int(arrays[w].shape[ax]) for w, ax in axes}
    renamed = {size: free(size, 1 if step == "one" else size) for size in sorted(old)}
    # The same new size for every axis of one old size (a mask's length follows the ids').
    new = {(w, ax): renamed[int(arrays[w].shape[ax])] for w, ax in sorted(axes, key=str)}
    call = with_sizes(sample, new)
    if not inits_in_linen(result.linen_module, call):
      continue  # a size the model does not take is not checked
    kwargs = {name: new[(w, ax)] for name, (w, ax) in sizes.items()}
    what = ", ".join(f"{name}={v}" for name, v in kwargs.items()) or ", ".join(
      f"{argument_label(w)}.shape[{ax}]={v}" for (w, ax), v in new.items()
    )
    return call, kwargs, what
  return None


def call_arrays(call: Call) -> dict[int | str, tp.Any]:
  """The call's array arguments, by position or keyword."""
  return {
    **{i: a for i, a in enumerate(call.args) if isinstance(a, (jax.Array, np.ndarray))},
    **{k: a for k, a in call.kwargs.items() if isinstance(a, (jax.Array, np.ndarray))},
  }


def argument_label(where: int | str) -> str:
  """`argument 0` or the keyword: where an array of the sample call is."""
  return f"argument {where}" if isinstance(where, int) else where


def with_sizes(sample: Call, new: dict[tuple[int | str, int], int]) -> Call:
  """The sample call with random arrays, each axis in `new` at its new size."""
  keys = iter(jax.random.split(jax.random.key(13), len(sample.args) + len(sample.kwargs)))

  def one(where: int | str, a: object) -> object:
    key = next(keys)
    if not isinstance(a, (jax.Array, np.ndarray)) or a.ndim == 0:
      return a
    shape = [new.get((where, axis), d) for axis, d in enumerate(a.shape)]
    return _random_like(np.zeros(shape, a.dtype), key, None)

  return Call(
    *[one(i, a) for i, a in enumerate(sample.args)],
    method=sample.method,
    **{k: one(k, v) for k, v in sample.kwargs.items()},
  )


def int_settings(module: nn.Module) -> set[int]:
  """The integer settings of `module` (fields, and fields of a config object it holds)."""
  from ..trace.tracing.settings import settings

  return {s.value for s in settings(module)}


def _at_other_input_size(result: tp.Any, verdict: Check) -> Check:
  """The port built with another input size (`x_features=...`) against Linen there: at the
  user's configuration, then at each branch configuration the check runs (a layer only a
  branch builds has its input width from that branch's traces alone, at the sample's size)."""
  labels = result.config_labels or ("",) * len(result.configs)
  at = [(result.linen_module, result.init_kwargs, "")]
  at += [
    (result.configs[k][0], result.configs[k][1], f", at {labels[k]}")
    for k in _branch_checks(labels)
    if not labels[k].startswith("every setting distinct")  # evidence, not a branch's side
  ]
  for module, init_kwargs, suffix in at:
    here = dataclasses.replace(result, linen_module=module, init_kwargs=init_kwargs)
    found = other_input_size(here) if verdict.equal else None
    if found is None:
      continue
    call, kwargs, what = found
    where = f"an input of another size ({what}{suffix})"
    resized = dataclasses.replace(here, init_kwargs={**init_kwargs, **kwargs})
    verdict = merged(verdict, checked_at(result, module, resized.build, call), where)
  return verdict


def _describe(module: nn.Module, other: nn.Module) -> str:
  """`config.emb_dim=32, ...`: the integer fields where `other` differs from `module`."""
  from ..trace.configs import knobs

  parts = []
  for field, attr in knobs(module):
    a, b = getattr(module, field), getattr(other, field)
    if attr is not None:
      a, b = getattr(a, attr), getattr(b, attr)
    if a != b:
      parts.append(f"{field}.{attr}={b}" if attr else f"{field}={b}")
  return ", ".join(parts[:6]) + (", ..." if len(parts) > 6 else "")


def build_failed(error: Exception) -> Check:
  """The check of a draft whose port could not be built or converted."""
  return Check(False, (), None, f"building or converting the port: {type(error).__name__}: {error}")


def compare_built(result: tp.Any, port: nnx.Module, variables: tp.Mapping[str, object]) -> Check:
  """The check's last phase: the built, converted port against Linen on every call.

  The command line runs the phases one by one (`check=False`, then `port_and_variables`,
  then this) to say which one is running.
  """
  return run_check(
    result.linen_module,
    variables,
    port,
    result.calls,
    result.source,
    result.unpaired,
    result.check_precision,
  )
