"""`lb.ToNNX`: a `flax.nnx.bridge.ToNNX` whose state never changes shape.

Stock `ToNNX.__call__` rebuilds a new Variable for every updated collection value and appends
every `sow` to a growing tuple, so NNX loops (which require the same Variables and the same
structure before and after the body) reject it. This subclass:
- keeps the Linen variables where stock `ToNNX` keeps them (same attribute paths, same types),
  but writes updates into the *existing* Variables;
- moves each call's sown values into preallocated `Buffer`s (one per sow site) and advances
  the site's entry of the wrapper's one `Count` vector, so the structure is identical after
  every call.
While a loopbridge entry (`lb.lazy_init`, `lb.preallocate`) runs, it reports what its Linen
call sowed to that entry's discovery session instead. The design note in
`src/loopbridge/README.md` explains the stages.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from flax import linen, nnx, traverse_util
from flax.nnx import bridge
from typing_extensions import Self

from .. import _compat
from . import buffers as _buffers
from . import (
  discovery_session,
  linen_vars,
  observe_linen,
  pipeline,
  recorder,
  recording_switch,
  signature,
  site_probe,
  trace_check,
  user_errors,
)
from . import site as _site
from .bridge_settings import SETTINGS_ATTR, BridgeSettings, CaptureFilter, bridge_settings
from .call_target import LinenMethod
from .capacity import (
  DEFAULT_OVERFLOW,
  DeclarationSpec,
  Overflow,
  check_capacity_spec,
  check_overflow,
)
from .errors import NotDeclaredError, StructureChangeError
from .to_nnx_arguments import (
  MutableFilter,
  _check_method,
  _check_rngs_and_capture,
  _creates_params,
  _merge_mutable,
  _rng_counts,
)
from .to_nnx_discovery import _add_apply_only_sites, _init_fn, _new_variables, _plain_call
from .to_nnx_records import _NO_SIGNATURE, _describe_sown, _pytree_records

BUFFERS_ATTR = recorder.BUFFERS_ATTR
COUNTS_ATTR = recorder.COUNTS_ATTR


class ToNNX(bridge.ToNNX):
  """A loop-stable `flax.nnx.bridge.ToNNX`: records every `sow` into preallocated buffers.

  Wrap a Linen module, call `lazy_init` with sample inputs and a `capacity`, and the result is
  an NNX module whose state keeps the same Variables, shapes and structure on every call, so
  it runs inside `nnx.while_loop`, `nnx.fori_loop` and `nnx.scan` under jit.

  Args:
    module: the Linen module to wrap.
    rngs: `nnx.Rngs` or a key, as for `flax.nnx.bridge.ToNNX`.
    capacity: default capacity for `lazy_init` (an int for every sow site or a mapping from a
      collection name, a `/`-joined sow path or a glob to an int). `lazy_init(capacity=...)`
      overrides it; it overrides an enclosing `with lb.capacity(N):` block.
    overflow: default overflow policy: `"error"`, `"drop"` or `"wrap"`.
    capture_intermediates: Linen's `apply(capture_intermediates=...)`: `True` records every
      submodule's `__call__` output (`'intermediates'/<path>/__call__`), a filter
      `fn(module, method_name) -> bool` chooses; recorded with capacity like any sow. An
      output that is a pytree (a block returning `(out, weights)`) gets a buffer per array
      leaf and reads back as that pytree.

  Raises:
    TypeError: `module` is not a Linen module.
    CapacityError: a malformed `capacity` or `overflow`.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     h = nn.Dense(3)(x)
    ...     self.sow("intermediates", "h", h)
    ...     return h
    >>> model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
    >>> _ = lb.lazy_init(model, jnp.ones((1, 2)), capacity=4)
    >>> _ = model(jnp.ones((1, 2)))
    >>> lb.recorded(model)["intermediates"]["h"].shape
    (1, 1, 3)
  """

  # bridge_settings.BRIDGE_MARK: what `is_bridge` tests (true of subclasses too).
  loopbridge__bridge: tp.ClassVar[bool] = True

  def __init__(
    self,
    module: linen.Module,
    rngs: _compat.RngsArg = None,
    *,
    capacity: int | tp.Mapping[str, int] | None = None,
    overflow: Overflow = DEFAULT_OVERFLOW,
    capture_intermediates: CaptureFilter = False,
  ):
    if not isinstance(module, linen.Module):
      raise TypeError(
        f"lb.ToNNX wraps a Linen module (an instance of flax.linen.Module), got "
        f"{type(module).__name__}. "
        + (
          "It is an NNX module: it needs no bridge; use lb.preallocate on it directly."
          if isinstance(module, nnx.Module)
          else "Fix: pass an instance, e.g. lb.ToNNX(MyLinenModule(...), rngs=nnx.Rngs(0))."
          if isinstance(module, type)
          else "Fix: pass a Linen module instance."
        )
      )
    # The constructor always names a policy (None is not one); the entries may leave it out.
    spec = DeclarationSpec(check_capacity_spec(capacity), check_overflow(overflow))
    _check_rngs_and_capture(rngs, capture_intermediates)
    super().__init__(module, rngs)
    setattr(self, SETTINGS_ATTR, BridgeSettings(spec, capture_intermediates))
    setattr(self, recorder.SITES_ATTR, None)
    setattr(self, recorder.DROPPED_ATTR, ())
    recorder.make_recorder(self)

  # ------------------------------------------------------------------ initialization
  def lazy_init(
    self,
    *args: tp.Any,
    capacity: int | tp.Mapping[str, int] | None = None,
    overflow: Overflow | None = None,
    **kwargs: tp.Any,
  ) -> Self:
    """Initialize the Linen variables from sample inputs and declare the sow buffers.

    Same as `lb.lazy_init(self, *args, capacity=..., overflow=..., **kwargs)`.
    """
    return pipeline.lazy_init(self, *args, capacity=capacity, overflow=overflow, **kwargs)

  def _loopbridge_initialize(self, args, kwargs, rngs, method):
    """What `__call__` does in initializing mode: Linen init, and the sites that trace sowed."""
    module = _compat.linen_module_of(self)
    init_rngs = _compat.bridge_call_rngs(
      rngs if rngs is not None else _compat.rngs_of(self), initializing=True
    )
    kwargs = {k: v for k, v in kwargs.items() if k != "mutable"}
    # mutable=True: Linen's init leaves 'intermediates' out by default; with it, init returns
    # every value the trace sowed, so the sites come from this one trace.
    capture = bridge_settings(self).capture_intermediates
    try:
      with observe_linen.observe() as calls:
        out, variables = module.init_with_output(
          init_rngs, *args, method=method, mutable=True, capture_intermediates=capture, **kwargs
        )
    except Exception as error:
      user_errors.note_linen_call(
        error,
        label=type(module).__name__,
        what="init",
        plain=_plain_call(module, "init", method, capture),
        # Linen's own init, even where the class defines an `init` method of its own.
        rerun=lambda: linen.Module.init(
          module, init_rngs, *args, method=method, capture_intermediates=capture, **kwargs
        ),
      )
      raise
    found = observe_linen.classify(variables, calls)
    # Values sown with the default tuple reduce are records, not state: keep them out of the
    # Variables, or they would grow on every later call.
    # Accumulators in 'intermediates' would not exist after Linen's own init (it leaves that
    # collection immutable): they start from `init_fn()`, as on a plain Linen model's first call.
    fresh = {
      site: (_init_fn(call), value)
      for site, (call, value) in found.accumulators.items()
      if site[0] == "intermediates"
    }
    flat = traverse_util.flatten_dict(dict(variables), is_leaf=lambda _, v: isinstance(v, tuple))
    kept = {
      p: v
      for p, v in flat.items()
      if p not in found.record_paths and not any(p[: len(s)] == s for s in fresh)
    }
    linen_vars.set_variables(self, traverse_util.unflatten_dict(kept))
    linen_vars.add_accumulators(self, fresh)
    if calls.direct_writes or calls.nnx_sows:
      # A module wrote its variables itself (`put_variable`, e.g. nnx.bridge.ToLinen), or an
      # NNX module sowed (flax 0.11+'s ToLinen writes nothing in init for a module without
      # Variables): what it writes in apply (an NNX module's sows) is not in init's variables.
      # One abstract apply shows it; nothing runs concretely a second time, so caches stay as
      # init left them.
      _add_apply_only_sites(self, found, args, kwargs, init_rngs, method, capture)
    report = discovery_session.BridgeReport(
      self,
      type(module).__name__,
      found.sites,
      found.dropped,
      {},
      signature=signature.label(args, kwargs, method),
    )
    session = discovery_session.current()
    if session is not None:
      session.reports.append(report)
      if id(self) not in session.graph_ids:  # a copy inside an NNX transform
        site_probe.leave_probes(self, found.sites, flat)
    else:  # stock `bridge.lazy_init(model, ...)`: declare with the constructor's capacity
      pipeline.declare_alone(self, report, args, kwargs)
    return out

  def _loopbridge_discover(self, args, kwargs, rngs, method, session):
    """What `__call__` does inside `lb.preallocate`'s abstract run: report this call's sows."""
    module = _compat.linen_module_of(self)
    variables = linen_vars.call_variables(self)
    kwargs = {k: v for k, v in kwargs.items() if k != "mutable"}
    # This is a throwaway clone under jax.eval_shape: drawing from its streams changes nothing.
    call_rngs = _compat.bridge_call_rngs(
      rngs if rngs is not None else _compat.rngs_of(self), initializing=False
    )
    capture = bridge_settings(self).capture_intermediates
    quiet = _compat.quiet_nnx_accumulators(
      bool(getattr(self, linen_vars.NNX_ACCUMULATORS_ATTR, ()))
    )

    def apply(variables, mutable):
      return linen.Module.apply(
        module,
        variables,
        *args,
        rngs=call_rngs,
        method=method,
        mutable=mutable,
        capture_intermediates=capture,
        **kwargs,
      )

    try:
      with observe_linen.observe() as calls, quiet:
        out, updates = apply(variables, True)
    except Exception as error:
      # Plain Linen as a user calls it: the state collections mutable (a decoding model's
      # `mutable=['cache']`), so the verdict is not about an immutable collection.
      state = sorted(c for c in variables if c not in ("params", "intermediates"))
      user_errors.note_linen_call(
        error,
        label=type(module).__name__,
        what="apply",
        plain=_plain_call(module, "apply", method, capture, mutable=state),
        rerun=lambda: apply(variables, state),
      )
      user_errors.note_batch_sized_state(error, variables, args, kwargs, lambda v: apply(v, True))
      raise
    found = observe_linen.classify(updates, calls, inputs=variables)
    new_accumulators = {
      site: (_init_fn(call), value)
      for site, (call, value) in found.accumulators.items()
      if recorder.get_nested(variables, site) is None
    }
    sown = [updates[s.collection] for s in found.sites if s.collection in updates]
    new_variables = _new_variables(updates, variables, found)
    session.reports.append(
      discovery_session.BridgeReport(
        self,
        type(module).__name__,
        found.sites,
        found.dropped,
        new_accumulators,
        batched=any(map(_compat.is_batched, jax.tree.leaves(sown))),
        signature=signature.label(args, kwargs, method),
        new_variables=new_variables,
      )
    )
    return out

  # ------------------------------------------------------------------ calling
  def __call__(
    self,
    *args: tp.Any,
    rngs: _compat.RngsArg = None,
    method: LinenMethod = None,
    mutable: MutableFilter = None,
    **kwargs: tp.Any,
  ) -> tp.Any:
    """Apply the Linen module, recording its sows in place. Same signature as stock ToNNX.

    Recording rule: collections that hold declared sow sites, and `intermediates`, are always
    applied as mutable (that is how values reach the buffers, and how a sow without a buffer
    is reported rather than lost), whatever `mutable` says; `mutable` keeps its
    Linen meaning for every other collection (`batch_stats`, `cache`, ...). Only the output
    is returned, as in stock `ToNNX`.
    """
    _check_method(_compat.linen_module_of(self), method)
    if _compat.is_initializing(self):
      return self._loopbridge_initialize(args, kwargs, rngs, method)
    session = discovery_session.current()
    if session is not None and session.mode == "apply":
      return self._loopbridge_discover(args, kwargs, rngs, method, session)
    sites = recorder.sites_of(self)
    if mutable is None:
      mutable = _compat.current_bridge_mutable()
    attrs = linen_vars.attrs(self)
    if sites is None and attrs:
      # Variables set from outside without a declaration (nnx.bridge.Module.apply builds the
      # wrapper anew on every apply and fills them in): applied exactly as stock does, sows
      # included (no buffers: nothing loops over a wrapper that lives for one apply).
      return self._loopbridge_apply_undeclared(args, kwargs, rngs, method, mutable, attrs)
    if sites is None and _creates_params(mutable):
      # As stock: a call that may create parameters (e.g. inside nnx.bridge.Module.init, whose
      # scope passes mutable=True) initializes the wrapper instead of failing.
      return self._loopbridge_initialize(args, kwargs, rngs, method)
    if sites is None:
      raise NotDeclaredError(
        f"lb.ToNNX({type(_compat.linen_module_of(self)).__name__}) was called before it was "
        "initialized. Why: the Linen variables and the sow buffers are created from sample "
        "inputs. Fix: lb.lazy_init(model, *sample_args, capacity=N) first (or "
        "model.lazy_init(...))."
      )
    module = _compat.linen_module_of(self)
    variables = linen_vars.call_variables(self)
    # 'intermediates' (where `sow` writes by default) is always recorded too, so a sow this
    # call makes without a declared buffer is reported instead of silently dropped.
    record_cols = {site.collection for site in sites} | {"intermediates"}
    apply_mutable = _merge_mutable(mutable, record_cols)
    # Before drawing from the rng streams (a write too): a closed-over model fails here.
    trace_check.check(
      [
        recorder.counts_of(self),
        *(_rng_counts(_compat.rngs_of(self)) if rngs is None else ()),
      ],
      f"lb.ToNNX({type(module).__name__})",
    )
    result = self._loopbridge_apply(variables, args, kwargs, rngs, method, apply_mutable)
    if apply_mutable is False:
      return result
    out, updates = result
    self._loopbridge_absorb(updates, attrs, variables, (args, kwargs, method))
    return out

  def _loopbridge_apply(self, variables, args, kwargs, rngs, method, mutable) -> tp.Any:
    """Linen `apply` of the wrapped module as a call (not an init) draws its rngs: from `rngs`
    when given, else from the wrapper's own streams; with the constructor's capture filter."""
    call_rngs = _compat.bridge_call_rngs(
      rngs if rngs is not None else _compat.rngs_of(self), initializing=False
    )
    module = _compat.linen_module_of(self)
    capture = bridge_settings(self).capture_intermediates

    def apply(variables):
      return module.apply(
        variables,
        *args,
        rngs=call_rngs,
        method=method,
        mutable=mutable,
        capture_intermediates=capture,
        **kwargs,
      )

    with _compat.quiet_nnx_accumulators(bool(getattr(self, linen_vars.NNX_ACCUMULATORS_ATTR, ()))):
      try:
        return apply(variables)
      except Exception as error:
        user_errors.note_batch_sized_state(error, variables, args, kwargs, apply)
        raise

  def _loopbridge_apply_undeclared(self, args, kwargs, rngs, method, mutable, attrs):
    """Stock `ToNNX.__call__` on variables set from outside: updates become Variables.

    Linen's `mutable=` is the caller's (or the enclosing bridge module's); every update,
    sown tuples and accumulators included, lands on the wrapper where stock puts it, so
    `nnx.bridge.Module.apply(..., mutable=True)` returns what Linen's `apply` returns.
    """
    variables = linen_vars.to_linen(attrs)
    result = self._loopbridge_apply(variables, args, kwargs, rngs, method, mutable)
    if mutable is False:
      return result
    out, updates = result
    new = {}
    for path, update in traverse_util.flatten_dict(dict(updates)).items():
      variable = recorder.get_nested(attrs, path[1:])
      if isinstance(variable, nnx.Variable) and not isinstance(update, tuple):
        _compat.set_variable_value(variable, linen_vars.unbox(update))
      else:
        new[path] = update
    if new:
      linen_vars.add_variables(self, traverse_util.unflatten_dict(new))
    return out

  def _loopbridge_absorb(self, updates, attrs, variables_in, call) -> None:
    """Write one call's updates into the existing Variables and buffers, all or nothing.

    Everything is checked before anything is written, so a call that fails (a sow without a
    buffer, a new shape, a new Variable) leaves every buffer, count and Variable as it was.
    The sows go to the buffers of the call's own signature (`call`: its args, kwargs and
    method); inside `lb.recording(False)` they are left out.
    """
    buffers = getattr(self, BUFFERS_ATTR)
    counts = recorder.counts_of(self)
    index = recorder.count_indices(self)
    flat_in = traverse_util.flatten_dict(dict(variables_in))
    flat_updates = traverse_util.flatten_dict(dict(updates))
    recording = recording_switch.is_on()
    slot = self._loopbridge_slot(flat_updates, call) if recording else 0
    prefix = _site.slot_prefix(slot)
    records, writes, created = [], [], {}
    for path, value in flat_updates.items():
      label = "/".join(path)
      if isinstance(value, tuple):
        if not recording:
          continue  # an unrecorded call: its sows are dropped, by the user's choice
        buffer = recorder.get_nested(buffers, prefix + path)
        if isinstance(buffer, _buffers.Buffer):
          for v in value:
            _buffers.check_value(buffer, v, label)
          records.append((buffer, index[prefix + path], value, label))
        else:
          records.extend(_pytree_records(self, path, value, buffers, label, slot))
        continue
      if path in flat_in and flat_in[path] is value:
        continue  # unchanged (e.g. params under mutable=True): nothing to write
      if path in flat_in and linen_vars.is_static_rewrite(flat_in[path], value):
        continue  # a static value put again (flax 0.10 ToLinen's graphdef): keep the first
      variable = recorder.get_nested(attrs, path[1:])
      if not isinstance(variable, nnx.Variable):
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value)):
          raise StructureChangeError(
            f"this call created the variable '{label}', which did not exist after "
            "lazy_init, inside a traced function (jit, an NNX loop or transform). Why: NNX "
            "loops and transforms need every Variable to exist before they start; a call "
            "that adds one changes the model's structure. Fix: make lazy_init create it "
            "(initialize with the same method and arguments the loop uses, or call "
            "lb.preallocate with them), make one such call before tracing, or keep the "
            "value out of Linen variables."
          )
        created[path] = value  # as stock: outside a trace a call may add a Variable
        continue
      new = linen_vars.unbox(value)
      old = _compat.variable_value(variable)
      if np.shape(new) != np.shape(old) or jnp.result_type(new) != jnp.result_type(old):
        raise StructureChangeError(
          f"this call changed '{label}' from shape {np.shape(old)} "
          f"{jnp.result_type(old)} to {np.shape(new)} {jnp.result_type(new)}. Why: NNX loops "
          "need every Variable to keep its shape and dtype. Fix: keep the collection's "
          "shapes fixed (e.g. preallocate a cache at its full length)."
        )
      writes.append((variable, new))
    trace_check.check(
      [variable for variable, _ in writes],
      f"lb.ToNNX({type(_compat.linen_module_of(self)).__name__})",
    )
    if records:
      assert counts is not None  # a buffer was found for a record, so the vector exists
      _buffers.append_all(counts, records)
    for variable, new in writes:
      _compat.set_variable_value(variable, new)
    if created:
      linen_vars.add_variables(self, traverse_util.unflatten_dict(created))

  def _loopbridge_slot(self, flat_updates: tp.Mapping[tuple[str, ...], object], call) -> int:
    """The signature slot whose buffers this call's sows go to (chosen while tracing)."""
    sites = recorder.sites_of(self) or ()
    if len({s.slot for s in sites}) <= 1:
      return 0  # one signature: every call writes it (its checks say what does not fit)
    records = {p: v for p, v in flat_updates.items() if isinstance(v, tuple)}
    if not records:
      return 0
    label = signature.label(*call)
    slot = signature.choose_slot(sites, label, records)
    if slot is None:
      declared = dict(sorted({s.slot: s.signature for s in sites}.items()))
      raise NotDeclaredError(
        _NO_SIGNATURE.format(
          model=type(_compat.linen_module_of(self)).__name__,
          label=label,
          declared=", ".join(repr(x) for x in declared.values()),
          sown=", ".join(
            f"{'/'.join(p)}: {[_describe_sown(v) for v in vals]}" for p, vals in records.items()
          ),
        )
      )
    return slot
