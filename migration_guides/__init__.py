"""Marks this directory as a package so its `conftest.py` imports as `migration_guides.conftest`.

Without it pytest would import it as a top-level `conftest` module and shadow `tests/conftest.py`,
from which test modules import shared helpers (`from conftest import graph_kw`).
"""
