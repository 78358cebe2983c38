"""Exception and warning types raised by loopbridge.

All public: the everyday ones are re-exported by the package; `StackError`,
`CheckpointError` and `ShardingError` by the namespace of the functions that raise them
(`lb.layers`, `lb.checkpoint`, `lb.sharding`).
"""

from __future__ import annotations


class LoopbridgeError(Exception):
  """Base class of every error loopbridge raises on purpose."""


class CapacityError(LoopbridgeError, ValueError):
  """A `capacity=` or `overflow=` declaration that cannot be used (bad type, value or key)."""


class BufferOverflowError(LoopbridgeError, RuntimeError):
  """Reading back a buffer under `overflow="error"` after more values were sown than it holds."""


class NotDeclaredError(LoopbridgeError, RuntimeError):
  """The buffers this needs were not declared.

  Either the model (or a part of it) is used before `lb.lazy_init` / `lb.preallocate`
  declared any buffers, or a call sows at a site, or with a shape or dtype, that its
  declaration does not cover. The fix is the same for both: declare for this call with
  `lb.lazy_init` / `lb.preallocate` and the call's sample arguments.
  """


class StructureChangeError(LoopbridgeError, ValueError):
  """A call would change the model's variable structure, which NNX loops forbid."""


class DroppedSowWarning(UserWarning):
  """A `sow` that Linen silently discarded because an enclosing lifted transform
  (`nn.scan`, `nn.vmap`, ...) does not carry its collection."""


class RecordsDiscardedWarning(UserWarning):
  """A re-declaration (`lb.preallocate`, `lb.lazy_init`) could not keep some recorded values:
  a site's value shape changed, or its buffer had already overflowed."""


class StackError(LoopbridgeError, ValueError):
  """Modules that cannot be stacked (they differ), or a module that is not a layer stack."""


class ShardingError(LoopbridgeError, ValueError):
  """A buffer sharding that cannot be used (a mesh axis that does not divide the axis, ...)."""


class CheckpointError(LoopbridgeError, ValueError):
  """Saved state (an orbax checkpoint or a Linen variables dict) that does not fit the model."""


class CompareError(LoopbridgeError, ValueError):
  """`lb.compare` inputs it cannot use (wrong kinds of models, a mapping path that names no
  call, a model that fails to run), or two models whose module calls cannot be aligned."""
