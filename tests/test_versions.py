"""The installed flax/jax pair: pairs that cannot import `flax.nnx` fail at `import loopbridge`.

flax's own `jax>=` bound has no upper end, so pip pairs e.g. flax 0.11.2 with jax 0.10.2, and
`from flax import nnx` then fails deep inside flax. loopbridge checks the pair from package
metadata first and names the fix in one line.
"""

import importlib.metadata
import pathlib
import re
import subprocess
import sys

import pytest

from loopbridge import _compat

from conftest import child_env

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _pinned(path: pathlib.Path) -> dict[str, str]:
  """The `name==version` pins of a constraints file (independent of the code under test)."""
  pins = {}
  for line in path.read_text().splitlines():
    if m := re.fullmatch(r"\s*([A-Za-z0-9_.-]+)==([0-9.]+)\s*", line):
      pins[m.group(1).lower()] = m.group(2)
  return pins


TESTED = sorted((ROOT / "constraints").glob("*.txt"))


@pytest.mark.parametrize("path", TESTED, ids=[p.name for p in TESTED])
def test_every_tested_pair_passes_the_check(path):
  pins = _pinned(path)
  assert _compat.broken_pair_message(pins["flax"], pins["jax"]) is None


def test_the_five_tested_pairs_are_there():
  pairs = {(p["flax"], p["jax"]) for p in map(_pinned, TESTED)}
  assert pairs == {("0.10.2", "0.5.3"), ("0.11.2", "0.7.1"), ("0.12.0", "0.8.0"),
                   ("0.12.8", "0.10.2"), ("0.12.12", "0.12.1")}  # fmt: skip


def test_readme_lists_every_constraints_file():
  readme = (ROOT / "README.md").read_text()
  section = readme[readme.index("## Supported versions") :]
  for path in TESTED:
    assert f"constraints/{path.name}" in section, path.name


@pytest.mark.parametrize(
  ("flax", "jax", "fix"),
  [
    ("0.11.2", "0.10.2", "constraints/flax-0.11.txt"),  # what pip picks with no constraints
    ("0.11.1", "0.9.0", "constraints/flax-0.11.txt"),
    ("0.11.0", "0.8.0", "constraints/flax-0.11.txt"),  # 0.11.0 needs jax._src.core.mutable_array
    ("0.12.0", "0.9.2", "constraints/flax-0.12.0.txt"),
    ("0.12.0", "0.10.2", "constraints/flax-0.12.0.txt"),
    ("0.12.8", "0.11.2", "constraints/py313-newest.txt"),  # a GPU image's jax under pip's flax
    ("0.12.8", "0.12.1", "constraints/py313-newest.txt"),  # the newest jax under an older flax
    ("0.12.4", "0.12.1", "constraints/py313-newest.txt"),
    ("0.12.9", "0.12.1", "constraints/py313-newest.txt"),
  ],
)
def test_broken_pair_names_the_pair_and_the_fix(flax, jax, fix):
  message = _compat.broken_pair_message(flax, jax)
  assert message is not None
  assert "\n" not in message
  assert f"flax {flax} cannot import with jax {jax}" in message
  assert fix in message
  assert "constraints/newest.txt" in message


@pytest.mark.parametrize(
  ("flax", "jax"),
  [
    ("0.11.0", "0.7.2"),
    ("0.11.2", "0.8.3"),
    ("0.12.0", "0.8.3"),
    ("0.12.1", "0.10.2"),
    ("0.12.10", "0.11.2"),  # the GPU image's pair
    ("0.12.10", "0.12.1"),
    ("0.12.12", "0.12.1"),  # the newest pair (constraints/py313-newest.txt)
  ],
)
def test_pairs_that_import_pass(flax, jax):
  assert _compat.broken_pair_message(flax, jax) is None


def test_check_reads_installed_metadata(monkeypatch):
  fake = {"flax": "0.12.0", "jax": "0.10.2"}
  monkeypatch.setattr(importlib.metadata, "version", lambda name: fake[name])
  with pytest.raises(
    ImportError, match=r"^loopbridge: flax 0\.12\.0 cannot import with jax 0\.10\.2 .*flax-0\.12\.0"
  ):
    _compat.check_installed_pair()


def test_check_passes_on_this_environment():
  _compat.check_installed_pair()


@pytest.mark.slow
def test_import_fails_before_flax_is_imported(tmp_path):
  # A broken pair in package metadata, and a `flax` whose import fails the way a broken pair's
  # `from flax import nnx` does: `import loopbridge` must stop at the check, in one line.
  for name, version in (("flax", "0.11.2"), ("jax", "0.10.2")):
    info = tmp_path / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
  (tmp_path / "flax").mkdir()
  (tmp_path / "flax" / "__init__.py").write_text("raise ImportError('deep inside flax')\n")
  env = child_env(str(tmp_path), str(ROOT / "src"))
  proc = subprocess.run(
    [sys.executable, "-c", "import loopbridge"], capture_output=True, text=True, env=env
  )
  assert proc.returncode == 1
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("ImportError: loopbridge: flax 0.11.2 cannot import with jax 0.10.2")
  assert "constraints/flax-0.11.txt" in last
  assert "deep inside flax" not in proc.stderr
