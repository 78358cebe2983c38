"""`python -m loopbridge` / the `loopbridge` script: see `loopbridge inspect --help` and
`loopbridge compare --help`."""

from __future__ import annotations

import sys
import typing as tp

from ._cli.main import main as _cli_main


def main(argv: tp.Sequence[str] | None = None) -> int:
  """Run the `loopbridge` command line and return its exit status (the script exits with it).

  Args:
    argv: the arguments after the program name; default `sys.argv[1:]`.

  Returns:
    0 on success, 1 when the target or the model failed (or `compare` found a divergence), 2
    for a malformed command line (an error is one line on stderr; `--debug` adds the
    traceback).

  Raises:
    SystemExit: from argparse, for `--help` and for unknown options (status 2).

  Examples:
    >>> from loopbridge.__main__ import main
    >>> main(["inspect", "--arg", "float32(1,100)"])  # malformed input spec
    2
  """
  return _cli_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
  sys.exit(main())
