"""The `loopbridge` command line: argument parsing and dispatch to the subcommands.

Each subcommand is one module with `add_parser(commands)`, which registers its options and
sets `run` (`Namespace -> exit status`) as the parser's default; `COMMANDS` lists them. A new
subcommand is a new module and one entry there. `main` turns a `CliError`, a backend JAX
cannot start, and any other failure into one line on stderr and the exit status every
subcommand shares (`errors`: 0 equal/done, 1 the check failed, 2 usage or environment, 3 an
internal error; `--debug` adds the traceback).
"""

from __future__ import annotations

import argparse
import sys
import traceback
import typing as tp

from .._core.errors import first_line
from . import compare_cmd, convert_cmd, inspect_cmd, port_cmd
from .errors import INTERNAL_ERROR, INTERRUPTED, USAGE_ERROR, CliError, backend_failure

# The subcommands, in the order `--help` lists them.
COMMANDS = (inspect_cmd, compare_cmd, convert_cmd, port_cmd)


def build_parser() -> argparse.ArgumentParser:
  """The parser of the whole command line, every subcommand registered."""
  parser = argparse.ArgumentParser(
    prog="loopbridge",
    description="Tools for moving Flax Linen models to NNX loops with loopbridge.",
  )
  commands = parser.add_subparsers(dest="command", metavar="COMMAND")
  commands.required = True
  for command in COMMANDS:
    command.add_parser(commands)
  return parser


def main(argv: tp.Sequence[str] | None = None) -> int:
  """Run the `loopbridge` command line; returns the exit status.

  Returns:
    0 equal or done, 1 the check failed, 2 usage or environment, 3 an internal error, 130
    interrupted (`errors`).

  Raises:
    SystemExit: from argparse, for `--help` and a malformed command line (status 2).
  """
  ns = build_parser().parse_args(argv)
  run: tp.Callable[[argparse.Namespace], int] = ns.run
  try:
    return run(ns)
  except KeyboardInterrupt:
    print(f"loopbridge {ns.command}: interrupted", file=sys.stderr)
    return INTERRUPTED
  except Exception as e:
    if ns.debug:
      traceback.print_exc()
    # A backend JAX cannot start (another process holds the accelerator, or its library is
    # missing): an environment problem, whichever layer it surfaced in (a CliError quoting
    # it, or JAX's own RuntimeError).
    backend = backend_failure(e, ns.command)
    if backend is not None:
      print(f"loopbridge {ns.command}: error: {backend}", file=sys.stderr)
      return USAGE_ERROR
    if isinstance(e, CliError):
      print(f"loopbridge {ns.command}: error: {e}", file=sys.stderr)
      return e.code
    # A bug or an unforeseen failure: still one line, and a status of its own.
    print(
      f"loopbridge {ns.command}: error: unexpected {type(e).__name__}: {first_line(e)} "
      + ("(an internal error)" if ns.debug else "(run again with --debug for the traceback)"),
      file=sys.stderr,
    )
    return INTERNAL_ERROR
