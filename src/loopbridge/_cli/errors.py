"""How a command fails: `CliError` (one line on stderr) and the exit statuses."""

from __future__ import annotations

SUCCESS = 0
FAILURE = 1  # the target or the model failed, or `compare` found a divergence
USAGE_ERROR = 2  # a malformed command line (argparse exits with 2 too)
INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


class CliError(Exception):
  """A failure reported as one line on stderr, with `code` as the exit status.

  Args:
    message: the line to print: what went wrong, why, and the fix.
    code: the exit status (`FAILURE` or `USAGE_ERROR`).

  Examples:
    >>> CliError("--arg 'x': expected DTYPE[DIM,...]", USAGE_ERROR).code
    2
  """

  def __init__(self, message: str, code: int = FAILURE):
    super().__init__(message)
    self.code = code
