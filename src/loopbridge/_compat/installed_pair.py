"""The installed flax/jax pair: a pair that cannot import `flax.nnx` fails with the fix.

Runs before flax is imported (`_compat` calls `check_installed_pair` first), so it reads the
versions from package metadata and imports nothing of flax or jax.
"""

from __future__ import annotations

import importlib.metadata


def version_tuple(version: str) -> tuple[int, ...]:
  """`"0.12.8"` -> `(0, 12, 8)` (a suffix such as `rc1` is dropped)."""
  parts = []
  for piece in version.split(".")[:3]:
    digits = "".join(ch for ch in piece if ch.isdigit())
    parts.append(int(digits) if digits else 0)
  return tuple(parts)


# --- the installed flax/jax pair --------------------------------------------------------------
# flax's own `jax>=` bound has no upper end, so pip can pair an older flax with a jax that has
# removed what `from flax import nnx` imports (jax internals); the import then fails deep inside
# flax. Each row: (flax from, flax up to, first jax known to break it, the fix).
#   flax 0.11.0 imports `jax._src.core.mutable_array`, gone in jax 0.8.0;
#   flax 0.11.1 to 0.12.0 fall back to it when `jax.array_ref` is missing, both gone in jax 0.9.0;
#   flax 0.12.1 to 0.12.7 read `jax.core.Effect`, gone in jax 0.12.1 (0.12.0 untried);
#   flax 0.12.8 does not import with jax 0.11.2 (0.11.0 and 0.11.1 untried), nor flax 0.12.9
#   with jax 0.12.1 (`jax.experimental.hijax.HiPrimitive` gone; 0.11 untried);
#   flax 0.12.10 imports with jax 0.11.2 and 0.12.1, flax 0.12.12 with jax 0.12.1, and
#   loopbridge's suite passes on flax 0.12.12 + jax 0.12.1 (constraints/py313-newest.txt).
# flax 0.10.2 (jax 0.5.3) and 0.12.1 on (flax asks for jax >= 0.8.1) import with jax 0.10.2.
_BELOW = "install jax and jaxlib below {} as in the tested pair (constraints/{})"
_NEWEST = (
  "install flax 0.12.12 with jax 0.12.1 as in the tested pair (constraints/py313-newest.txt)"
)
_BROKEN_PAIRS: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], str], ...] = (
  (
    (0, 11, 0),
    (0, 11, 0),
    (0, 8, 0),
    _BELOW.format("0.8.0", "flax-0.11.txt: flax 0.11.2, jax 0.7.1"),
  ),
  (
    (0, 11, 1),
    (0, 11, 99),
    (0, 9, 0),
    _BELOW.format("0.9.0", "flax-0.11.txt: flax 0.11.2, jax 0.7.1"),
  ),
  (
    (0, 12, 0),
    (0, 12, 0),
    (0, 9, 0),
    _BELOW.format("0.9.0", "flax-0.12.0.txt: flax 0.12.0, jax 0.8.0"),
  ),
  (
    (0, 12, 1),
    (0, 12, 7),
    (0, 12, 1),
    _NEWEST,
  ),
  (
    (0, 12, 8),
    (0, 12, 8),
    (0, 11, 2),
    _NEWEST,
  ),
  (
    (0, 12, 9),
    (0, 12, 9),
    (0, 12, 1),
    _NEWEST,
  ),
)

_BROKEN_PAIR_MESSAGE = (
  "loopbridge: flax {flax} cannot import with jax {jax} (`from flax import nnx` fails with jax "
  "{jax_bad} and newer; flax's own bounds allow the pair); {fix}, or install flax 0.12.8 with "
  'jax 0.10.2 (constraints/newest.txt); see loopbridge\'s README, "Supported versions".'
)


def broken_pair_message(flax_version: str, jax_version: str) -> str | None:
  """One line naming a flax/jax pair that cannot import `flax.nnx`, and the fix; else None.

  Args:
    flax_version: the installed flax version string, e.g. "0.11.2".
    jax_version: the installed jax version string, e.g. "0.10.2".

  Returns:
    The error text for a known-broken pair, or None for a pair that imports.

  Example:
    >>> broken_pair_message("0.12.8", "0.10.2") is None
    True
    >>> print(broken_pair_message("0.11.2", "0.10.2"))  # doctest: +ELLIPSIS
    loopbridge: flax 0.11.2 cannot import with jax 0.10.2 ...constraints/flax-0.11.txt...
  """
  flax_v, jax_v = version_tuple(flax_version), version_tuple(jax_version)
  for flax_from, flax_to, jax_bad, fix in _BROKEN_PAIRS:
    if flax_from <= flax_v <= flax_to and jax_v >= jax_bad:
      return _BROKEN_PAIR_MESSAGE.format(
        flax=flax_version, jax=jax_version, jax_bad=".".join(map(str, jax_bad)), fix=fix
      )
  return None


def check_installed_pair() -> None:
  """Raise ImportError (one line) if the installed flax cannot import with the installed jax.

  Reads the installed versions from package metadata, without importing flax (whose
  `from flax import nnx` is what fails on such a pair). Missing metadata (a source checkout on
  `sys.path`) skips the check.

  Raises:
    ImportError: the installed pair is known not to import; the text names the fix.
  """
  try:
    flax_version = importlib.metadata.version("flax")
    jax_version = importlib.metadata.version("jax")
  except importlib.metadata.PackageNotFoundError:
    return
  message = broken_pair_message(flax_version, jax_version)
  if message is not None:
    raise ImportError(message)
