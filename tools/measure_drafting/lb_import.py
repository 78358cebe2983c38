"""Importing this puts the measured loopbridge (`MEASURE_LOOPBRIDGE_SRC`) first on sys.path."""

import os
import sys

_SRC = os.environ.get("MEASURE_LOOPBRIDGE_SRC")
if _SRC and _SRC not in sys.path:
  sys.path.insert(0, _SRC)
