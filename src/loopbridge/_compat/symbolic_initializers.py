"""Initializers that run on symbolic shapes, for the drafting wing's symbolic trace.

jax 0.12's variance-scaling initializers (`lecun_normal`, flax's default kernel init, and the
rest) test `denominator != 0` in Python, where the fans of a shape holding a `jax.export`
symbol are traced arrays: `TracerBoolConversionError`, so no kernel with a symbolic width could
be made abstractly. jax 0.5 to 0.10 compute the fans as symbolic dimensions and need nothing.
The symbolic trace only reads shapes, so inside `symbolic_safe_initializers()` the fans of a
shape holding a symbol are 1 (the scale of the values, never their shape); concrete shapes
keep jax's own fans.

flax's `DenseGeneral` (the query, key, value and output projections of every Linen attention)
flattens its kernel's shape with `np.prod` and `int` before calling the initializer: `np.prod`
of an empty tuple is the float `1.0`, which turns a symbol times it into a traced array, and
`int` of a symbol raises. So an attention's input width could never be a symbol, and its port
kept the sample's width. Inside `symbolic_safe_initializers()` that module's `np.prod` is an
integer product and its `int` lets a symbol through; concrete shapes flatten as before.

A symbol raised to a float power (an attention's `head_dim ** -0.5`) is a traced float array
inside `symbolic_safe_initializers()`, not an error: a scale, whose value the trace never reads.

An initializer that needs numbers (`orthogonal`'s QR decomposition, jaxrl's default kernel
init) makes a param of a symbolic shape as zeros of that shape inside
`symbolic_safe_initializers()`; a concrete shape, or another failure, is left to raise.
"""

from __future__ import annotations

import contextlib
import math
import typing as tp

import numpy as np


@contextlib.contextmanager
def symbolic_safe_initializers() -> tp.Iterator[None]:
  from flax.linen import linear  # DenseGeneral's module

  with (
    _symbolic_safe_fans(),
    _symbolic_safe_params(),
    _symbolic_float_powers(),
    symbolic_safe_modules([linear]),
  ):
    yield


@contextlib.contextmanager
def _symbolic_float_powers() -> tp.Iterator[None]:
  """A symbol raised to a float (`(self.dim // self.num_heads) ** -0.5`, an attention's
  scale) is the traced float array of its value raised so: a value, never a shape, and one no
  shape can be made of (a shape from it fails as before). jax raises for any non-integer
  power of a symbolic dimension, so a setting an attention scales by could not be a symbol."""
  try:
    from jax._src.export import shape_poly
  except ImportError:  # nothing to make safe on a JAX without that module
    yield
    return
  dim = getattr(shape_poly, "_DimExpr", None)
  real = getattr(dim, "__pow__", None)
  if dim is None or real is None:
    yield
    return

  def power(self: tp.Any, exponent: tp.Any) -> tp.Any:
    if isinstance(exponent, (int, np.integer)) or hasattr(exponent, "_sorted_terms"):
      return real(self, exponent)
    import jax.numpy as jnp

    return jnp.asarray(self, dtype=jnp.float32) ** exponent

  dim.__pow__ = power
  try:
    yield
  finally:
    dim.__pow__ = real


def _symbolic(shape: object) -> bool:
  return (
    isinstance(shape, tuple)
    and all(map(_dimension, shape))
    and not all(isinstance(d, (int, np.integer)) for d in shape)
  )


@contextlib.contextmanager
def _symbolic_safe_params() -> tp.Iterator[None]:
  """A param whose initializer fails on a symbolic shape (`orthogonal`'s QR needs numbers) is
  made as zeros of that shape: the trace reads its shape and dtype, never its values."""
  from flax.core import scope

  real = scope.Scope.param

  def param(self: tp.Any, name: str, init_fn: tp.Any, *init_args: tp.Any, **kw: tp.Any) -> tp.Any:
    def safe(rng: tp.Any, *args: tp.Any, **kwargs: tp.Any) -> tp.Any:
      try:
        return init_fn(rng, *args, **kwargs)
      except Exception:
        shape = args[0] if args else kwargs.get("shape")
        if not _symbolic(shape):
          raise
        import jax.numpy as jnp

        dtype = args[1] if len(args) > 1 else kwargs.get("dtype", jnp.float32)
        return jnp.zeros(shape, dtype)

    return real(self, name, safe, *init_args, **kw)

  scope.Scope.param = param  # pyright: ignore[reportAttributeAccessIssue]
  try:
    yield
  finally:
    scope.Scope.param = real


class _IntegerProducts:
  """numpy, except that `prod` of a shape is an integer (`1` for `()`, not `1.0`), so a symbol
  times it stays a symbol."""

  def __init__(self, numpy: tp.Any):
    self._numpy = numpy

  def __getattr__(self, name: str) -> tp.Any:
    return getattr(self._numpy, name)

  def prod(self, a: tp.Any, *args: tp.Any, **kwargs: tp.Any) -> tp.Any:
    if isinstance(a, tuple) and not args and not kwargs and all(map(_dimension, a)):
      return math.prod(a)
    return self._numpy.prod(a, *args, **kwargs)


def _dimension(d: tp.Any) -> bool:
  return isinstance(d, (int, np.integer)) or type(d).__name__ == "_DimExpr"


class _IntType(type):
  # The module's `isinstance(k, int)` checks (a kernel size given as one int) keep working.
  def __instancecheck__(cls, obj: object) -> bool:
    return isinstance(obj, int)

  def __subclasscheck__(cls, sub: type) -> bool:
    return issubclass(sub, int)


class _IntOrSymbol(metaclass=_IntType):
  """`int` for the module's conversions, except that a symbol stays a symbol."""

  def __new__(cls, value: tp.Any = 0, *args: tp.Any) -> tp.Any:
    return value if type(value).__name__ == "_DimExpr" else int(value, *args)


@contextlib.contextmanager
def symbolic_safe_modules(modules: tp.Iterable[tp.Any]) -> tp.Iterator[None]:
  """In each module, `int` lets a symbol through and numpy's `prod` of a shape is an integer,
  until the block ends: a user's `in_dim = int(x.shape[-1])` (score_sde's `NIN`) then reads
  a symbolic width as the symbol, as flax's own `DenseGeneral` does."""
  saved: list[tuple[tp.Any, str, tp.Any]] = []
  try:
    for module in modules:
      names = vars(module)
      saved.append((module, "int", names.get("int", _ABSENT)))
      names["int"] = _IntOrSymbol
      if names.get("np") is np:
        saved.append((module, "np", np))
        names["np"] = _IntegerProducts(np)
    yield
  finally:
    for module, name, value in reversed(saved):
      if value is _ABSENT:
        vars(module).pop(name, None)
      else:
        vars(module)[name] = value


_ABSENT = object()


@contextlib.contextmanager
def _symbolic_safe_fans() -> tp.Iterator[None]:
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
