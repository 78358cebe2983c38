"""How a command fails: `CliError` (one line on stderr) and the exit statuses."""

from __future__ import annotations

import re

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


# JAX's error when another process holds the accelerator: libtpu's lock file on a TPU VM
# ("Unable to initialize backend 'tpu': ABORTED: Internal error when accessing libtpu
# multi-process lockfile ..."); a GPU already taken in exclusive mode reads "busy" or
# "unavailable".
_BACKEND_FAILED = re.compile(r"Unable to initialize backend '(?P<backend>[\w-]+)'")
_HELD = re.compile(r"lockfile|lock file|busy|unavailable|already in use", re.IGNORECASE)
BACKEND_BUSY = (
  "JAX could not open the {backend!r} backend: another process holds it (a notebook, a "
  "training job or another loopbridge; the chip admits one process at a time). Fix: run this "
  "command on the CPU, `JAX_PLATFORMS=cpu loopbridge {command} ...`, or close the other "
  "process."
)


def busy_backend(error: BaseException, command: str) -> str | None:
  """The one-line message for `error` when it (or an error it came from) says that another
  process holds the accelerator; None otherwise."""
  seen: set[int] = set()
  current: BaseException | None = error
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    text = str(current)
    found = _BACKEND_FAILED.search(text)
    if found and _HELD.search(text):
      return BACKEND_BUSY.format(backend=found["backend"], command=command)
    current = current.__cause__ or current.__context__
  return None
