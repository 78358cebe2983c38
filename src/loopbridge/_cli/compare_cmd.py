"""`loopbridge compare OLD NEW`: `lb.compare` of a Linen model and its NNX port.

The port runs with the Linen params (loaded by name, `lb.layers`' `load_into_port`; where the
names differ, paired by the two models' calls, `linen_to_nnx(check=False)`, and the report
says which pairings are unproven) or, with `--weights random`, with its own (structure,
shapes and dtypes compared, not values). The sample call is given by the options every
subcommand shares (`--arg`, `--kwarg`, `--method`). Exit status (`errors`): 0 the port
agrees; 1 a divergence, or a port that does not fit the Linen weights; 2 usage or
environment; 3 an internal error.
"""

from __future__ import annotations

import argparse
import json
import math
import typing as tp

import jax
from flax import linen, nnx

import loopbridge as lb

from .._core.errors import StackError, first_line
from .._layers import param_layout
from . import call_specs, inputs, options
from .errors import EXIT_STATUS_HELP, FAILURE, SUCCESS, CliError
from .loading import load_linen_target, load_nnx_target
from .output import progress

if tp.TYPE_CHECKING:
  from .options import Subcommands

NAMES_HINT = (
  "Name the port's attributes like the Linen submodules (self.Dense_0 = "
  "nnx.Linear(...); a list self.layers[0] for Linen's layers_0), or run with --weights "
  "random to compare structure and shapes only."
)


def add_parser(commands: Subcommands) -> None:
  """Register `compare` and its options."""
  c = commands.add_parser(
    "compare",
    help="find the first module where an NNX port diverges from its Linen original",
    description=(
      "Run a Linen model (OLD_TARGET) and its NNX port (NEW_TARGET) on the same sample "
      "inputs, record every module call on both sides, align them and print where the "
      "port first diverges (lb.compare)."
    ),
    epilog=(
      "OLD_TARGET is package.module:attribute naming a Linen module instance, a Linen "
      "module class with no required fields, or a function taking no arguments that "
      "returns one; its params are initialized with --seed. NEW_TARGET names an NNX "
      "module instance, or a class or function building one from no arguments or from "
      "`rngs` alone. With --weights linen (default) the port receives the Linen params: "
      "its attributes are named like the Linen submodules (self.Dense_0 = "
      "nnx.Linear(...); a list self.layers[0] matches Linen's layers_0), or else the weights "
      "are paired by the two models' calls, and the report says which pairings are "
      "unproven. --weights random keeps the port's own initialization (to check structure "
      "and shapes only). Its rng streams, batch statistics and other state are kept or "
      "loaded by collection. " + EXIT_STATUS_HELP
    ),
  )
  c.add_argument("old", metavar="OLD_TARGET", help="the Linen original: package.module:attribute")
  c.add_argument("new", metavar="NEW_TARGET", help="the NNX port: package.module:attribute")
  options.add_call_options(c, "'float32[1,100]'")
  c.add_argument(
    "--weights",
    choices=("linen", "random"),
    default="linen",
    help="the port's params: the Linen model's (default), or its own (random: values are "
    "not compared, only structure, shapes and dtypes; --atol is ignored)",
  )
  c.add_argument(
    "--rtol",
    type=options.non_negative_float,
    default=None,
    help="relative tolerance (default: per dtype, backend and --precision: float32 1e-5, 1e-4 "
    "on a TPU; at --precision model 5e-3 on a GPU with TensorFloat-32 matmuls, 3e-2 on a TPU; "
    "the report says which)",
  )
  c.add_argument(
    "--atol",
    type=options.non_negative_float,
    default=None,
    help="absolute tolerance (default: per dtype and backend, as --rtol, times each output's "
    "scale: the 99th percentile of its finite magnitudes, mask values left out)",
  )
  options.add_precision_option(c)
  c.add_argument(
    "--plot",
    metavar="FILE",
    default=None,
    help="also draw the max abs error of each aligned call to FILE (.png, .svg, .pdf; "
    "needs matplotlib: pip install loopbridge[plot])",
  )
  options.add_common_options(c, "print the report as one JSON document")
  c.set_defaults(run=run)


# Keyword parameters of `lb.compare` itself: a model input of one of these names cannot be
# passed through its `**kwargs`.
COMPARE_PARAMETERS = ("rtol", "atol", "mapping", "precision", "method")


def load_linen_params(port: nnx.Module, variables: tp.Mapping[str, object]) -> int:
  """Write the Linen variables into the port's Variables at the same paths; returns how many.

  Raises:
    CliError: the port does not fit the Linen params (`load_into_port`'s message).
  """
  try:
    return param_layout.load_into_port(port, variables, hint=NAMES_HINT)
  except StackError as e:
    raise CliError(f"cannot load the Linen params into NEW_TARGET: {e}", FAILURE) from e


def load_weights(
  module: linen.Module,
  variables: tp.Mapping[str, object],
  port: nnx.Module,
  args: tp.Sequence[object],
  kwargs: tp.Mapping[str, object],
  method: str | None,
  precision: tp.Literal["highest", "model"],
) -> lb.checkpoint.ConversionReport | None:
  """The Linen variables into the port: by name, else paired by the two models' calls.

  Returns:
    None when every param loaded by name; else the report of the pairing by calls
    (`linen_to_nnx(check=False)`: what the evidence could not decide took its first
    candidate, and the port is filled even where its output differs: the report says so).

  Raises:
    CliError: (the check failed) neither way fits the port to the Linen variables.
  """
  try:
    load_linen_params(port, variables)
    return None
  except CliError as by_name:
    try:
      with progress("pairing the Linen weights with the port by the models' calls"):
        return lb.checkpoint.linen_to_nnx(
          module,
          variables,
          port,
          *args,
          sample_kwargs=dict(kwargs),
          method=method,
          precision=precision,
          check=False,
        )
    except lb.checkpoint.CheckpointError as by_calls:
      why = " ".join(str(by_calls).split())
      why = why if len(why) <= 400 else why[:400] + "..."
      raise CliError(
        f"{by_name} (Pairing by the models' calls failed too: {why})", FAILURE
      ) from by_calls


def paired_by_calls_text(report: lb.checkpoint.ConversionReport) -> str:
  """The note printed above the comparison when the weights were paired by calls."""
  return (
    "weights: the port's attribute names differ from the Linen submodules', so the Linen "
    f"weights were paired by the two models' calls:\n{report}\n"
  )


def run(ns: argparse.Namespace) -> int:
  """`loopbridge compare`: the report on stdout; 0 when the port agrees, else 1."""
  call = call_specs.read_call(ns)
  with progress("importing the models"):
    module: linen.Module = load_linen_target(ns.old, command="compare", what="OLD_TARGET")
    port = load_nnx_target(ns.new, ns.seed)
  call.check_method(module, "OLD_TARGET ")
  call.check_method(port, "NEW_TARGET ")
  args = call.args(ns.seed)
  kwargs = call.kwargs(ns.seed, reserved=COMPARE_PARAMETERS, owner="lb.compare")
  try:
    with progress("initializing the Linen model"):
      key = jax.random.key(ns.seed)  # a dropout stream too, for a call in training mode
      variables = linen.Module.init(
        module, {"params": key, "dropout": key}, *args, method=call.method, **kwargs
      )
  except Exception as e:
    hint = ("" if call.specs else inputs.NO_INPUTS_HINT) or call_specs.missing_argument_hint(e)
    raise CliError(
      f"OLD_TARGET {type(module).__name__} cannot run on the given inputs "
      f"({call.described()}): {type(e).__name__}: {first_line(e)}" + hint
    ) from e
  paired = None
  if ns.weights == "linen":
    paired = load_weights(module, variables, port, args, kwargs, call.method, ns.precision)
  try:
    with progress("running both models"):
      # Each model keeps its own random weights: their values cannot agree, so only the
      # structure, shapes and dtypes are compared (an infinite atol compares no values).
      atol = math.inf if ns.weights == "random" else ns.atol
      report = lb.compare(
        (module, variables),
        port,
        *args,
        rtol=ns.rtol,
        atol=atol,
        precision=ns.precision,
        method=call.method,
        **kwargs,
      )
  except lb.CompareError as e:
    raise CliError(str(e).removeprefix("lb.compare: "), FAILURE) from e
  if ns.json:
    doc = report.to_dict()
    doc["weights"] = {
      "source": ns.weights,
      "paired_by": None if ns.weights == "random" else "name" if paired is None else "calls",
      "pairing": None if paired is None else paired.to_dict(),
    }
    print(json.dumps(doc, indent=2))
  else:
    if paired is not None:
      print(paired_by_calls_text(paired))
    print(str(report))
  if ns.plot:
    from .._diagnostics.compare_plot import plot_report

    try:
      plot_report(report, ns.plot)
    except (ImportError, ValueError) as e:
      raise CliError(f"--plot: {e}") from e
  return SUCCESS if report.ok else FAILURE
