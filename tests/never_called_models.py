"""Linen models whose setup builds a layer a flag of the parent always turns off (HF's
`add_pooling_layer=False` heads), for tests/test_port_never_called.py."""

import flax.linen as nn
import jax.numpy as jnp


class Pooler(nn.Module):
  width: int

  @nn.compact
  def __call__(self, h):
    return jnp.tanh(nn.Dense(self.width)(h[:, 0]))


class Encoder(nn.Module):
  width: int
  add_pooling: bool = True

  def setup(self):
    self.dense = nn.Dense(self.width)
    self.pooler = Pooler(self.width)

  def __call__(self, x):
    h = jnp.tanh(self.dense(x))
    pooled = self.pooler(h) if self.add_pooling else None
    return h, pooled


class TokenHead(nn.Module):
  """Builds its encoder with the pooler off, as HF's token and LM heads do."""

  width: int
  labels: int

  def setup(self):
    self.encoder = Encoder(self.width, add_pooling=False)
    self.out = nn.Dense(self.labels)

  def __call__(self, x):
    h, _ = self.encoder(x)
    return self.out(h)


class PooledHead(nn.Module):
  """The same encoder with its pooler on: the pooler is traced and ported."""

  width: int
  labels: int

  def setup(self):
    self.encoder = Encoder(self.width)
    self.out = nn.Dense(self.labels)

  def __call__(self, x):
    _, pooled = self.encoder(x)
    return self.out(pooled)


class DenseEncoder(nn.Module):
  """ALBERT's way: the pooler is flax's own Dense, behind the flag."""

  width: int
  add_pooling: bool = True

  def setup(self):
    self.dense = nn.Dense(self.width)
    self.pooler = nn.Dense(self.width)

  def __call__(self, x):
    h = jnp.tanh(self.dense(x))
    pooled = jnp.tanh(self.pooler(h[:, 0])) if self.add_pooling else None
    return h, pooled


class DenseTokenHead(nn.Module):
  width: int
  labels: int

  def setup(self):
    self.encoder = DenseEncoder(self.width, add_pooling=False)
    self.out = nn.Dense(self.labels)

  def __call__(self, x):
    h, _ = self.encoder(x)
    return self.out(h)


class ReadKernel(nn.Module):
  """A layer never called whose attribute is read otherwise (applied with given params): no
  stand-in (the port needs it)."""

  width: int

  def setup(self):
    self.proj = nn.Dense(self.width, use_bias=False)
    self.kernel = self.param("kernel", nn.initializers.lecun_normal(), (6, self.width))

  def __call__(self, x):
    return self.proj.apply({"params": {"kernel": self.kernel * 2.0}}, x)


class ArgumentGated(nn.Module):
  """A layer a call argument gates (`if context is not None`): another call reaches it."""

  width: int

  def setup(self):
    self.dense = nn.Dense(self.width)
    self.pooler = Pooler(self.width)

  def __call__(self, x, context=None):
    h = self.dense(x)
    if context is not None:
      h = h + self.pooler(context)[:, None]
    return h
