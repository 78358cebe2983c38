"""`loopbridge port TARGET`: draft the NNX port of a Linen model, write it, and check it.

`lb.port.draft` rewrites the Linen classes' source into NNX and checks the drafted port
against the Linen model on the sample call and every `--call`. The command writes the source
(`-o FILE`, by default `<module>_nnx.py` in the current directory, never over an existing file
unless `--force`), prints the report (each change, each TODO, the measured verdict) and exits
0 only when the port is checked equal with no TODO left; 1 when the check fails, cannot run, or
a TODO remains (the file is still written, for finishing by hand); 2 for usage or environment
(the command line, a target or inputs that do not fit); 3 an internal error (`errors`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing as tp

from . import call_specs, inputs, options
from .errors import EXIT_STATUS_HELP, FAILURE, SUCCESS, USAGE_ERROR, CliError
from .loading import load_linen_target
from .output import progress

if tp.TYPE_CHECKING:
  from .options import Subcommands


def add_parser(commands: Subcommands) -> None:
  """Register `port` and its options."""
  p = commands.add_parser(
    "port",
    help="draft the NNX port of a Linen model, write it and check it equal",
    description=(
      "Read the Linen model's classes, rewrite them into NNX (submodules built in "
      "__init__ with their input widths, nnx.Param/BatchStat/Cache, nnx.List, nnx.scan "
      "stacks for nn.scan; comments, docstrings and your own code kept), then build the "
      "draft, convert the Linen variables into it and compare it with the Linen model on "
      "the sample call "
      "and every --call (lb.port.draft). Prints the report: each change (file:line old -> "
      "new), each place left as '# TODO(port)' and the measured verdict."
    ),
    epilog=(
      "TARGET is package.module:attribute naming a Linen module instance, a Linen module "
      "class with no required fields, or a function taking no arguments that returns one. "
      "Inputs: floats are standard normal (seeded), integers zeros, bools True. "
      "--kwarg and --call values are Python literals (True, 3, 0.5, 'text', None) or array "
      "specs; a --call is one quoted string: array specs first, then NAME=VALUE, and "
      f"method=NAME for another method ({call_specs.CALL_EXAMPLE}). The draft is "
      "ok (status 0) when it is checked equal on every call and nothing is left as TODO; "
      "a check that fails or cannot run, or a TODO left (its file:line is printed), is "
      "status 1. " + EXIT_STATUS_HELP
    ),
  )
  p.add_argument("target", metavar="TARGET", help="the Linen model: package.module:attribute")
  options.add_call_options(p, "'float32[4,24]', 'int32[2,8]'", calls=True)
  p.add_argument(
    "-o",
    "--output",
    default=None,
    metavar="FILE",
    help="where to write the drafted source (default: <module>_nnx.py in the current directory)",
  )
  p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
  options.add_precision_option(p)
  options.add_common_options(p, "print the report as one JSON document")
  p.set_defaults(run=run)


def _output_path(target: str, output: str | None, force: bool) -> str:
  if output is None:
    module_name = target.partition(":")[0].rsplit(".", 1)[-1]
    output = f"{module_name}_nnx.py"
  if os.path.isdir(output):
    raise CliError(f"-o {output!r} is a directory; name the file to write", USAGE_ERROR)
  if os.path.exists(output) and not force:
    raise CliError(
      f"{output!r} exists (a draft you may have edited); pass -o NEW_FILE, or --force to "
      "overwrite it"
    )
  return output


def _todo_lines(draft: tp.Any) -> list[str]:
  return [f"{t.file}:{t.line}: TODO(port): {t.reason}" for t in draft.todos]


def _document(draft: tp.Any, path: str) -> dict[str, object]:
  check = draft.check
  return {
    "ok": draft.ok,
    "root": draft.root,
    "file": path,
    "changes": [
      {"file": c.file, "line": c.line, "old": c.old, "new": c.new, "why": c.why}
      for c in draft.changes
    ],
    "todos": [
      {"file": t.file, "line": t.line, "reason": t.reason, "original": t.original}
      for t in draft.todos
    ],
    "check": None
    if check is None
    else {
      "precision": draft.check_precision,
      "equal": check.equal,
      "first_divergence": check.first_divergence,
      "error": check.error,
      "calls": [r.to_dict() for r in check.reports],
    },
  }


def run(ns: argparse.Namespace) -> int:
  """`loopbridge port`: writes the draft, prints the report; 0 only when the draft is ok."""
  import loopbridge as lb
  from loopbridge._port.draft import build_failed, compare_built

  sample = call_specs.read_call(ns)
  kwargs = sample.kwargs(ns.seed, reserved=call_specs.DRAFT_PARAMETERS)
  with progress("importing the model"):
    module = load_linen_target(ns.target, command="port")
  # After the target: a misspelled TARGET is reported as such, not as an existing output file.
  path = _output_path(ns.target, ns.output, ns.force)
  sample.check_method(module, "")
  args = sample.args(ns.seed)
  calls = []
  for i, spec in enumerate(sample.calls):
    call_seed = ns.seed + i + 1  # each call gets inputs of its own
    call_args = inputs.sample_inputs(spec.args, call_seed)
    call_kwargs = call_specs.keyword_values(spec.kwargs, call_seed, reserved=())
    calls.append(lb.port.Call(*call_args, method=spec.method, **call_kwargs))
  try:
    with progress("tracing the Linen model and rewriting its classes"):
      draft = lb.port.draft(
        module,
        *args,
        method=sample.method,
        calls=tuple(calls),
        check=False,
        check_precision=ns.precision,
        **kwargs,
      )
  except lb.port.PortError as e:  # e.g. the model fails on the inputs, a class without source
    # The draft could not be made (a class without source, a model failing on the inputs):
    # the check cannot run, status 1 as for a draft not checked equal.
    hint = ("" if sample.specs else inputs.NO_INPUTS_HINT) or call_specs.missing_argument_hint(e)
    raise CliError(str(e) + hint, FAILURE) from e
  # The check in its phases, as `lb.port.draft(check=True)` runs it, each with its own note.
  built = None
  with progress("building the port and converting the Linen variables into it"):
    try:
      built = draft.port_and_variables()
    except Exception as e:  # reported as the check's verdict, as draft() reports it
      draft.check = build_failed(e)
  if built is not None:
    port, variables = built
    with progress(f"comparing the port with Linen on {len(draft.calls)} call(s)"):
      draft.check = compare_built(draft, port, variables)
  draft.write(path)
  if ns.json:
    print(json.dumps(_document(draft, os.path.abspath(path)), indent=2))
  else:
    print(draft.report())
    print(f"wrote {os.path.abspath(path)}")
  if draft.ok:
    return SUCCESS
  for line in _todo_lines(draft):
    print(f"loopbridge port: {line}", file=sys.stderr)
  check = draft.check
  if check is not None and not check.equal:
    why = check.error or check.first_divergence or "not equal"
    print(f"loopbridge port: the draft is not checked equal: {why}", file=sys.stderr)
  return FAILURE
