"""Checkpoints of recording models, and models built from existing Linen variables.

`save` / `restore` keep a model's whole state (params, record buffers, counts, rng streams)
with orbax, so a loop can stop and go on in another process. `from_linen_variables` wraps a
Linen module around variables that already exist (from `linen.init` or a Linen checkpoint);
`load_linen_variables` writes such variables into an initialized model. `linen_to_nnx` /
`nnx_to_linen` move a Linen train state (every collection, the optax state and the step) into
a hand-ported NNX model and its `nnx.Optimizer`, and back, pairing the variables by the two
models' own calls.

Examples:
  >>> import tempfile, jax.numpy as jnp, loopbridge as lb
  >>> from flax import linen as nn, nnx
  >>> model = lb.lazy_init(lb.ToNNX(nn.Dense(2), rngs=nnx.Rngs(0)), jnp.ones((1, 3)))
  >>> path = lb.checkpoint.save(tempfile.mkdtemp() + "/step_0", model)
  >>> fresh = lb.lazy_init(lb.ToNNX(nn.Dense(2), rngs=nnx.Rngs(1)), jnp.ones((1, 3)))
  >>> bool((lb.checkpoint.restore(path, fresh)(jnp.ones((1, 3))) == model(jnp.ones((1, 3)))).all())
  True
"""

# In reading order (the API reference lists them in this order).
from ._checkpoint.convert import linen_to_nnx as linen_to_nnx
from ._checkpoint.convert import nnx_to_linen as nnx_to_linen
from ._checkpoint.convert_report import ConversionReport as ConversionReport
from ._checkpoint.leaf_rules import LeafRule as LeafRule
from ._checkpoint.leaf_rules import fuse as fuse
from ._checkpoint.leaf_rules import rename as rename
from ._checkpoint.leaf_rules import reshape as reshape
from ._checkpoint.leaf_rules import split as split
from ._checkpoint.leaf_rules import transpose as transpose
from ._checkpoint.save_restore import from_linen_variables as from_linen_variables
from ._checkpoint.save_restore import load_linen_variables as load_linen_variables
from ._checkpoint.save_restore import restore as restore
from ._checkpoint.save_restore import save as save
from ._core.errors import CheckpointError as CheckpointError

__all__ = [
  "CheckpointError",
  "ConversionReport",
  "LeafRule",
  "from_linen_variables",
  "fuse",
  "linen_to_nnx",
  "load_linen_variables",
  "nnx_to_linen",
  "rename",
  "reshape",
  "restore",
  "save",
  "split",
  "transpose",
]
