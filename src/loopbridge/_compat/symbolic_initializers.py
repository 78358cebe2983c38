"""Initializers that run on symbolic shapes, for the drafting wing's symbolic trace.

jax 0.12's variance-scaling initializers (`lecun_normal`, flax's default kernel init, and the
rest) test `denominator != 0` in Python, where the fans of a shape holding a `jax.export`
symbol are traced arrays: `TracerBoolConversionError`, so no kernel with a symbolic width could
be made abstractly. jax 0.5 to 0.10 compute the fans as symbolic dimensions and need nothing.
The symbolic trace only reads shapes, so inside `symbolic_safe_initializers()` the fans of a
shape holding a symbol are 1 (the scale of the values, never their shape); concrete shapes
keep jax's own fans.
"""

from __future__ import annotations

import contextlib
import typing as tp


@contextlib.contextmanager
def symbolic_safe_initializers() -> tp.Iterator[None]:
  try:
    from jax._src.nn import initializers
  except ImportError:  # nothing to make safe on a JAX without that module
    yield
    return
  real = getattr(initializers, "_compute_fans", None)
  if real is None:
    yield
    return

  def fans(shape: tp.Sequence[tp.Any], *args: tp.Any, **kwargs: tp.Any) -> tp.Any:
    if all(isinstance(d, int) for d in shape):
      return real(shape, *args, **kwargs)
    return 1.0, 1.0

  initializers._compute_fans = fans
  try:
    yield
  finally:
    initializers._compute_fans = real
