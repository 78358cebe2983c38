"""loopbridge: record every Linen `sow` inside NNX loops under jit.

`lb.ToNNX` is a loop-stable `flax.nnx.bridge.ToNNX`: after `lazy_init(..., capacity=N)` its
state never changes shape, so the bridged model runs in `nnx.while_loop`, `nnx.fori_loop`
and `nnx.scan`, recording every sown value into preallocated buffers.

Families of names live in namespaces: `lb.layers` (layer stacks and their params),
`lb.checkpoint` (orbax checkpoints, existing Linen variables) and `lb.sharding` (placing
record buffers on a mesh).
"""

# First: checks the installed flax/jax pair before anything imports `flax.nnx` (a pair that
# cannot import gets one clear line instead of an ImportError from inside flax).
from . import _compat  # noqa: F401  # pyright: ignore[reportUnusedImport]
from . import checkpoint as checkpoint
from . import layers as layers
from . import port as port
from . import sharding as sharding
from ._core.buffers import Buffer as Buffer
from ._core.buffers import Count as Count
from ._core.capacity import capacity as capacity
from ._core.errors import BufferOverflowError as BufferOverflowError
from ._core.errors import CacheLengthWarning as CacheLengthWarning
from ._core.errors import CapacityError as CapacityError
from ._core.errors import CompareError as CompareError
from ._core.errors import DroppedSowWarning as DroppedSowWarning
from ._core.errors import LoopbridgeError as LoopbridgeError
from ._core.errors import NotDeclaredError as NotDeclaredError
from ._core.errors import ParamsReinitializedWarning as ParamsReinitializedWarning
from ._core.errors import RecordsDiscardedWarning as RecordsDiscardedWarning
from ._core.errors import StructureChangeError as StructureChangeError
from ._core.linen_vars import linen_variables as linen_variables
from ._core.pipeline import lazy_init as lazy_init
from ._core.pipeline import preallocate as preallocate
from ._core.readback import buffers as buffers
from ._core.readback import counts as counts
from ._core.readback import recorded as recorded
from ._core.readback import reset as reset
from ._core.recording_switch import recording as recording
from ._core.to_nnx import ToNNX as ToNNX
from ._diagnostics.compare import ParityReport as ParityReport
from ._diagnostics.compare import compare as compare
from ._diagnostics.explain import StructureReport as StructureReport
from ._diagnostics.explain import explain as explain
from ._diagnostics.sow_sites import sow_sites as sow_sites
from ._loops.compile_step import CompiledStep as CompiledStep
from ._loops.compile_step import compile_step as compile_step
from ._loops.loops import fori_loop as fori_loop
from ._loops.loops import while_loop as while_loop

__version__ = "0.2.0"

# The everyday names. `CompiledStep`, `StructureReport` and `ParityReport` (what
# `compile_step`, `explain` and `compare` return) stay importable for annotations without
# being listed here; the
# namespaces `layers`, `checkpoint` and `sharding` are modules, not names to star-import.
__all__ = [
  "Buffer",
  "BufferOverflowError",
  "CacheLengthWarning",
  "CapacityError",
  "CompareError",
  "Count",
  "DroppedSowWarning",
  "LoopbridgeError",
  "NotDeclaredError",
  "ParamsReinitializedWarning",
  "RecordsDiscardedWarning",
  "StructureChangeError",
  "ToNNX",
  "buffers",
  "capacity",
  "compare",
  "compile_step",
  "counts",
  "explain",
  "fori_loop",
  "lazy_init",
  "linen_variables",
  "preallocate",
  "recorded",
  "recording",
  "reset",
  "sow_sites",
  "while_loop",
]
