"""How a command fails: `CliError` (one line on stderr) and the exit statuses.

Every subcommand exits with the same statuses, so a CI gate can tell them apart:

- 0 (`SUCCESS`): equal, or done.
- 1 (`FAILURE`): the check failed: the port diverges, does not fit the Linen model's weights,
  a draft is not checked equal, a conversion is refused, the live loop check fails.
- 2 (`USAGE_ERROR`): the command line or the environment: a malformed option, a target that
  cannot be imported or built, inputs the model does not take, a checkpoint directory that
  does not hold what the models describe, a backend JAX cannot start (argparse exits 2 too).
- 3 (`INTERNAL_ERROR`): an unforeseen failure, a bug; `--debug` prints its traceback.
- 130 (`INTERRUPTED`): Ctrl-C, as a shell reports SIGINT.
"""

from __future__ import annotations

import re

SUCCESS = 0
FAILURE = 1  # the check failed: the port diverges, a conversion or draft is refused
USAGE_ERROR = 2  # the command line or the environment (argparse exits with 2 too)
INTERNAL_ERROR = 3  # an unforeseen failure (a bug): `--debug` shows its traceback
INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT

# One line each, for `--help` epilogs and the guide (tests read them from here).
EXIT_STATUS_HELP = (
  "Exit status (the same for every subcommand): 0 equal or done; 1 the check failed (the "
  "port diverges or does not fit, a draft or conversion is refused, the loop check fails); "
  "2 usage or environment (options, targets, inputs, files, a backend JAX cannot start); "
  "3 an internal error (run again with --debug for the traceback)."
)


class CliError(Exception):
  """A failure reported as one line on stderr, with `code` as the exit status.

  Args:
    message: the line to print: what went wrong, why, and the fix.
    code: the exit status: `USAGE_ERROR` (the default: options, targets, inputs, files) or
      `FAILURE` (the check failed).

  Examples:
    >>> CliError("--arg 'x': expected DTYPE[DIM,...]").code
    2
  """

  def __init__(self, message: str, code: int = USAGE_ERROR):
    super().__init__(message)
    self.code = code


# JAX's error when a backend does not start: "Unable to initialize backend 'tpu': ...". When
# another process holds the accelerator, libtpu's lock file on a TPU VM ("ABORTED: Internal
# error when accessing libtpu multi-process lockfile ...") or a GPU already taken in exclusive
# mode ("busy", "unavailable").
_BACKEND_FAILED = re.compile(r"Unable to initialize backend '(?P<backend>[\w-]+)'")
_HELD = re.compile(r"lockfile|lock file|busy|unavailable|already in use", re.IGNORECASE)
BACKEND_BUSY = (
  "JAX could not open the {backend!r} backend: another process holds it (a notebook, a "
  "training job or another loopbridge; the chip admits one process at a time). Fix: run this "
  "command on the CPU, `JAX_PLATFORMS=cpu loopbridge {command} ...`, or close the other "
  "process."
)
BACKEND_FAILED = (
  "JAX could not start the {backend!r} backend ({why}). Fix: run this command on the CPU, "
  "`JAX_PLATFORMS=cpu loopbridge {command} ...`, or install what that backend needs (e.g. "
  "`pip install 'jax[tpu]'` for a TPU, `jax[cuda12]` for a GPU) and unset JAX_PLATFORMS if "
  "it names a backend this machine lacks."
)


def backend_failure(error: BaseException, command: str) -> str | None:
  """The one-line message for `error` when it (or an error it came from) says that JAX could
  not start a backend (held by another process, or missing); None otherwise."""
  seen: set[int] = set()
  current: BaseException | None = error
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    text = str(current)
    found = _BACKEND_FAILED.search(text)
    if found:
      if _HELD.search(text):
        return BACKEND_BUSY.format(backend=found["backend"], command=command)
      why = " ".join(text[found.end() :].strip(" :").split())[:200] or "no reason given"
      return BACKEND_FAILED.format(backend=found["backend"], why=why, command=command)
    current = current.__cause__ or current.__context__
  return None
