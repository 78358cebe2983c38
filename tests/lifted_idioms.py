"""Small Linen models showing idioms of published Linen code the drafter ports: classes wrapped
by a lifted transform at module level, layers built outside the method that calls them, a param
read by a second method, subclasses of flax layers and collections of the user's own."""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp
from flax.linen.partitioning import param_with_axes


class Channel(nn.Module):
  """One channel's layer, made per-channel below by `nn.vmap` at module level."""

  width: int

  def setup(self):
    self.scale = self.param("scale", nn.initializers.normal(), (self.width,))

  def __call__(self, u):
    return jnp.tanh(u * self.scale.sum())


def per_channel(layer):
  return nn.vmap(
    layer, in_axes=1, out_axes=1, variable_axes={"params": 1}, split_rngs={"params": True}
  )


Channel = per_channel(Channel)


class RematBlock(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(self.features)(x))


RematBlock = nn.remat(RematBlock)


class Embed(nn.Module):
  """A param declared as a field with `init=False`, made in setup, read by a second method."""

  num_embeddings: int
  features: int
  embedding: jnp.ndarray = dataclasses.field(init=False)

  def setup(self):
    self.embedding = self.param(
      "embedding", nn.initializers.normal(), (self.num_embeddings, self.features)
    )

  def __call__(self, ids):
    return jnp.asarray(self.embedding)[ids]

  def attend(self, query):
    return jnp.dot(query, self.embedding.T)


class OwnCollection(nn.Module):
  """A variable in a collection of the user's own (not params, cache, batch_stats)."""

  features: int

  def setup(self):
    self.dense = nn.Dense(self.features)
    self.table = self.variable(
      "prime", "table", lambda: jnp.linspace(0.0, 1.0, self.features, dtype=jnp.float32)
    )

  def __call__(self, x):
    return self.dense(x) * self.table.value


class ClassAlias(nn.Module):
  """A layer class bound to a local, then built through it (`conv_fn = nn.Conv`)."""

  features: int

  @nn.compact
  def __call__(self, x):
    dense_fn = nn.Dense
    x = dense_fn(self.features)(x)
    return dense_fn(3, use_bias=False)(jnp.tanh(x))


class SetupThenCompact(nn.Module):
  """Setup assigns a setting that the compact call's layers read (both in one class)."""

  features: int

  def setup(self):
    self.width = self.features * 2

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(jnp.tanh(nn.Dense(self.width)(x)))


class OptionalProjection(nn.Module):
  """A layer built only when an optional width is set (None by default)."""

  features: int
  hidden: int | None = None

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.features)(x)
    if self.hidden:
      x = nn.Dense(self.hidden, name="projection")(x)
    return jnp.tanh(x)


class BuiltAtOneMode(nn.Module):
  """A layer built only at one value of an int setting (no change of a bool or string
  reaches it)."""

  features: int
  mode: int = 0

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.features)(x)
    if self.mode == 3:
      x = nn.Dense(2, name="head")(x)
    return x


class AxesEmbed(nn.Module):
  """A param made through `param_with_axes` (logical axes for sharding) in setup, read by
  `__call__` and `attend`."""

  num_embeddings: int
  features: int

  def setup(self):
    self.embedding = param_with_axes(
      "embedding",
      nn.initializers.normal(),
      (self.num_embeddings, self.features),
      jnp.float32,
      axes=("vocab", "embed"),
    )

  def __call__(self, ids):
    return jnp.asarray(self.embedding)[ids]

  def attend(self, query):
    return jnp.dot(query, self.embedding.T)
