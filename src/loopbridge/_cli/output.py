"""What a command writes besides its report: progress notes, and stdout kept for `--json`."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import typing as tp

PROGRESS_DELAY = 0.5  # seconds of silence before a progress note appears on stderr


@contextlib.contextmanager
def progress(
  label: str, stream: tp.TextIO | None = None, delay: float | None = None
) -> tp.Iterator[None]:
  """Note on stderr what is running if it takes longer than `delay` seconds.

  Off a terminal the note is one line. On a terminal it is a live timer that ends its line
  when the work is done, so the report printed next starts a line of its own even when stdout
  and stderr are one stream (`2>&1`, a terminal log). Stdout is flushed before a note, so a
  merged stream keeps what was printed before it above it.

  Args:
    label: what is running, e.g. `"initializing the model"`.
    stream: where the note goes (default `sys.stderr`).
    delay: seconds before a note appears (default `PROGRESS_DELAY`).

  Examples:
    >>> import io
    >>> out = io.StringIO()
    >>> with progress("waiting", stream=out, delay=60.0):
    ...   pass
    >>> out.getvalue()
    ''
  """
  out = stream if stream is not None else sys.stderr
  delay = PROGRESS_DELAY if delay is None else delay
  done = threading.Event()
  start = time.perf_counter()
  tty = hasattr(out, "isatty") and out.isatty()
  live: list[bool] = []  # set when a live timer was shown: it still has to end its line

  def text() -> str:
    return f"\rloopbridge: {label}... {time.perf_counter() - start:.1f}s"

  def run() -> None:
    if done.wait(delay):
      return
    with contextlib.suppress(ValueError, OSError):  # a closed or detached stdout
      sys.stdout.flush()
    if not tty:
      out.write(f"loopbridge: {label}...\n")
      out.flush()
      return
    live.append(True)
    while not done.wait(0.1):
      out.write(text())
      out.flush()

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()
    if live:
      out.write(text() + "\n")
      out.flush()


@contextlib.contextmanager
def stdout_to_stderr() -> tp.Iterator[None]:
  """Send what the model prints to stderr, so stdout holds only the `--json` document.

  Python `print`, `jax.debug.print` and C extensions writing to file descriptor 1 alike: the
  descriptor itself is pointed at stderr for the duration, then restored.
  """
  sys.stdout.flush()
  real_out, real_err = sys.__stdout__, sys.__stderr__
  fd = saved = None
  if real_out is not None and real_err is not None:  # None in an embedded interpreter
    try:
      fd, saved = real_out.fileno(), os.dup(real_out.fileno())
    except (AttributeError, OSError, ValueError):  # no real stdout (captured)
      fd, saved = None, None
    else:
      real_out.flush()
      os.dup2(real_err.fileno(), fd)
  try:
    with contextlib.redirect_stdout(sys.stderr):
      yield
  finally:
    sys.stderr.flush()
    if fd is not None and saved is not None:
      os.dup2(saved, fd)
      os.close(saved)
