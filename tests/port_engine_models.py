"""Small Linen models for the drafting engine's unit tests (a file, so their source is readable)."""

import flax.linen as nn
import jax.numpy as jnp


class TinyMLP(nn.Module):
  """Dense layers built in a loop, dropout behind a train flag, a named head."""

  hidden: tuple[int, ...] = (8, 6)

  @nn.compact
  def __call__(self, x, train: bool = False):
    for width in self.hidden:
      x = nn.relu(nn.Dense(width)(x))
      x = nn.Dropout(0.5, deterministic=not train)(x)
    return nn.Dense(3, name="head")(x)


class Scaled(nn.Module):
  """A raw param with an input-dependent shape and a batch statistic."""

  features: int = 4

  @nn.compact
  def __call__(self, x):
    w = self.param("w", nn.initializers.lecun_normal(), (x.shape[-1], self.features))
    count = self.variable("batch_stats", "count", lambda: jnp.zeros((), jnp.int32))
    if not self.is_initializing():
      count.value += 1
    return x @ w


class TwoBlocks(nn.Module):
  """One user class used twice with different input widths."""

  @nn.compact
  def __call__(self, x):
    x = Scaled(6)(x)
    return Scaled(2)(x)


class Unportable(nn.Module):
  """nn.map_variables has no drafted form: the draft must keep it as a TODO."""

  @nn.compact
  def __call__(self, x):
    dense = nn.map_variables(nn.Dense, "params", lambda v: v, init=True)(3)
    return dense(x)


class Norms(nn.Module):
  """Convolution, batch norm and layer norm (standard layers with input widths)."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Conv(4, (3, 3), strides=(2, 2))(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    x = nn.LayerNorm(epsilon=1e-5)(x)
    return nn.RMSNorm()(x)
