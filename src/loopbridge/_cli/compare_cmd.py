"""`loopbridge compare OLD NEW`: `lb.compare` of a Linen model and its NNX port.

The port runs with the Linen params (loaded by name, `lb.layers`' `load_into_port`) or, with
`--weights random`, with its own (structure, shapes and dtypes compared, not values). Exit
status: 0 the port agrees; 1 a divergence, or a target or model that failed; 2 a malformed
command line.
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
from . import inputs, options
from .errors import FAILURE, SUCCESS, CliError
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
      "its attributes must be named like the Linen submodules (self.Dense_0 = "
      "nnx.Linear(...); a list self.layers[0] matches Linen's layers_0). --weights random "
      "keeps the port's own initialization (to check structure and shapes only). Exit "
      "status: 0 the port agrees; 1 a divergence was found, or a target or model failed "
      "(the message says which); 2 malformed command line."
    ),
  )
  c.add_argument("old", metavar="OLD_TARGET", help="the Linen original: package.module:attribute")
  c.add_argument("new", metavar="NEW_TARGET", help="the NNX port: package.module:attribute")
  options.add_arg_option(c, "'float32[1,100]'")
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


def load_linen_params(port: nnx.Module, variables: tp.Mapping[str, object]) -> int:
  """Write the Linen variables into the port's Variables at the same paths; returns how many.

  Raises:
    CliError: the port does not fit the Linen params (`load_into_port`'s message).
  """
  try:
    return param_layout.load_into_port(port, variables, hint=NAMES_HINT)
  except StackError as e:
    raise CliError(f"cannot load the Linen params into NEW_TARGET: {e}") from e


def run(ns: argparse.Namespace) -> int:
  """`loopbridge compare`: the report on stdout; 0 when the port agrees, else 1."""
  specs = [inputs.parse_arg_spec(t) for t in (ns.args or [])]
  with progress("importing the models"):
    module: linen.Module = load_linen_target(ns.old, command="compare", what="OLD_TARGET")
    port = load_nnx_target(ns.new, ns.seed)
  args = inputs.sample_inputs(specs, ns.seed)
  try:
    with progress("initializing the Linen model"):
      variables = linen.Module.init(module, jax.random.key(ns.seed), *args)
  except Exception as e:
    raise CliError(
      f"OLD_TARGET {type(module).__name__} cannot run on the given inputs "
      f"({inputs.describe(specs)}): {type(e).__name__}: {first_line(e)}"
      + ("" if specs else inputs.NO_INPUTS_HINT)
    ) from e
  if ns.weights == "linen":
    load_linen_params(port, variables)
  try:
    with progress("running both models"):
      # Each model keeps its own random weights: their values cannot agree, so only the
      # structure, shapes and dtypes are compared (an infinite atol compares no values).
      atol = math.inf if ns.weights == "random" else ns.atol
      report = lb.compare(
        (module, variables), port, *args, rtol=ns.rtol, atol=atol, precision=ns.precision
      )
  except lb.CompareError as e:
    raise CliError(str(e).removeprefix("lb.compare: ")) from e
  if ns.json:
    print(json.dumps(report.to_dict(), indent=2))
  else:
    print(str(report))
  if ns.plot:
    from .._diagnostics.compare_plot import plot_report

    try:
      plot_report(report, ns.plot)
    except (ImportError, ValueError) as e:
      raise CliError(f"--plot: {e}") from e
  return SUCCESS if report.ok else FAILURE
