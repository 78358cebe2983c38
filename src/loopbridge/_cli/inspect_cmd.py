"""`loopbridge inspect`: what a Linen model sows, what recording it costs, a live loop check.

The command wraps the model with `lb.ToNNX`, initializes it on sample inputs, and prints the
sow-site table (`lb.sow_sites`), sows Linen drops, buffer memory, parameter sizes, and then
runs the model in a jitted `nnx.while_loop` twice (`live_check`): wrapped with stock
`flax.nnx.bridge.ToNNX` called the way a user calls it, and with `lb.ToNNX`. `--capture
FILTER` also records submodule outputs (`capture_intermediates`), the way to record a model
that never calls `sow`; the report counts them apart from the model's own sows. Everything the
text shows is also available as one JSON document (`inspect_report.InspectReport`).

Exit status: 0 success; 1 the target or the model failed (import, attribute, inputs, loop,
including a target that calls `sys.exit` while importing); 2 a malformed command line (TARGET
or --arg syntax, a dtype JAX arrays cannot have, option values). With `--json`, stdout holds
the JSON document only: whatever the model prints goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import typing as tp
import warnings

from flax import linen, nnx

import loopbridge as lb

from .. import _compat
from .._core import buffers
from .._core.errors import first_line
from . import call_specs, default_model, inputs, live_check, options
from .errors import EXIT_STATUS_HELP, FAILURE, SUCCESS, USAGE_ERROR, CliError
from .inspect_report import InspectReport, ParameterSize, SiteCounts, render_text, sites_headline
from .loading import load_linen_target
from .output import progress, stdout_to_stderr

if tp.TYPE_CHECKING:
  from .options import Subcommands

# flax >= 0.12 shards partition-annotated params (nn.with_logical_partitioning) when they are
# created, which needs a mesh; the command has none to give. lb.ToNNX's ShardingError says so
# and how to get past it in Python; this says how from the shell.
NO_MESH = (
  "{model} cannot create its partition-annotated params without a mesh: {message} "
  "Fix here: pass --no-eager-sharding (the params are created unsharded, as flax 0.10 did; "
  "what the model sows does not depend on it)."
)


def add_parser(commands: Subcommands) -> None:
  """Register `inspect` and its options."""
  p = commands.add_parser(
    "inspect",
    help="show a Linen model's sow sites, buffer memory and a live loop check",
    description=(
      "Wrap a Linen model with lb.ToNNX, list its sow sites (shapes, sows per call, "
      "enclosing nn.scan/nn.vmap), sows Linen drops, buffer memory and parameter sizes, "
      "then run it in a jitted nnx.while_loop with stock flax.nnx.bridge.ToNNX (and "
      "explain why that fails) and with lb.ToNNX (counting what it recorded)."
    ),
    epilog=(
      "TARGET is package.module:attribute where attribute is a Linen module instance, a "
      "Linen module class with no required fields, or a function taking no arguments "
      "that returns one. Without TARGET: a built-in MLP (a sow at the top level and "
      "inside nn.scan; width 100, depth 3; input float32[1,100]). Inputs: floats are "
      "standard normal (seeded), integers zeros, bools True. " + EXIT_STATUS_HELP
    ),
  )
  p.add_argument(
    "target",
    nargs="?",
    metavar="TARGET",
    help="package.module:attribute (default: a built-in MLP that sows)",
  )
  options.add_call_options(p, "'float32[1,100]', 'int32[1,16]', 'bool[]'")
  p.add_argument(
    "--capture",
    default=None,
    metavar="FILTER",
    help="also record submodule outputs (Linen capture_intermediates): 'all' for "
    "every submodule's __call__, or module class names, comma-separated "
    "(e.g. 'EncoderBlock,Dense'); for models that never call sow",
  )
  p.add_argument(
    "--capacity",
    type=options.positive_int,
    default=None,
    help="values each sow buffer holds (default: --steps)",
  )
  p.add_argument(
    "--steps",
    type=options.positive_int,
    default=5,
    help="loop steps of the live check (default: 5)",
  )
  p.add_argument(
    "--no-eager-sharding",
    action="store_true",
    help="create partition-annotated params (nn.with_logical_partitioning) unsharded, as "
    "flax 0.10 did (nnx.use_eager_sharding(False)): flax >= 0.12 shards them at creation, "
    "which needs a mesh",
  )
  options.add_common_options(p, "print one JSON document instead")
  p.set_defaults(run=run)


class CaptureFilter:
  """`--capture`: Linen's `capture_intermediates` filter for `all` or module class names.

  Like Linen's `capture_intermediates=True`, it captures `__call__` outputs only. It remembers
  which module classes ran and which (path, method) it captured, so the report can tell a
  model's own sows from captures and say when a class name matched nothing.

  Raises:
    CliError: (usage) a filter that is neither `all` nor class names.
  """

  def __init__(self, text: str):
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or not all(n.isidentifier() for n in names):
      raise CliError(
        f"--capture {text!r}: expected 'all' or module class names separated by "
        "commas, e.g. --capture EncoderBlock,Dense",
        code=USAGE_ERROR,
      )
    self.text = text
    self.names = None if names == ["all"] else set(names)
    self.seen: set[str] = set()
    self.captured: set[tuple[str, ...]] = set()

  def __call__(self, module: linen.Module, method_name: str) -> bool:
    kind = type(module).__name__
    self.seen.add(kind)
    take = method_name == "__call__" and (self.names is None or kind in self.names)
    if take and module.scope is not None:
      self.captured.add(("intermediates", *module.scope.path, method_name))
    return take

  def check_matched(self) -> None:
    """Raises CliError (usage) when a class name matched no module that ran."""
    if self.names is None:
      return
    missing = sorted(self.names - self.seen)
    if missing:
      raise CliError(
        f"--capture {self.text!r}: no module of class {', '.join(missing)} runs in this call, "
        f"so nothing would be captured; the module classes that run are: "
        f"{', '.join(sorted(self.seen)) or 'none'}. Fix: name one of them, or --capture all",
        code=USAGE_ERROR,
      )


def _parameter_sizes(model: nnx.Module) -> dict[str, ParameterSize]:
  """Arrays, values and bytes per Linen collection (buffers, counts and RNG state excluded)."""
  sizes: dict[str, ParameterSize] = {}
  seen: set[int] = set()
  for _, node in _compat.iter_graph(model):
    if not isinstance(node, nnx.Variable) or id(node) in seen:
      continue
    seen.add(id(node))
    if isinstance(node, (buffers.Buffer, buffers.Count, nnx.RngState)):
      continue
    value = _compat.variable_value(node)
    if not hasattr(value, "shape"):
      continue
    entry = sizes.setdefault(
      _compat.collection_name(type(node)), {"arrays": 0, "values": 0, "bytes": 0}
    )
    entry["arrays"] += 1
    entry["values"] += int(math.prod(value.shape))
    entry["bytes"] += int(math.prod(value.shape)) * value.dtype.itemsize
  return dict(sorted(sizes.items()))


def inspect_model(
  module: linen.Module,
  specs: tp.Sequence[inputs.ArgSpec],
  *,
  method: str | None,
  capacity: int,
  steps: int,
  seed: int,
  target: str | None,
  description: str | None,
  capture: str | None = None,
  kwargs: tp.Mapping[str, tp.Any] | None = None,
) -> InspectReport:
  """Everything `loopbridge inspect` reports, as one JSON-ready dict.

  `kwargs` are the sample call's keyword inputs (`--kwarg`), made into values already.

  Raises:
    CliError: no such `method`, a bad `capture` filter, or a model that cannot run on the
      inputs (the live check's failures are part of the report instead).
  """
  if method is not None and not callable(getattr(module, method, None)):
    raise CliError(f"{type(module).__name__} has no method {method!r} (--method)")
  kwargs = dict(kwargs or {})
  call_kwargs: dict[str, tp.Any] = {"method": method} if method is not None else {}
  call_kwargs.update(kwargs)
  args = inputs.sample_inputs(specs, seed)
  capture_filter = CaptureFilter(capture) if capture is not None else None
  model = lb.ToNNX(
    module, rngs=nnx.Rngs(seed), capture_intermediates=capture_filter if capture_filter else False
  )
  try:
    with progress("initializing the model"), warnings.catch_warnings():
      # Dropped sows are listed in the report itself.
      warnings.simplefilter("ignore", lb.DroppedSowWarning)
      lb.lazy_init(model, *args, capacity=capacity, **call_kwargs)
  except lb.sharding.ShardingError as e:
    # The whole message: its Python fix is on later lines, and the switch is the shell's.
    message = " ".join(str(e).split())
    raise CliError(NO_MESH.format(model=type(module).__name__, message=message)) from e
  except Exception as e:
    hint = ("" if specs else inputs.NO_INPUTS_HINT) or call_specs.missing_argument_hint(e)
    given = inputs.describe(specs) + "".join(f", --kwarg {k}=..." for k in kwargs)
    raise CliError(
      f"{type(module).__name__} cannot run on the given inputs ({given}"
      f"{f', --method {method}' if method else ''}): {type(e).__name__}: {first_line(e)}" + hint
    ) from e
  sites = lb.sow_sites(model)
  captured: set[tuple[str, ...]] = set()
  if capture_filter is not None:
    capture_filter.check_matched()
    captured = capture_filter.captured
  sows = {s.sow_key for s in sites if s.sow_key not in captured}
  counts: SiteCounts = {
    "sow_sites": len(sows),
    "captured_outputs": len({s.sow_key for s in sites} - sows),
    "buffers": len(sites),
    "dropped_sows": len(sites.dropped),
  }
  sites_doc = sites.to_dict()
  entries = sites_doc["sites"]
  assert isinstance(entries, list)  # one dict per site, in the order of `sites`
  for entry, site in zip(entries, sites):
    entry["captured"] = site.sow_key in captured
  table = sites.table().splitlines()
  # lb.sow_sites' headline counts every buffer a site; the filter knows which are captures.
  table[0] = sites_headline(sites.model, counts, sites.buffer_bytes, capture is not None)
  counts_bytes = 4 * len(sites)
  model_sows = bool(sows) or bool(sites.dropped)
  return {
    "target": target,
    "description": description,
    "model": type(module).__name__,
    "inputs": [str(s) for s in specs],
    "method": method,
    "keyword_inputs": sorted(kwargs),
    "capture": capture,
    "capacity": capacity,
    "steps": steps,
    "versions": _compat.installed_versions(),
    "sow_sites": sites_doc,
    "site_counts": counts,
    "buffer_memory": {
      "buffers_bytes": sites.buffer_bytes,
      "counts_bytes": counts_bytes,
      "total_bytes": sites.buffer_bytes + counts_bytes,
    },
    "parameters": _parameter_sizes(model),
    "live_check": {
      "stock": live_check.stock_check(module, args, method, steps, seed, model_sows, kwargs),
      "loopbridge": live_check.loopbridge_check(model, args, method, steps, kwargs),
    },
    "sow_sites_table": "\n".join(table),
  }


def run(ns: argparse.Namespace) -> int:
  """`loopbridge inspect`: the report on stdout; 0 when `lb.ToNNX` ran the loop, else 1."""
  if ns.target is None:
    target, description = None, default_model.DESCRIPTION
    call = call_specs.read_call(ns, default_model.DEFAULT_ARGS)
  else:
    target, description = ns.target, None
    call = call_specs.read_call(ns)
  with stdout_to_stderr() if ns.json else contextlib.nullcontext():
    with progress("importing the model"):
      module = default_model.default_model() if target is None else load_linen_target(target)
    eager = _compat.no_eager_sharding() if ns.no_eager_sharding else contextlib.nullcontext()
    with eager:
      doc = inspect_model(
        module,
        call.specs,
        method=call.method,
        capacity=ns.capacity if ns.capacity is not None else ns.steps,
        steps=ns.steps,
        seed=ns.seed,
        target=target,
        description=description,
        capture=ns.capture,
        kwargs=call.kwargs(ns.seed, reserved=()),
      )
  if ns.json:
    doc.pop("sow_sites_table", None)
    print(json.dumps(doc, indent=2))
  else:
    print(render_text(doc))
  return SUCCESS if doc["live_check"]["loopbridge"]["ok"] else FAILURE
