"""Options several subcommands share, and the argparse types of option values."""

from __future__ import annotations

import argparse
import typing as tp

if tp.TYPE_CHECKING:
  # What `add_subparsers` returns; each subcommand module registers itself with `add_parser`.
  Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


def positive_int(text: str) -> int:
  """An option value that must be an integer >= 1.

  Raises:
    argparse.ArgumentTypeError: `text` is not one (argparse prints it and exits 2).

  Examples:
    >>> positive_int("5")
    5
  """
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
  return value


def non_negative_float(text: str) -> float:
  """An option value that must be a number >= 0 (`inf` allowed, `nan` not).

  Raises:
    argparse.ArgumentTypeError: `text` is not one (argparse prints it and exits 2).

  Examples:
    >>> non_negative_float("1e-5")
    1e-05
  """
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
  if not value >= 0:  # also refuses nan
    raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
  return value


def add_call_options(parser: argparse.ArgumentParser, examples: str, calls: bool = False) -> None:
  """The sample call, the same options for every subcommand (`call_specs.read_call` reads
  them): `--arg SPEC` (repeatable, the positional inputs), `--kwarg NAME=VALUE` (repeatable,
  the keyword inputs), `--method NAME`, and with `calls` `--call SPEC` (repeatable, more calls
  to check)."""
  group = parser.add_argument_group(
    "the sample call",
    "the inputs both models take, as one forward call: --arg for each positional array, "
    "--kwarg for each keyword input (e.g. --kwarg train=False for a model with dropout), "
    "--method for another method than __call__",
  )
  group.add_argument(
    "--arg",
    action="append",
    default=None,
    metavar="SPEC",
    dest="args",
    help=f"a sample positional input as DTYPE[DIMS], e.g. {examples}; repeat for each input",
  )
  group.add_argument(
    "--kwarg",
    action="append",
    default=None,
    metavar="NAME=VALUE",
    dest="kwargs",
    help="a keyword input of the sample call, a Python literal or an array spec, e.g. "
    "'train=False' or 'mask=bool[2,8]'; repeatable",
  )
  group.add_argument(
    "--method", default=None, metavar="NAME", help="the Linen method to call (default: __call__)"
  )
  if calls:
    group.add_argument(
      "--call",
      action="append",
      default=None,
      metavar="SPEC",
      dest="calls",
      help="another call to check, e.g. 'float32[4,24] train=True' or "
      "'method=generate float32[3,8]'; repeatable",
    )


def add_precision_option(parser: argparse.ArgumentParser) -> None:
  """`--precision {highest,model}`: what the check runs both models at."""
  parser.add_argument(
    "--precision",
    choices=("highest", "model"),
    default="highest",
    help="what the check runs both models at: highest (default: under "
    "jax.default_matmul_precision('highest'), float32 matmuls on every backend, float32 "
    "tolerances) or model (their own precision, e.g. one bfloat16 pass on a TPU, with the "
    "looser tolerance that goes with it)",
  )


def add_common_options(parser: argparse.ArgumentParser, json_help: str) -> None:
  """`--seed`, `--json` and `--debug`, which every subcommand takes."""
  parser.add_argument("--seed", type=int, default=0, help="seed for parameters and inputs")
  parser.add_argument("--json", action="store_true", help=json_help)
  parser.add_argument("--debug", action="store_true", help="show tracebacks of failures")
