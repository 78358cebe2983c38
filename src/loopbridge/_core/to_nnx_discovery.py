"""What an `lb.ToNNX`'s discovery reads beyond one Linen call: the sites only an abstract
`apply` shows, the Linen variables an apply creates, the plain-Linen call quoted in error notes,
and an observed sow's `init_fn`."""

from __future__ import annotations

import typing as tp

import jax
from flax import linen, traverse_util

from .. import _compat
from . import linen_vars, observe_linen, recorder
from . import site as _site
from .bridge_settings import CaptureFilter
from .call_target import LinenMethod


def _add_apply_only_sites(node, found, args, kwargs, rngs, method, capture) -> None:
  """Add to `found` (init's findings) the sites one abstract `apply` of `node` shows in addition.

  Used after an init in which a module wrote its variables itself: such a module may write
  records in apply only (`nnx.bridge.ToLinen` puts an NNX module's sows after its call, and
  not at all in init). Linen sows that happen only outside init are found too, and so are
  custom-reduce accumulators that first appear in apply (they start from `init_fn()` now).
  The rng keys are init's, so the wrapper's streams are not advanced. When the init
  signature is not one apply accepts, nothing is added (see below).
  """
  module = _compat.linen_module_of(node)
  variables = linen_vars.linen_variables(node)

  def run(variables, rngs):
    return module.apply(
      variables,
      *args,
      rngs=rngs,
      method=method,
      mutable=True,
      capture_intermediates=capture,
      **kwargs,
    )

  try:
    with observe_linen.observe() as calls:
      _, updates = jax.eval_shape(run, variables, rngs)
  except Exception:
    # The init signature need not be one apply accepts (flax's decode attention, initialized
    # on the full length, applies one token at a time). Nothing is lost: a call that writes
    # at a site with no buffer raises NotDeclaredError naming lb.preallocate, whose abstract
    # apply of the call's own signature finds these sites.
    return
  more = observe_linen.classify(updates, calls, inputs=variables)
  known = {s.sow_key for s in found.sites} | found.record_paths | set(found.accumulators)
  found.sites.extend(s for s in more.sites if s.sow_key not in known)
  found.sites.sort(key=lambda s: s.key)
  found.record_paths.update(more.record_paths)
  seen = {(d.collection, d.module_path, d.name) for d in found.dropped}
  found.dropped.extend(d for d in more.dropped if (d.collection, d.module_path, d.name) not in seen)
  accumulators = {
    site: (_init_fn(call), value)
    for site, (call, value) in more.accumulators.items()
    if site not in known and recorder.get_nested(variables, site) is None
  }
  linen_vars.add_accumulators(node, accumulators)


def _new_variables(
  updates: tp.Mapping[str, object],
  inputs: tp.Mapping[str, object],
  found: observe_linen.LinenFindings,
) -> dict[tuple[str, ...], object]:
  """The Linen variables an apply created that were not passed in, records and accumulators
  left out: what a call such as HuggingFace's `init_cache=True` makes (its `cache`)."""
  is_tuple = lambda _, v: isinstance(v, tuple)  # noqa: E731
  given = traverse_util.flatten_dict(dict(inputs), is_leaf=is_tuple)
  accumulators = list(found.accumulators)
  return {
    path: value
    for path, value in traverse_util.flatten_dict(dict(updates), is_leaf=is_tuple).items()
    if path not in given
    and not isinstance(value, tuple)
    and path not in found.record_paths
    and not any(path[: len(a)] == a for a in accumulators)
  }


def _plain_call(
  module: linen.Module,
  entry: str,
  method: LinenMethod,
  capture: CaptureFilter,
  mutable: tp.Sequence[str] = (),
) -> str:
  """How a user calls the same thing in plain Linen, for notes on errors from the model."""
  extra = "" if method is None else f", method={getattr(method, '__name__', method)!r}"
  if capture is not False:
    extra += f", capture_intermediates={capture!r}"
  if mutable:
    extra += f", mutable={list(mutable)!r}"
  first = "rngs" if entry == "init" else "variables"
  return f"`{type(module).__name__}.{entry}({first}, *args{extra})`"


def _init_fn(call: _site.SowCall) -> tp.Callable[[], object]:
  """The `init_fn` of an observed Linen sow (Linen's `sow` always passes one)."""
  assert call.init_fn is not None, "a Linen sow was observed without its init_fn"
  return call.init_fn
