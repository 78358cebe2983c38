"""loopbridge: record every Linen `sow` inside NNX loops under jit.

`lb.ToNNX` is a loop-stable `flax.nnx.bridge.ToNNX`: after `lazy_init(..., capacity=N)` its
state never changes shape, so the bridged model runs in `nnx.while_loop`, `nnx.fori_loop`
and `nnx.scan`, recording every sown value into preallocated buffers.
"""

from ._buffers import Buffer as Buffer
from ._buffers import Count as Count
from ._checkpoint import from_linen_variables as from_linen_variables
from ._checkpoint import load_linen_variables as load_linen_variables
from ._checkpoint import restore_checkpoint as restore_checkpoint
from ._checkpoint import save_checkpoint as save_checkpoint
from ._compare import ParityReport as ParityReport
from ._compare import compare as compare
from ._compiled import CompiledStep as CompiledStep
from ._compiled import compile_step as compile_step
from ._errors import BufferOverflowError as BufferOverflowError
from ._errors import CapacityError as CapacityError
from ._errors import CheckpointError as CheckpointError
from ._errors import CompareError as CompareError
from ._errors import DroppedSowWarning as DroppedSowWarning
from ._errors import LoopbridgeError as LoopbridgeError
from ._errors import NotInitializedError as NotInitializedError
from ._errors import RecordsDiscardedWarning as RecordsDiscardedWarning
from ._errors import ShardingError as ShardingError
from ._errors import SowMismatchError as SowMismatchError
from ._errors import StackError as StackError
from ._errors import StructureChangeError as StructureChangeError
from ._explain import StructureReport as StructureReport
from ._explain import explain as explain
from ._layout import layers_to_scanned as layers_to_scanned
from ._layout import nnx_to_params as nnx_to_params
from ._layout import params_to_nnx as params_to_nnx
from ._layout import scanned_to_layers as scanned_to_layers
from ._linen_vars import linen_variables as linen_variables
from ._loops import fori_loop as fori_loop
from ._loops import while_loop as while_loop
from ._pipeline import lazy_init as lazy_init
from ._pipeline import preallocate as preallocate
from ._records import buffers as buffers
from ._records import counts as counts
from ._records import recorded as recorded
from ._records import reset as reset
from ._scan_layers import scan_layers as scan_layers
from ._shard_buffers import shard_buffers as shard_buffers
from ._sites import sow_sites as sow_sites
from ._stack import layer as layer
from ._stack import stack as stack
from ._stack import unstack as unstack
from ._to_nnx import ToNNX as ToNNX

__version__ = "0.1.0"

__all__ = [
    "Buffer",
    "BufferOverflowError",
    "CapacityError",
    "CheckpointError",
    "CompareError",
    "CompiledStep",
    "Count",
    "DroppedSowWarning",
    "LoopbridgeError",
    "NotInitializedError",
    "ParityReport",
    "RecordsDiscardedWarning",
    "ShardingError",
    "SowMismatchError",
    "StackError",
    "StructureChangeError",
    "StructureReport",
    "ToNNX",
    "buffers",
    "compare",
    "compile_step",
    "counts",
    "explain",
    "fori_loop",
    "from_linen_variables",
    "layer",
    "layers_to_scanned",
    "lazy_init",
    "linen_variables",
    "load_linen_variables",
    "nnx_to_params",
    "params_to_nnx",
    "preallocate",
    "recorded",
    "reset",
    "restore_checkpoint",
    "save_checkpoint",
    "scan_layers",
    "scanned_to_layers",
    "shard_buffers",
    "sow_sites",
    "stack",
    "unstack",
    "while_loop",
]
