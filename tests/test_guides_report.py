"""A failing guide block is reported with its traceback, whatever the traceback's depth."""

from __future__ import annotations

import functools
import typing as tp

import pytest
from sybil import example as sybil_example
from sybil.integration.pytest import SybilItem

from migration_guides.conftest import whole_traceback_on_index_error

# The `self` of sybil's unbound filter: it reads nothing of its item.
NO_ITEM = tp.cast(tp.Any, None)


def _failure_whose_deepest_frame_is_sybil_s_example_frame() -> pytest.ExceptionInfo:
  # Code that runs as if it were a line of sybil's example module: the traceback's first frame
  # in that module is then its deepest one.
  code = compile("raise ValueError('the block failed')", sybil_example.__file__, "exec")
  with pytest.raises(ValueError, match="the block failed") as excinfo:
    exec(code, {})
  return excinfo


def test_sybil_s_own_filter_cannot_report_it():
  """The defect worked around: if sybil reports such a failure itself, this test fails and the
  workaround in migration_guides/conftest.py can go."""
  excinfo = _failure_whose_deepest_frame_is_sybil_s_example_frame()
  with pytest.raises(IndexError):
    SybilItem._traceback_filter(NO_ITEM, excinfo)


def test_the_guides_filter_reports_the_whole_traceback():
  excinfo = _failure_whose_deepest_frame_is_sybil_s_example_frame()
  sybil_filter = functools.partial(SybilItem._traceback_filter, NO_ITEM)
  shown = whole_traceback_on_index_error(sybil_filter)(excinfo)
  assert [entry.lineno for entry in shown] == [entry.lineno for entry in excinfo.traceback]
  assert len(shown) == 2  # this test's frame and the failing line
