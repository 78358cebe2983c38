"""The public surface: a short top level, families in namespaces, every public name documented.

The API reference (docs/reference/*.md, rendered by mkdocstrings) documents names with
`::: loopbridge.<name>` lines, or a whole namespace with `::: loopbridge.<namespace>` (its
`__all__`). A public name missing there would be missing from the site.
"""

from __future__ import annotations

import pathlib
import re

import pytest

import loopbridge as lb

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMESPACES = {
  "layers": lb.layers,
  "checkpoint": lb.checkpoint,
  "sharding": lb.sharding,
  "port": lb.port,
}
# Importable for annotations (what compile_step / explain return), not star-exported.
TYPES_OUTSIDE_ALL = {"CompiledStep", "StructureReport"}


def test_top_level_is_short():
  # 0.3 added lb.recording and lb.ParamsReinitializedWarning.
  assert len(lb.__all__) <= 28, sorted(lb.__all__)
  assert len(set(lb.__all__)) == len(lb.__all__)


def test_every_listed_name_exists():
  for name in lb.__all__:
    assert hasattr(lb, name), name
  for ns_name, ns in NAMESPACES.items():
    assert ns.__all__, ns_name
    for name in ns.__all__:
      assert hasattr(ns, name), f"lb.{ns_name}.{name}"


def test_namespaces_are_modules_of_the_package():
  for ns_name, ns in NAMESPACES.items():
    assert ns.__name__ == f"loopbridge.{ns_name}"
    assert getattr(lb, ns_name) is ns


@pytest.mark.parametrize(
  "old",
  [
    "stack",
    "unstack",
    "layer",
    "scan_layers",
    "layers_to_scanned",
    "scanned_to_layers",
    "params_to_nnx",
    "nnx_to_params",
    "StackError",
    "save_checkpoint",
    "restore_checkpoint",
    "from_linen_variables",
    "load_linen_variables",
    "CheckpointError",
    "shard_buffers",
    "ShardingError",
    "NotInitializedError",
    "SowMismatchError",
  ],
)
def test_old_top_level_names_are_gone(old):
  assert not hasattr(lb, old), f"lb.{old} moved (see CHANGELOG.md)"


def test_errors_share_the_base():
  errors = [getattr(lb, n) for n in lb.__all__ if n.endswith("Error")]
  errors += [lb.layers.StackError, lb.checkpoint.CheckpointError, lb.sharding.ShardingError]
  errors += [lb.port.PortError]
  for error in errors:
    assert issubclass(error, lb.LoopbridgeError), error


def _documented() -> set[str]:
  found = set()
  for page in (ROOT / "docs" / "reference").glob("*.md"):
    found.update(re.findall(r"^::: loopbridge\.([\w.]+)\s*$", page.read_text(), flags=re.M))
  return found


def test_every_public_name_is_in_the_api_reference():
  documented = _documented()
  missing = [n for n in [*lb.__all__, *TYPES_OUTSIDE_ALL] if n not in documented]
  missing += [f"{ns}.*" for ns in NAMESPACES if ns not in documented]
  assert not missing, f"not in docs/reference/*.md: {missing}"


def test_no_private_names_documented():
  assert not [n for n in _documented() if any(part.startswith("_") for part in n.split("."))]


def _public_exceptions() -> dict[str, type[BaseException]]:
  """Every public exception and warning, by the name the docs give it (`lb.x` / `lb.ns.x`)."""
  found = {}
  for prefix, ns in [("", lb), *((f"{name}.", ns) for name, ns in NAMESPACES.items())]:
    for name in ns.__all__:
      obj = getattr(ns, name)
      if isinstance(obj, type) and issubclass(obj, BaseException):
        found[f"loopbridge.{prefix}{name}"] = obj
  return found


def test_every_public_exception_shows_its_public_name():
  import importlib
  import traceback

  exceptions = _public_exceptions()
  assert {"loopbridge.sharding.ShardingError", "loopbridge.port.PortError"} <= set(exceptions)
  for public, cls in exceptions.items():
    module, _, name = public.rpartition(".")
    assert f"{cls.__module__}.{cls.__qualname__}" == public
    assert repr(cls) == f"<class '{public}'>"
    assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls
    shown = traceback.format_exception_only(cls, cls("message"))[-1]
    assert shown == f"{public}: message\n", (module, name, shown)
