"""Execute every ```python block of every guide in this directory with sybil.

Each guide runs top to bottom in one namespace (one pytest item per block, in order), so a
guide is a script a reader can paste. Blocks assert their own results with `assert`. Code that
must not run is written in a ```bash or ```text block instead: there is no skip marker. A
Python program that cannot run in this process (e.g. one process of a multi-host job) is a
```py block: shown with highlighting, not executed (the parser runs ```python only).
"""

import os

import pytest

# Tests compile many tiny XLA programs: LLVM's optimization level barely changes their run
# time but is a quarter of the suite's. Set before the first JAX computation creates the CPU
# backend (which reads XLA_FLAGS once); a level the caller chose is kept. Benchmarks do not
# load this file.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
  ).strip()

from sybil import Sybil
from sybil.integration.pytest import SybilItem
from sybil.parsers.markdown import PythonCodeBlockParser

pytest_collect_file = Sybil(
  parsers=[PythonCodeBlockParser()],
  patterns=["*.md"],
).pytest()


# The drafting guide drafts and checks seven models, each at two configurations (a minute or
# more on one worker, and `--dist loadfile` keeps a guide on one worker): it runs with the slow
# tests, which CI runs on every supported end; the other guides stay in the default run.
SLOW_GUIDES = frozenset({"drafting_the_port.md"})


def pytest_configure(config):
  # tests/conftest.py describes the marker; a run of the guides alone loads only this file.
  config.addinivalue_line("markers", "slow: left out of a plain run (see tests/conftest.py)")


def whole_traceback_on_index_error(sybil_filter):
  """sybil's traceback filter, showing the traceback whole where it cannot re-root it.

  sybil's pytest item re-roots a failure's traceback at the frame below its own example frame
  and assumes there is one: where the example frame is the deepest, building the report raises
  IndexError, and under pytest-xdist that stops the worker with an INTERNALERROR that hides the
  block's own error (sybil 10.1, simplistix/sybil#118).
  """

  def traceback_filter(excinfo):
    try:
      return sybil_filter(excinfo)
    except IndexError:
      return excinfo.traceback

  return traceback_filter


@pytest.hookimpl(tryfirst=True)  # before the slow tests are deselected and `-m` filters
def pytest_collection_modifyitems(items):
  for item in items:
    if item.path.name in SLOW_GUIDES:
      item.add_marker(pytest.mark.slow)
    if isinstance(item, SybilItem):
      item._traceback_filter = whole_traceback_on_index_error(item._traceback_filter)
