"""NNX classes a draft writes into its own file where flax's NNX counterpart has another layout.

Linen's `GRUCell` keeps one Dense per gate (`ir`, `iz`, `in`, `hr`, `hz`, `hn`); NNX's fuses
them (`dense_i`, `dense_h`), so the Linen weights would need restructuring. The draft writes
this class instead: the same equations as Linen's, the same parameter names, in NNX.
"""

from __future__ import annotations

import functools
import typing as tp

from ..transforms import factory_fields, flag_remat, partitioned_inits

GRU_CELL = '''
class LinenGRUCell(nnx.Module):
  """Linen's GRUCell in NNX: one Linear per gate, named as in Linen (ir, iz, in, hr, ...)."""

  def __init__(
    self,
    in_features: int,
    hidden_features: int,
    *,
    gate_fn=nnx.sigmoid,
    activation_fn=nnx.tanh,
    kernel_init=None,
    recurrent_kernel_init=None,
    bias_init=None,
    dtype=None,
    param_dtype=jnp.float32,
    rngs: nnx.Rngs,
  ):
    self.gate_fn = gate_fn
    self.activation_fn = activation_fn
    self.hidden_features = hidden_features
    self.param_dtype = param_dtype
    # Linen's defaults: lecun_normal input kernels, orthogonal recurrent kernels, zero biases.
    kernel_init = kernel_init or nnx.initializers.lecun_normal()
    recurrent_kernel_init = recurrent_kernel_init or nnx.initializers.orthogonal()
    bias_init = bias_init or nnx.initializers.zeros_init()

    def dense_i(use_bias=True):
      return nnx.Linear(in_features, hidden_features, use_bias=use_bias, kernel_init=kernel_init,
                        bias_init=bias_init, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def dense_h(use_bias=False):
      return nnx.Linear(hidden_features, hidden_features, use_bias=use_bias,
                        kernel_init=recurrent_kernel_init, bias_init=bias_init, dtype=dtype,
                        param_dtype=param_dtype, rngs=rngs)

    self.ir, self.iz, self.hr, self.hz = dense_i(), dense_i(), dense_h(), dense_h()
    # `in` is a Python keyword: set by name, as Linen names it.
    setattr(self, "in", dense_i())
    self.hn = dense_h(use_bias=True)

  def __call__(self, carry, inputs):
    h = carry
    r = self.gate_fn(self.ir(inputs) + self.hr(h))
    z = self.gate_fn(self.iz(inputs) + self.hz(h))
    n = self.activation_fn(getattr(self, "in")(inputs) + r * self.hn(h))
    new_h = (1.0 - z) * n + z * h
    return new_h, new_h

  def initialize_carry(self, input_shape, rngs=None):
    """Zeros, as Linen's GRUCell's default carry_init (the signature nnx.RNN calls)."""
    return jnp.zeros((*input_shape[:-1], self.hidden_features), self.param_dtype)

  @property
  def num_feature_axes(self) -> int:
    return 1
'''

NEVER_CALLED = '''
class NeverCalled:
  """Stands where the Linen model builds a submodule in setup that no configuration the draft
  traced called (a layer behind a flag its parent always turns off): no weights exist for it,
  so the port builds none, and calling it raises."""

  def __init__(self, what: str):
    self.what = what

  def __call__(self, *args, **kwargs):
    raise NotImplementedError(self.what)
'''

HELPERS = {
  "LinenGRUCell": GRU_CELL,
  "NeverCalled": NEVER_CALLED,
  partitioned_inits.HELPER: partitioned_inits.SOURCE,
  flag_remat.HELPER: flag_remat.SOURCE,
  factory_fields.HELPER: factory_fields.SOURCE,
}
"""Helper class (or function) name -> its source (formatted with the draft)."""


@functools.cache
def helper_class(name: str) -> type:
  """The helper class itself (for its signature)."""
  import jax.numpy as jnp
  from flax import nnx

  namespace: dict[str, tp.Any] = {"nnx": nnx, "jnp": jnp}
  exec(HELPERS[name], namespace)
  return namespace[name]
