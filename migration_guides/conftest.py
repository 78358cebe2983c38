"""Execute every ```python block of every guide in this directory with sybil.

Each guide runs top to bottom in one namespace (one pytest item per block, in order), so a
guide is a script a reader can paste. Blocks assert their own results with `assert`. Code that
must not run is written in a ```bash or ```text block instead: there is no skip marker. A
Python program that cannot run in this process (e.g. one process of a multi-host job) is a
```py block: shown with highlighting, not executed (the parser runs ```python only).
"""

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

pytest_collect_file = Sybil(
  parsers=[PythonCodeBlockParser()],
  patterns=["*.md"],
).pytest()
