"""Small Linen models that subclass flax's own `nn.Dense` and `nn.Conv` the way published code
does, for the drafting tests. A file, so their source is readable.

- `PositiveDense` overrides `__call__` entirely, making its own params from the inherited
  fields, with the kernel's magnitude as its weights (the idiom of the monotone layers of
  variational-diffusion models).
- `CenteredConv` overrides `param` to standardize the kernel it returns (the idiom of the
  weight-standardized convolutions of big-transfer ResNets).
"""

import jax
import jax.numpy as jnp
from flax import linen as nn


class PositiveDense(nn.Dense):
  """A dense layer whose weights are the magnitudes of its kernel: monotone in its inputs."""

  @nn.compact
  def __call__(self, inputs):
    inputs = jnp.asarray(inputs, self.dtype)
    kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features))
    kernel = jnp.abs(jnp.asarray(kernel, self.dtype))
    contract = (((inputs.ndim - 1,), (0,)), ((), ()))
    out = jax.lax.dot_general(inputs, kernel, contract, precision=self.precision)
    if self.use_bias:
      bias = self.param("bias", self.bias_init, (self.features,))
      out = out + jnp.asarray(bias, self.dtype)
    return out


class MonotoneMlp(nn.Module):
  """Two monotone layers with a monotone nonlinearity between them."""

  hidden: int = 6
  out: int = 3

  @nn.compact
  def __call__(self, x):
    h = PositiveDense(self.hidden, kernel_init=nn.initializers.normal(0.5))(x)
    h = nn.sigmoid(h)
    return PositiveDense(self.out, use_bias=False)(h)


def standardized(w, axis, eps):
  """`w` less its mean over `axis`, over its deviation there."""
  w = w - jnp.mean(w, axis=axis, keepdims=True)
  return w / jnp.sqrt(jnp.var(w, axis=axis, keepdims=True) + eps)


class CenteredConv(nn.Conv):
  """A convolution whose kernel is standardized over its window and input channels."""

  def param(self, name, *args, **kwargs):
    value = super().param(name, *args, **kwargs)
    if name == "kernel":
      value = standardized(value, axis=[0, 1, 2], eps=1e-5)
    return value


class CenteredBlock(nn.Module):
  """Two standardized convolutions with a group norm between them, as a ResNet unit."""

  features: int = 8

  @nn.compact
  def __call__(self, x):
    h = CenteredConv(self.features, (3, 3), use_bias=False, name="conv1")(x)
    h = nn.relu(nn.GroupNorm(num_groups=2, name="norm")(h))
    return CenteredConv(self.features, (1, 1), name="conv2")(h)


class ScaledKernelConv(nn.Conv):
  """A `param` override reading a field of the layer: NNX names the layer's fields otherwise
  (`features` is nnx.Conv's `out_features`), so it is one TODO saying what to write."""

  def param(self, name, *args, **kwargs):
    value = super().param(name, *args, **kwargs)
    return value / self.features if name == "kernel" else value


class UsesScaledKernelConv(nn.Module):
  @nn.compact
  def __call__(self, x):
    return ScaledKernelConv(4, (3, 3))(x)


class ClippedDense(nn.Dense):
  """A dense layer whose kernel is clipped as the layer reads it (a `param` override)."""

  def param(self, name, init_fn, *init_args):
    kernel_or_bias = super().param(name, init_fn, *init_args)
    if name != "kernel":
      return kernel_or_bias
    return jnp.clip(kernel_or_bias, -0.2, 0.2)


class ClippedMlp(nn.Module):
  hidden: int = 6

  @nn.compact
  def __call__(self, x):
    h = nn.gelu(ClippedDense(self.hidden)(x))
    return ClippedDense(2, use_bias=False)(h)
