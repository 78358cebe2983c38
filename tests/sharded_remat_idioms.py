"""Small Linen models in the style of published sharded and rematerialized code: params boxed by
`nn.with_partitioning` (on a layer's initializer and on `self.param`), `nn.remat` /
`nn.checkpoint` on a method or on a class chosen by a config flag, and a layer without params
that only another configuration builds."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import param_free_layers


@dataclasses.dataclass
class ShardCfg:
  """A plain dataclass config, read by every layer below."""

  width: int
  hidden: int
  vocab: int
  depth: int = 1
  sharded: bool = True
  remat: bool = False


def boxed(init, axes, cfg: ShardCfg):
  """The initializer with sharding names where the config shards, the bare one elsewhere."""
  return nn.with_partitioning(init, axes) if cfg.sharded else init


class ShardedMlp(nn.Module):
  """Dense layers whose kernels carry sharding names, and a param of its own used in math."""

  cfg: ShardCfg

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dense = functools.partial(
      nn.Dense, use_bias=False, kernel_init=boxed(nn.initializers.lecun_normal(), ("a", "b"), cfg)
    )
    h = jax.nn.gelu(dense(cfg.hidden)(x))
    scale = self.param("scale", nn.with_partitioning(nn.initializers.ones, ("b",)), (cfg.hidden,))
    mix = self.param(
      "mix", nn.with_partitioning(nn.initializers.normal(0.5), (None, "a")), (cfg.hidden, cfg.width)
    )
    h = h * scale[None, None, :]
    return dense(cfg.width)(h) + h @ mix.reshape(cfg.hidden, cfg.width)


class ShardedEmbedLM(nn.Module):
  """An embedding boxed with sharding names, read twice (lookup and tied logits)."""

  cfg: ShardCfg

  def setup(self):
    cfg = self.cfg
    self.embed = nn.Embed(
      cfg.vocab, cfg.width, embedding_init=boxed(nn.initializers.normal(1.0), (None, "a"), cfg)
    )
    self.mlp = ShardedMlp(cfg)

  def __call__(self, ids):
    y = self.embed(ids)
    y = y + self.mlp(y)
    return self.embed.attend(y)


class RematCall(nn.Module):
  """`__call__` rematerialized by its decorator (over `nn.compact`)."""

  features: int
  mid: int = 5

  @nn.remat
  @nn.compact
  def __call__(self, x):
    h = jnp.tanh(nn.Dense(self.mid)(x))
    return nn.Dense(self.features)(h)


class StaticRematCall(nn.Module):
  """`nn.checkpoint` with its options on a method taking a Python bool."""

  features: int

  @functools.partial(nn.checkpoint, static_argnums=(2,), prevent_cse=False)
  @nn.compact
  def __call__(self, x, flip):
    h = nn.Dense(self.features)(x)
    return -h if flip else jnp.sin(h)


class RematMethodBlock(nn.Module):
  """A block with a second, rematerialized entry point that calls the first."""

  features: int

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(x.shape[-1])(jax.nn.relu(nn.Dense(self.features)(x)))

  @nn.remat
  def remat_call(self, x):
    return self(x)


class RematMethodStack(nn.Module):
  """Blocks called through their rematerialized method for the first `n_remat` of them."""

  features: int
  n_blocks: int = 2
  n_remat: int = 1

  @nn.compact
  def __call__(self, x):
    for i in range(self.n_blocks):
      if i < self.n_remat:
        x = RematMethodBlock(self.features).remat_call(x)
      else:
        x = RematMethodBlock(self.features)(x)
    return x


class FlagBlock(nn.Module):
  cfg: ShardCfg

  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm(use_bias=False)(x)
    return x + nn.Dense(self.cfg.width)(jax.nn.gelu(nn.Dense(self.cfg.hidden)(h)))


class FlagRematStack(nn.Module):
  """Blocks made in setup through `nn.remat` only where the config says so."""

  cfg: ShardCfg

  def setup(self):
    block = nn.remat(FlagBlock) if self.cfg.remat else FlagBlock
    self.blocks = [block(self.cfg) for _ in range(self.cfg.depth)]

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return x


class BlurOrPool(nn.Module):
  """A residual block that blurs with a param-free layer of another module (named through
  that module) where a flag says so."""

  features: int
  blur: bool

  @nn.compact
  def __call__(self, x):
    h = jax.nn.relu(nn.Conv(x.shape[-1], (3,))(x))
    if self.blur:
      h = param_free_layers.Blur()(h)
      x = param_free_layers.Blur(size=5)(x)
    else:
      h = h * 0.5
    return nn.Conv(self.features, (1,), use_bias=False)(x) + nn.Conv(self.features, (3,))(h)


class TapsResidual(nn.Module):
  """A param-free layer whose setup binds a list, then an array, used where a flag says so."""

  features: int
  blur: bool

  @nn.compact
  def __call__(self, x):
    if self.blur:
      x = x + param_free_layers.TapsBlur(size=5)(x)
    return nn.Dense(self.features)(x)


class FlagRematCompact(nn.Module):
  """The flag's choice in a compact method: each block built and called in the loop."""

  cfg: ShardCfg

  @nn.compact
  def __call__(self, x):
    block = nn.remat(FlagBlock) if self.cfg.remat else FlagBlock
    for _ in range(self.cfg.depth):
      x = block(self.cfg)(x)
    return x


class CellBlock(nn.Module):
  """A block rematerialized where it is defined (its name rebound at module level)."""

  features: int

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(self.features)(x)) + jnp.mean(x, axis=-1, keepdims=True)


CellBlock = nn.remat(CellBlock, prevent_cse=False)


class CellStack(nn.Module):
  """Two of the module-level rematerialized blocks, built and called in a compact method."""

  features: int

  @nn.compact
  def __call__(self, x):
    return CellBlock(3)(CellBlock(self.features)(x))
