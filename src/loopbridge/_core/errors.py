"""Exception and warning types raised by loopbridge.

All public: the everyday ones are re-exported by the package; `StackError`,
`CheckpointError` and `ShardingError` by the namespace of the functions that raise them
(`lb.layers`, `lb.checkpoint`, `lb.sharding`). Each public class sets `__module__` to where
the docs name it, so tracebacks and reprs show `loopbridge.sharding.ShardingError`, not this
private module. `first_line` is how a one-line report (the command line, `lb.compare`) quotes
an error raised elsewhere.
"""

from __future__ import annotations


class LoopbridgeError(Exception):
  """Base class of every error loopbridge raises on purpose."""

  __module__ = "loopbridge"


class CapacityError(LoopbridgeError, ValueError):
  """A `capacity=` or `overflow=` declaration that cannot be used (bad type, value or key)."""

  __module__ = "loopbridge"


class BufferOverflowError(LoopbridgeError, RuntimeError):
  """Reading back a buffer under `overflow="error"` after more values were sown than it holds."""

  __module__ = "loopbridge"


class NotDeclaredError(LoopbridgeError, RuntimeError):
  """The buffers this needs were not declared.

  Either the model (or a part of it) is used before `lb.lazy_init` / `lb.preallocate`
  declared any buffers, or a call sows at a site, or with a shape or dtype, that its
  declaration does not cover. The fix is the same for both: declare for this call with
  `lb.lazy_init` / `lb.preallocate` and the call's sample arguments.
  """

  __module__ = "loopbridge"


class StructureChangeError(LoopbridgeError, ValueError):
  """The model is used in a loop in a way NNX loops forbid.

  Either a call would change the model's variable structure (a new sow site, a new
  collection), or a recording call runs in a JAX trace that is not the model's: the model was
  closed over (by a `jax.lax` loop body, a jit wrapper) instead of carried through, so what it
  records could not leave that trace.
  """

  __module__ = "loopbridge"


class ForeignTraceError(StructureChangeError):
  """The `StructureChangeError` for a recording call made from a JAX trace that is not the
  model's (the model was closed over instead of carried). Kept apart so loopbridge's loops can
  tell it from a structure change; users catch `StructureChangeError`."""


class DroppedSowWarning(UserWarning):
  """A `sow` that Linen silently discarded because an enclosing lifted transform
  (`nn.scan`, `nn.vmap`, ...) does not carry its collection."""

  __module__ = "loopbridge"


class RecordsDiscardedWarning(UserWarning):
  """A re-declaration (`lb.preallocate`, `lb.lazy_init`) could not keep some recorded values:
  a site's value shape changed, or its buffer had already overflowed."""

  __module__ = "loopbridge"


class ParamsReinitializedWarning(UserWarning):
  """`lb.lazy_init` on a model whose `lb.ToNNX` parts already hold parameters (from an earlier
  `lazy_init`, or loaded from a checkpoint): Linen's init replaces them with fresh random ones.
  `lb.preallocate` declares another capacity or call signature and keeps them."""

  __module__ = "loopbridge"


class CacheLengthWarning(UserWarning):
  """A flax attention cache (`cached_key`) shorter than the loop a declaration prepares: a
  capacity larger than its length, or a length-1 cache after `lazy_init` (the model was
  initialized on one token). Decoding past its end gives wrong tokens with no error."""

  __module__ = "loopbridge"


class StackError(LoopbridgeError, ValueError):
  """Modules that cannot be stacked (they differ), a module that is not a layer stack, or a
  stack whose layers recorded different numbers of values, read back as one array."""

  __module__ = "loopbridge.layers"


class ShardingError(LoopbridgeError, ValueError):
  """A sharding that cannot be used: a buffer layout that does not fit the mesh, or (flax >=
  0.12) partition-annotated params created with no mesh to shard them on."""

  __module__ = "loopbridge.sharding"


class CheckpointError(LoopbridgeError, ValueError):
  """Saved state (an orbax checkpoint or a Linen variables dict) that does not fit the model."""

  __module__ = "loopbridge.checkpoint"


class CompareError(LoopbridgeError, ValueError):
  """`lb.compare` inputs it cannot use (wrong kinds of models, a mapping path that names no
  call, a model that fails to run), or two models whose module calls cannot be aligned."""

  __module__ = "loopbridge"


def first_line(error: BaseException | str, limit: int = 400) -> str:
  """The first line of an error's message, cut to `limit` characters, for a one-line report.

  Args:
    error: an exception, or its message.
    limit: the longest line returned; a longer first line is cut and ends with `...`.

  Returns:
    The message's first line (empty for an empty message).

  Examples:
    >>> first_line(ValueError("shapes differ\\n  (2, 3) vs (3, 2)"))
    'shapes differ'
    >>> first_line("x" * 10, limit=8)
    'xxxxx...'
  """
  lines = str(error).strip().splitlines()
  line = lines[0] if lines else ""
  return line if len(line) <= limit else line[: limit - 3] + "..."
