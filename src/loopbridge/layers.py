"""Layer stacks: one NNX module whose Variables carry a leading layer axis.

`stack` builds one from equal layers (what `nnx.vmap` over a constructor builds), `layer`
picks layer `i` (a traced `i` too, inside `nnx.fori_loop`), `scan` runs an input through
every layer with one compiled body. The params functions move weights between the layouts
Linen and NNX use: one scanned subtree (what `nn.scan` stores) or one subtree per layer.

Examples:
  >>> import jax.numpy as jnp, loopbridge as lb
  >>> from flax import nnx
  >>> stacked = lb.layers.stack([nnx.Linear(4, 4, rngs=nnx.Rngs(i)) for i in range(3)])
  >>> lb.layers.scan(stacked, jnp.ones((2, 4))).shape
  (2, 4)
"""

# In reading order (the API reference lists them in this order): modules, then params.
from ._core.errors import StackError as StackError
from ._layers.param_layout import export_params as export_params
from ._layers.param_layout import load_params as load_params
from ._layers.param_layout import stack_params as stack_params
from ._layers.param_layout import unstack_params as unstack_params
from ._layers.scan_layers import scan as scan
from ._layers.stack import layer as layer
from ._layers.stack import stack as stack
from ._layers.stack import unstack as unstack

__all__ = [
  "StackError",
  "export_params",
  "layer",
  "load_params",
  "scan",
  "stack",
  "stack_params",
  "unstack",
  "unstack_params",
]
