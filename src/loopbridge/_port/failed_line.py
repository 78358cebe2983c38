"""A port that does not build or run ends in a TODO naming the line that raised.

The check reports why it stopped; the draft's TODOs are the list of work left by hand, so a
drafted line that raises when the port is built or run (Linen machinery the draft did not see,
a name the port lacks) is one of them: the innermost drafted line of the traceback, named at
the Linen line it was drafted from where that line is unchanged in the draft, else at the
drafted line.
"""

from __future__ import annotations

import linecache
import traceback
import typing as tp

from .records import Todo


def failure_todo(
  error: BaseException, draft_file: str, source: str, linen_files: tp.Iterable[str]
) -> Todo | None:
  """The TODO for `error` raised building or running the drafted source (None: no drafted
  line in its traceback)."""
  found: tuple[BaseException, int] | None = None
  seen: set[int] = set()
  chain: BaseException | None = error
  while chain is not None and id(chain) not in seen:
    seen.add(id(chain))
    lines = [
      f.lineno for f in traceback.extract_tb(chain.__traceback__) if f.filename == draft_file
    ]
    if lines and lines[-1] is not None:
      found = (chain, lines[-1])  # the deepest exception of the chain with a drafted frame
    chain = chain.__cause__ or chain.__context__
  if found is None:
    return None
  raised, drafted_line = found
  drafted = source.splitlines()
  text = drafted[drafted_line - 1].strip() if drafted_line <= len(drafted) else ""
  if isinstance(raised, NotImplementedError) and str(raised).startswith("TODO(port)"):
    return None  # a TODO block raising (in either quote style): already a TODO of the draft
  file, line = _linen_line(text, linen_files) or (draft_file, drafted_line)
  reason = (
    f"the port raised {type(raised).__name__} here when built or run ({str(raised)[:200]}): "
    "a construct the draft did not translate; port this line by hand"
  )
  return Todo(file, line, reason, text)


def _linen_line(text: str, files: tp.Iterable[str]) -> tuple[str, int] | None:
  """The one Linen line whose text is `text` (None: none, or more than one)."""
  if not text:
    return None
  hits = [
    (file, k)
    for file in dict.fromkeys(files)
    for k, line in enumerate(linecache.getlines(file), 1)
    if line.strip() == text
  ]
  return hits[0] if len(hits) == 1 else None
