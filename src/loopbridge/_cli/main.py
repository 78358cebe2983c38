"""The `loopbridge` command line: argument parsing and dispatch to the subcommands.

Each subcommand is one module with `add_parser(commands)`, which registers its options and
sets `run` (`Namespace -> exit status`) as the parser's default; `COMMANDS` lists them. A new
subcommand is a new module and one entry there. `main` turns a `CliError` (and any other
failure, unless `--debug`) into one line on stderr and an exit status.
"""

from __future__ import annotations

import argparse
import sys
import traceback
import typing as tp

from .._core.errors import first_line
from . import compare_cmd, convert_cmd, inspect_cmd, port_cmd
from .errors import FAILURE, INTERRUPTED, USAGE_ERROR, CliError, busy_backend

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
    # Another process holds the accelerator: say so and how to run anyway, whichever layer
    # the backend's start failed in (a CliError quoting it, or JAX's own RuntimeError).
    busy = None if ns.debug else busy_backend(e, ns.command)
    if busy is not None:
      print(f"loopbridge {ns.command}: error: {busy}", file=sys.stderr)
      return USAGE_ERROR
    if isinstance(e, CliError):
      if ns.debug:
        traceback.print_exc()
      print(f"loopbridge {ns.command}: error: {e}", file=sys.stderr)
      return e.code
    if ns.debug:  # a bug or an unforeseen failure: still one line unless --debug
      raise
    print(
      f"loopbridge {ns.command}: error: unexpected {type(e).__name__}: {first_line(e)} "
      "(run again with --debug for the traceback)",
      file=sys.stderr,
    )
    return FAILURE
