"""mkdocs hook: serve the guides of `migration_guides/` as the site's `guides/` pages.

The guides stay where the tests execute them (sybil, `migration_guides/conftest.py`); the
site reads them from there at build time instead of from a checked-in copy. The guides'
`README.md` (their index) becomes `guides/index.md`; images next to them come along.
"""

from __future__ import annotations

import pathlib

from mkdocs.structure.files import File, Files

GUIDES = pathlib.Path(__file__).resolve().parents[1] / "migration_guides"
PAGE_SUFFIXES = {".md", ".png", ".svg", ".jpg"}


def on_files(files: Files, config) -> Files:
  for path in sorted(GUIDES.iterdir()):
    if path.suffix not in PAGE_SUFFIXES:
      continue
    name = "index.md" if path.name == "README.md" else path.name
    files.append(File.generated(config, f"guides/{name}", abs_src_path=str(path)))
  return files
