"""`lb.port.draft`: the NNX source of a Linen model's port, and the check that it is equal."""

from __future__ import annotations

import dataclasses
import os
import typing as tp

from flax import linen as nn
from flax import nnx

from .. import _compat
from .._diagnostics.compare_tolerance import HIGHEST
from .._diagnostics.compare_tolerance import check_precision as check_precision_of
from .check.array_sizes import array_sizes, unproven
from .check.class_check import build_failed, check_class, compare_built
from .check.failed_line import failure_todo
from .check.random_draws import explained
from .check.report import render
from .check.run_check import convert, exec_source, unique_name
from .check.setting_sizes import at_setting_sizes
from .check.tied_sizes import at_tied_sizes
from .emit.assemble import format_source, imports
from .emit.safety import (
  class_failed_reason,
  drafted_code_error,
  fallback_port,
  layer_subclass_reason,
  unparsable_reason,
)
from .emit.write_class import port_class
from .errors import (
  PortError,
  bad_call,
  bad_calls,
  bad_configs,
  bad_method,
  bad_variables,
  check_build_arguments,
  flax_layer,
  not_a_linen_module,
)
from .plan.class_port import ClassPort, Context
from .plan.source import ClassSource, libcst, read_class
from .plan.standard_layers import is_linen_layer, lookup
from .records import Call, Change, Check, PortOf, Todo
from .trace.branch_configs import branch_configs
from .trace.configs import derived, literal_notes, other_configs
from .trace.other_sides import other_sides
from .trace.trace import rng_streams, trace
from .trace.tracing.branch_symbolic import at_branches, class_view
from .trace.tracing.distinct import add_distinct, float_settings
from .trace.tracing.settings import settings
from .trace.tracing.widths import (
  ByValue,
  SymbolicWidths,
  by_value,
  by_value_notes,
  input_axes,
  input_notes,
  symbolic_widths,
  traced_symbolically,
)
from .transforms import (
  inherited_fields,
  layer_subclass,
  never_called,
  param_override,
  user_base_class,
)
from .transforms.cache_idiom import add_method, cache_shapes, size_caches
from .transforms.computed_params import keep_params
from .transforms.constant_arrays import as_properties
from .transforms.custom_collections import declaration
from .transforms.module_globals import read_through_modules
from .transforms.module_level_lift import is_lifted_user_class, root_notes, user_class
from .transforms.module_name import keep_name
from .transforms.scanned_method import per_step_paths
from .transforms.shadowing import renamed, shadowing, shadowing_changes
from .transforms.static_then_array import mark_data

# Report rows besides each class's changes: literals, widths matched by value, input sizes.
_NOTES = (literal_notes, by_value_notes, input_notes)


def _init_kwargs(
  module: nn.Module, path: tuple[str, ...], ctx: Context, config: int = 0
) -> dict[str, object]:
  """The constructor arguments of the port of `module` (at `path` in the trace of `config`, 0
  the user's): its fields (a Linen submodule among them as the `PortOf` its port) and the
  arguments the draft added."""
  port: ClassPort = ctx.ported[user_class(type(module))]
  traced = ctx.trace if config == 0 else ctx.alt_traces[config - 1]
  kwargs: dict[str, object] = {}
  for f in dataclasses.fields(module):
    if f.name in ("parent", "name") or f.name in port.dropped:
      continue
    value = getattr(module, f.name)
    # Linen adopts a module handed in as a field under the field's name.
    inner = (*path, f.name)
    if isinstance(value, nn.Module) and type(value) in ctx.ported and inner in traced.instances:
      value = PortOf(type(value).__name__, _init_kwargs(value, inner, ctx, config))
    kwargs[f.name] = value
  for extra in port.resolver.extras.values():  # pyright: ignore[reportOptionalMemberAccess]
    at = traced.instances.get(path)
    # None: the instance never reads it
    kwargs[extra.name] = extra.value_of(at) if at is not None else extra.values.get(path)
  return kwargs


@dataclasses.dataclass
class Draft:
  """A drafted NNX port: its source, what changed, what is left to do, and the measured verdict.

  Attributes:
    source: the drafted NNX source (one importable file).
    root: the class name of the port of the drafted Linen module.
    init_kwargs: constructor arguments that rebuild the port of this very Linen module (a Linen
      submodule handed in as a field appears as the `PortOf` its port is built from).
    todos: each place left untranslated (`lb.port.Todo`).
    changes: each change made (`lb.port.Change`), the report's rows.
    check: the verdict (`lb.port.Check`), or None when drafted with `check=False`.
  """

  source: str
  root: str
  init_kwargs: dict[str, object]
  todos: tuple[Todo, ...]
  changes: tuple[Change, ...]
  check: Check | None
  linen_module: nn.Module = dataclasses.field(repr=False)
  calls: tuple[Call, ...] = dataclasses.field(repr=False)
  variables: tp.Mapping[str, object] | None = dataclasses.field(repr=False)
  filename: str = dataclasses.field(repr=False, default="port.py")
  unpaired: tuple[str, ...] = dataclasses.field(repr=False, default=())
  check_precision: str = dataclasses.field(repr=False, default=HIGHEST)
  # (Linen module, init_kwargs of its port) at each derived configuration that traced.
  configs: tuple[tuple[nn.Module, dict[str, object]], ...] = dataclasses.field(
    repr=False, default=()
  )
  # Per entry of `configs`: '' for a scaled one, else the setting a branch configuration
  # changed (`branch_configs.py`), which the check also runs the port at.
  config_labels: tuple[str, ...] = dataclasses.field(repr=False, default=())

  # Each width the symbolic trace did not decide, matched by value (`tracing/widths.py`).
  literals: tuple[ByValue, ...] = dataclasses.field(default=())
  # Root arguments that are input sizes (`x_features`): name -> (call argument, axis).
  input_sizes: dict[str, tuple[int | str, int]] = dataclasses.field(
    repr=False, default_factory=dict
  )
  # Layers built always though under a test of the call's shapes (`plan/shape_guards.py`).
  shape_guards: tuple[Todo, ...] = dataclasses.field(repr=False, default=())
  # Sizes of arrays no check resizes: size -> where; the widths the symbolic trace found
  # constant (`check/array_sizes.py`).
  array_sizes: dict[int, str] = dataclasses.field(repr=False, default_factory=dict)
  constants: tuple[ByValue, ...] = dataclasses.field(repr=False, default=())
  # Whether the root has a setting a distinct-valued configuration can change: without one,
  # the sample's configuration is the only one, and its check is the whole evidence.
  has_settings: bool = dataclasses.field(repr=False, default=True)

  @property
  def ok(self) -> bool:
    """The check ran, every call was equal, no TODO remains, and a width matched by value
    (`literals`) was checked at a configuration where every setting differs (where the root
    has a setting to change)."""
    checked = any(label.startswith("every setting distinct") for label in self.config_labels)
    return (
      self.check is not None
      and self.check.equal
      and not self.todos
      and (not self.literals or checked or not self.has_settings)
      and not unproven((*self.literals, *self.constants), self.array_sizes)
    )

  def build(self, rngs: nnx.Rngs | None = None, config: int = 0) -> nnx.Module:
    """Run the source as a fresh module and construct the root port with `init_kwargs`.

    Args:
      rngs: the port's random streams (default `nnx.Rngs(0)`).
      config: 0 builds the port of the drafted module; k, of the k-th other configuration the
        draft traced (`configs=`, or derived), whose arguments are `configs[k - 1][1]`.

    Returns:
      The port (freshly initialized, not holding the Linen variables).

    Raises:
      PortError: `rngs` is not an `nnx.Rngs`, or `config` is not an index of the draft's
        configurations (0 to `len(draft.configs)`).
      Exception: whatever the drafted code raises (a TODO raises NotImplementedError).

    Examples:
      >>> import jax.numpy as jnp, flax.linen as nn, loopbridge as lb
      >>> d = lb.port.draft(nn.Dense(3), jnp.ones((1, 2)), check=False)  # doctest: +SKIP
      >>> d.build().Dense_0  # doctest: +SKIP
    """
    check_build_arguments(rngs, config, len(self.configs))
    module = exec_source(self.source, self.filename, unique_name(self.root))
    cls = getattr(module, self.root)
    # flax 0.12 shards an annotated Variable when it is created, which needs a mesh; the draft
    # is built for checking on whatever devices there are, as Linen's init did (flax 0.12.0
    # has only the process-wide flag, flipped for the block).
    rngs = rngs if rngs is not None else nnx.Rngs(0)

    def built(value: object) -> object:
      if not isinstance(value, PortOf):
        return value
      kwargs = {k: built(v) for k, v in value.kwargs.items()}
      return getattr(module, value.cls)(**kwargs, rngs=rngs)

    kwargs = self.init_kwargs if config == 0 else self.configs[config - 1][1]
    with _compat.no_eager_sharding():
      return cls(**{k: built(v) for k, v in kwargs.items()}, rngs=rngs)

  def port_and_variables(self) -> tuple[nnx.Module, tp.Mapping[str, object]]:
    """The built port holding the converted Linen variables, and those Linen variables.

    Returns:
      `(port, linen_variables)`: the variables are the user's, or the fresh `init` of the
      sample call that the check used. The port holds its own copy of each array (as
      `lb.checkpoint.linen_to_nnx` gives it), so a donating step on the port leaves the
      variables usable.

    Raises:
      CheckpointError: the variables could not be converted into the port.

    Examples:
      >>> port, variables = draft.port_and_variables()  # doctest: +SKIP
    """
    variables = self.variables
    if variables is None:
      sample = self.calls[0]
      streams = rng_streams(())
      variables = nn.Module.init(
        self.linen_module, streams, *sample.args, method=sample.method, **sample.kwargs
      )
      object.__setattr__(self, "variables", variables)
    port = self.build()
    size_caches(port, variables, (self.linen_module, self.calls[0]))
    convert(self.linen_module, variables, port, self.calls[0], self.check_precision)
    return port, variables

  def report(self) -> str:
    """The report: each change (file:line old -> new), each TODO and its reason, the verdict.

    Returns:
      Text to print.

    Examples:
      >>> print(draft.report())  # doctest: +SKIP
    """
    text = render(self.root, self.changes, self.todos, self.check, self.check_precision)
    lines = unproven((*self.literals, *self.constants), self.array_sizes)
    return "\n".join([text, *(f"(Not ok: {line}.)" for line in lines)])

  def write(self, path: str | os.PathLike[str]) -> str:
    """Write the source to `path`, formatted (when ruff is installed) for where it lands.

    Args:
      path: the file to write.

    Returns:
      The path written.

    Examples:
      >>> draft.write("mlp_nnx.py")  # doctest: +SKIP
    """
    path = os.fspath(path)
    text = format_source(self.source, os.path.abspath(path))
    with open(path, "w") as f:
      f.write(text)
    return path


def _port_all(
  classes: list[type],
  sources: dict[type, ClassSource],
  traced,
  alt_traces: list,
  variables: tp.Mapping[str, object] | None,
  symbolic: SymbolicWidths | None = None,
  extra: tp.Sequence[tp.Any] = (),
) -> Context:
  """Port every class (children first) with the traces as evidence (`extra`: the symbolic
  traces made at branch configurations, `branch_symbolic.class_view`)."""
  linen_names = {n for src in sources.values() for n, v in src.namespace.items() if v is nn}
  ctx = Context(traced, hasattr(nnx, "List"), {}, linen_names, cache_shapes(variables))
  ctx.alt_traces = list(alt_traces)
  if symbolic is not None:  # the last trace the widths read (`tracing/widths.py`)
    ctx.symbolic = symbolic_widths(symbolic, ctx.alt_traces)
  for cls in classes:
    with class_view(ctx, cls, extra):
      ctx.ported[cls] = _port_one(sources[cls], ctx)
    if ctx.caches.get(cls):
      ctx.ported[cls].code = add_method(ctx.ported[cls].code, ctx.caches[cls])
    hidden = shadowing(ctx.ported[cls].field_names())
    if hidden:
      ctx.ported[cls].code = renamed(ctx.ported[cls].code, hidden)
      source = sources[cls]
      ctx.ported[cls].changes += shadowing_changes(source.file, source.first_line, hidden)
  return ctx


def _work_left(ctx: Context | None, classes: list[type] | None) -> bool:
  """A TODO, a construction no trace made, or a stand-in for a layer no trace called
  (`never_called.py`), in any class ported."""
  if ctx is None or classes is None:
    return False
  return any(
    p.todos
    or (p.resolver is not None and p.resolver.untraced)
    or any(ch.why == never_called.WHY for ch in p.changes)
    for p in (ctx.ported[cls] for cls in classes)
  )


def _user_classes(root: nn.Module, traces) -> list[type]:
  """User-written Linen classes of the traces, children before the classes that build them."""
  depth: dict[type, int] = {}
  for inst in (i for t in traces for i in t.instances.values()):
    if not is_linen_layer(inst.cls):
      depth[inst.cls] = max(depth.get(inst.cls, -1), len(inst.path))
  depth.setdefault(user_class(type(root)), 0)
  return sorted(depth, key=lambda c: -depth[c])


def _read_sources(
  classes: list[type], known: tp.Mapping[type, ClassSource], required: tp.Collection[type]
) -> tuple[list[type], dict[type, ClassSource]]:
  """The classes whose source reads, with their sources. A class of the sample call's trace
  must read (its PortError says why and what to do); one only another configuration builds
  is left out when it does not (its construction stays a TODO, as with no such trace)."""
  sources: dict[type, ClassSource] = {}
  for cls in classes:
    try:
      sources[cls] = known.get(cls) or read_class(cls)
    except PortError:
      if cls in required:
        raise
  return [cls for cls in classes if cls in sources], sources


def _opaque_insides(traced) -> tuple[str, ...]:
  """Module paths inside layers whose NNX counterpart is built otherwise (compared as a whole)."""
  opaque = [p for p, i in traced.instances.items() if (m := lookup(i.cls)) and m.opaque]
  return tuple(
    "/".join(p)
    for p in traced.instances
    if any(len(p) > len(o) and p[: len(o)] == o for o in opaque)
  )


def draft(
  linen_module: nn.Module,
  *sample_args: object,
  method: str | None = None,
  calls: tp.Sequence[Call] = (),
  variables: tp.Mapping[str, object] | None = None,
  check: bool = True,
  check_precision: tp.Literal["highest", "model"] = HIGHEST,
  configs: tp.Sequence[nn.Module] | None = None,
  **sample_kwargs: object,
) -> Draft:
  """Draft the NNX port of a Linen module from its source, then check that it computes the same.

  Reads the source of the module's class and of every user-written Linen class it uses,
  rewrites them into NNX (submodules built in `__init__` with input widths from one traced
  call, `nnx.Param`/`nnx.BatchStat` variables, `nnx.List` for layers built in loops), and,
  with `check=True`, builds the port, converts the Linen variables into it
  (`lb.checkpoint.linen_to_nnx`) and compares it with Linen (`lb.compare`) on the sample call
  and on every `calls=` entry. What it cannot translate stays as a TODO block holding the
  original lines (the port raises there); a TODO or an unequal call never raises here, it is
  reported (`draft.ok` is False).

  Args:
    linen_module: the Linen module instance to port (the root).
    *sample_args: positional inputs of its sample call.
    method: the Linen method of the sample call (as in `Module.apply`); None for `__call__`.
    calls: extra calls to check, as `lb.port.Call(*args, method=None, **kwargs)`.
    variables: the Linen variables to check with; None runs a fresh `init` on the sample call.
    check: False drafts the source only.
    check_precision: what the check runs both models at: 'highest' (the default) under
      `jax.default_matmul_precision('highest')`, so the verdict means the same on a TPU (one
      bfloat16 pass per float32 matmul by default) as on a CPU; 'model' at their own
      precision, with the looser tolerance that goes with it.
    configs: other instances of the module's class (other field values) to trace as evidence
      for the widths' expressions and to check the port at; None derives them by scaling the
      integer fields (and a config dataclass's) by 2 and 4; `()` traces none.
    **sample_kwargs: keyword inputs of the sample call (e.g. `train=False`).

  Returns:
    A `Draft`: `.source`, `.todos`, `.changes`, `.check`, `.ok`, `.report()`, `.build()`.

  Raises:
    PortError: not a Linen module, a class whose source cannot be read, a bad `calls=` entry
      or method, the sample call failing in Linen, or libcst missing.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from tests.port_models.mlp_dropout import model  # doctest: +SKIP
    >>> d = lb.port.draft(model, jnp.ones((4, 24)), train=False)  # doctest: +SKIP
    >>> d.ok  # doctest: +SKIP
    True
  """
  if not isinstance(linen_module, nn.Module):
    raise PortError(not_a_linen_module(linen_module))
  check_precision_of(check_precision, "lb.port.draft(check_precision=...)", PortError)
  if is_linen_layer(type(linen_module)) and not is_lifted_user_class(type(linen_module)):
    mapped = lookup(type(linen_module))
    raise PortError(flax_layer(type(linen_module), mapped.nnx_name if mapped else None))
  if (why := param_override.root_reason(type(linen_module))) is not None:
    raise PortError(why)
  if not isinstance(calls, tp.Iterable) or isinstance(calls, (str, bytes, Call)):
    raise PortError(bad_calls(calls))
  if configs is not None and (
    not isinstance(configs, tp.Iterable) or isinstance(configs, (str, bytes, nn.Module))
  ):
    raise PortError(bad_configs(type(linen_module), configs))
  calls = tuple(calls)
  if variables is not None and not isinstance(variables, tp.Mapping):
    raise PortError(bad_variables(variables))
  for call in calls:
    if not isinstance(call, Call):
      raise PortError(bad_call(call))
  all_calls = (Call(*sample_args, method=method, **sample_kwargs), *calls)
  for call in all_calls:
    if call.method is not None and (
      not isinstance(call.method, str)
      or not callable(getattr(type(linen_module), call.method, None))
    ):
      raise PortError(bad_method(type(linen_module), call.method))
  libcst()
  root_class = user_class(type(linen_module))  # under a lift at module level (`nn.vmap(C)`)
  root_source = read_class(root_class)
  streams = set()
  traced = trace(linen_module, [(c.method, c.args, dict(c.kwargs)) for c in all_calls], streams)
  others, fixed = other_configs(linen_module, configs, all_calls[0], streams)
  symbolic = traced_symbolically(linen_module, all_calls[0], streams)
  labels: tuple[str, ...] = ("",) * len(others)
  bases = [(linen_module, ""), *((c, "of a configs= instance") for c in list(configs or ())[:2])]
  labels += add_distinct(linen_module, bases, all_calls[0], streams, others)
  ctx = classes = sources = None
  required = set(_user_classes(linen_module, [traced]))  # the sample call's: each must read
  # The classes the traces saw; where work is left, settings the sources read are changed one
  # at a time (`branch_configs.py`): for classes no trace saw, then (TODOs or untraced
  # constructions left) for submodules or variables the user's configuration does not make.
  for mode in ("classes", "paths"):
    if mode == "paths" and (configs is not None or not _work_left(ctx, classes)):
      break
    # A class only another configuration (`configs=`, scaled) builds is drafted from its trace.
    classes, sources = _read_sources(
      _user_classes(linen_module, [traced, *(t for _, t in others)]), {}, required
    )
    branches = (
      []
      if configs is not None
      else branch_configs(
        linen_module,
        sources,
        [traced, *(t for _, t in others)],
        all_calls[0],
        streams,
        len(others) + 1,
        lambda m: derived(m, fixed),
        read_class,
        mode,
      )
    )
    if mode == "classes" and configs is None:
      # An optional width or a flag at its other value, a tuple of widths one item longer.
      done = {label for _, _, label in branches}
      first = len(others) + len(branches) + 1
      scaled = lambda m: derived(m, fixed)  # noqa: E731
      branches += other_sides(
        linen_module, sources, traced, all_calls[0], streams, first, scaled, done
      )
    if mode == "paths" and not branches:
      break
    labels += tuple(label for _, _, label in branches)
    others += [(m, t) for m, t, _ in branches]
    # Where a branch builds a class, that class's widths are checked at distinct values too.
    unscaled = [(m, label) for m, _, label in branches if "scaled" not in label][:3]
    labels += add_distinct(linen_module, unscaled, all_calls[0], streams, others)
    classes, sources = _read_sources(
      _user_classes(linen_module, [traced, *(t for _, t in others)]), sources, required
    )
    symbolic, extra = at_branches(symbolic, linen_module, branches, all_calls[0], streams)
    ctx = _port_all(classes, sources, traced, [t for _, t in others], variables, symbolic, extra)
  assert ctx is not None and classes is not None and sources is not None
  lift_todos, lift_changes = root_notes(
    type(linen_module), root_source.file, root_source.first_line
  )
  ctx.ported[root_class].todos += lift_todos
  ctx.ported[root_class].changes += lift_changes
  from .emit.helpers import HELPERS

  written = [HELPERS[h].strip("\n") for h in sorted(ctx.helpers)]
  written += [declaration(col).strip("\n") for col in sorted(ctx.collections)]
  body = "\n\n".join([*written, *(ctx.ported[cls].code.strip("\n") for cls in classes)])
  homes = [home for cls in classes for home in inherited_fields.homes(sources[cls])]
  homes.append(("jax", layer_subclass.NAMESPACE))  # what the ports of flax layers' subclasses read
  header = (
    f'"""NNX port of {root_class.__module__}.{root_class.__qualname__}, '
    'drafted from its Linen source."""\n\n'
  )
  body, by_module = read_through_modules(body, homes)
  text = header + "\n".join(sorted({*imports(body, homes), *by_module})) + "\n\n\n" + body + "\n"
  filename = os.path.join(os.path.dirname(root_source.file), "_nnx_port_draft.py")
  text = format_source(text, filename)
  init_kwargs = _init_kwargs(linen_module, (), ctx)
  todos = tuple(
    sorted((t for cls in classes for t in ctx.ported[cls].todos), key=lambda t: (t.file, t.line))
  )
  changes = tuple(
    sorted(
      (
        ch
        for cls in classes
        for ch in (*ctx.ported[cls].changes, *(c for n in _NOTES for c in n(ctx, cls)))
      ),
      key=lambda ch: (ch.file, ch.line),
    )
  )
  literals = by_value(ctx, classes)
  result = Draft(
    literals=literals,
    input_sizes=input_axes(ctx, root_class),
    array_sizes=array_sizes(linen_module, all_calls),
    constants=by_value(ctx, classes, "constants"),
    shape_guards=tuple(t for cls in classes for t in ctx.ported[cls].shape_guards),
    has_settings=bool(settings(linen_module) or float_settings(linen_module)),
    source=text,
    root=root_class.__name__,
    init_kwargs=init_kwargs,
    todos=todos,
    changes=changes,
    check=None,
    linen_module=linen_module,
    calls=all_calls,
    variables=variables,
    filename=filename,
    unpaired=(*_opaque_insides(traced), *per_step_paths(traced, ctx.ported)),
    check_precision=check_precision,
    configs=tuple(
      (m, _init_kwargs(m, (), ctx, k))
      for k, (m, _) in enumerate(others, 1)
      if () in ctx.alt_traces[k - 1].instances
    ),
    config_labels=tuple(
      label for k, label in enumerate(labels, 1) if () in ctx.alt_traces[k - 1].instances
    ),
  )
  if check:
    result.check = _check(result)
  return result


def _port_one(src: ClassSource, ctx: Context) -> ClassPort:
  """The port of one class; a failure or unparsable output is one TODO for that class."""
  if (overridden := param_override.port(src, ctx)) is not None:
    return overridden  # a `param` override of a flax layer: the layer's NNX subclass
  why = layer_subclass_reason(src.cls)
  if why is not None:
    return fallback_port(src, why)
  inherited = user_base_class.reason(src.cls)
  # A subclass read as one class with its base (`field_only_subclass`, `inherited_fields`):
  # nothing is inherited from a Linen base then.
  if inherited is not None and not src.merged:
    return fallback_port(src, inherited)
  helpers = set(ctx.helpers)
  try:
    port = keep_name(mark_data(as_properties(keep_params(port_class(src, ctx), ctx), ctx), ctx))
  except PortError:
    raise
  except Exception as e:  # a defect of the drafter: the rest of the model still drafts
    ctx.helpers = helpers
    return fallback_port(src, class_failed_reason(src.cls, e))
  why = drafted_code_error(port.code)
  if why is not None:
    ctx.helpers = helpers
    return fallback_port(src, unparsable_reason(src.cls, why))
  return port


def _check(result: Draft) -> Check:
  try:
    built = result.port_and_variables()
  except Exception as e:
    verdict = build_failed(e)
    files = [ch.file for ch in result.changes]
    todo = failure_todo(e, result.filename, result.source, files)
    if todo is not None:
      object.__setattr__(result, "todos", (*result.todos, todo))
  else:
    verdict = check_class(result, compare_built(result, *built), *built)
    verdict = at_tied_sizes(result, at_setting_sizes(result, verdict))
  if verdict.equal:
    return verdict
  # Unequal because the sample call samples (seq2seq's decoder): said so, with what to check.
  sample = result.calls[0]
  return explained(verdict, result.linen_module, result.variables, sample, result.source)
