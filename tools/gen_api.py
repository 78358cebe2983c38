"""Generate docs/api.md, the API reference, from the docstrings of `loopbridge.__all__`.

Usage:
  python tools/gen_api.py          # rewrite docs/api.md
  python tools/gen_api.py --check  # exit 1 if docs/api.md is out of date (tests do the same)
"""

from __future__ import annotations

import inspect
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
API_MD = ROOT / "docs" / "api.md"

HEADER = """\
# API reference

Everything `loopbridge` exports (`loopbridge.__all__`), generated from the docstrings by
`python tools/gen_api.py`; a test fails when this page is out of date or a public name lacks its
documentation. Each `Example:` below is executed by the test suite (doctest). Guides:
[migration_guides/](../migration_guides/README.md).

```text
import loopbridge as lb
```
"""


def kind(obj: object) -> str:
  if isinstance(obj, type) and issubclass(obj, Warning):
    return "Warnings"
  if isinstance(obj, type) and issubclass(obj, BaseException):
    return "Exceptions"
  if isinstance(obj, type):
    return "Classes"
  return "Functions"


def summary(obj: object) -> str:
  """The docstring's first paragraph, on one line."""
  doc = inspect.getdoc(obj) or ""
  first = doc.split("\n\n", 1)[0]
  return " ".join(first.split())


def signature(name: str, obj: object) -> str:
  target = obj
  if isinstance(obj, type):
    if issubclass(obj, BaseException):
      return f"class {name}({', '.join(b.__name__ for b in obj.__bases__)})"
    target = obj.__init__ if "__init__" in vars(obj) else None
  try:
    sig = inspect.signature(target) if target is not None else None
  except (TypeError, ValueError):
    sig = None
  text = "" if sig is None else str(sig)
  if isinstance(obj, type):
    text = re.sub(r"^\(self,?\s*", "(", text)
    return f"class {name}{text}"
  # Default values that print with a memory address would make the page change on every run.
  return f"{name}{re.sub(r' at 0x[0-9a-f]+', '', text)}"


def body(obj: object) -> str:
  doc = inspect.getdoc(obj) or ""
  parts = doc.split("\n\n", 1)
  return parts[1].strip() if len(parts) > 1 else ""


def render() -> str:
  import loopbridge

  names = sorted(loopbridge.__all__, key=lambda n: (n.lower(), n))
  groups: dict[str, list[str]] = {}
  for name in names:
    groups.setdefault(kind(getattr(loopbridge, name)), []).append(name)

  out = [HEADER]
  out.append("## Index\n")
  for group in ("Classes", "Functions", "Exceptions", "Warnings"):
    if group not in groups:
      continue
    out.append(f"**{group}**\n")
    for name in groups[group]:
      out.append(f"- [`lb.{name}`](#lb{name.lower()}) — {summary(getattr(loopbridge, name))}")
    out.append("")
  for group in ("Classes", "Functions", "Exceptions", "Warnings"):
    if group not in groups:
      continue
    out.append(f"## {group}\n")
    for name in groups[group]:
      obj = getattr(loopbridge, name)
      out.append(f"### lb.{name}\n")
      out.append(f"```text\n{signature(name, obj)}\n```\n")
      out.append(summary(obj) + "\n")
      rest = body(obj)
      if rest:
        out.append(f"```text\n{rest}\n```\n")
  return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
  text = render()
  if "--check" in argv:
    if not API_MD.exists() or API_MD.read_text() != text:
      print(f"{API_MD.relative_to(ROOT)} is out of date: run python tools/gen_api.py")
      return 1
    return 0
  API_MD.parent.mkdir(exist_ok=True)
  API_MD.write_text(text)
  print(f"wrote {API_MD.relative_to(ROOT)} ({len(text.splitlines())} lines)")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
