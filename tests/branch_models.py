"""Small Linen models written the way HF's BEiT, Dinov2 and Wav2Vec2 write a class that only a
config setting the sample leaves off builds (drafted by tests/test_port_branch_configs.py)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import linen as nn


@dataclasses.dataclass(frozen=True)
class Config:
  hidden: int = 8
  heads: int = 2
  num_channels: int = 3
  use_bias_table: bool = False  # BEiT's use_relative_position_bias
  norm: str = "group"  # Wav2Vec2's feat_extract_norm
  use_gated_mlp: bool = False  # Dinov2's use_swiglu_ffn


class BiasTable(nn.Module):
  """Built only when the config asks for it (BEiT's FlaxBeitRelativePositionBias)."""

  config: Config

  @nn.compact
  def __call__(self, x):
    table = self.param("table", nn.initializers.normal(0.5), (self.config.heads, x.shape[-1]))
    proj = nn.Dense(self.config.hidden, name="proj")(x)
    return proj + table.sum(0)


class LayerNormConv(nn.Module):
  """Built only when `config.norm == "layer"` (Wav2Vec2's FlaxWav2Vec2LayerNormConvLayer)."""

  config: Config

  def setup(self):
    self.conv = nn.Dense(self.config.hidden)
    self.norm = nn.LayerNorm()

  def __call__(self, x):
    return self.norm(self.conv(x))


class GroupNormConv(nn.Module):
  config: Config

  def setup(self):
    self.conv = nn.Dense(self.config.hidden)

  def __call__(self, x):
    return nn.gelu(self.conv(x))


class GatedMlp(nn.Module):
  """Dinov2's SwiGLU MLP: its width is a setup local assigned twice."""

  config: Config

  def setup(self):
    hidden = self.config.hidden * 4
    hidden = (hidden * 2 // 3 + 7) // 8 * 8
    self.weights_in = nn.Dense(2 * hidden)
    self.weights_out = nn.Dense(self.config.hidden)

  def __call__(self, x):
    a, b = jnp.split(self.weights_in(x), 2, axis=-1)
    return self.weights_out(nn.silu(a) * b)


class Mlp(nn.Module):
  config: Config

  def setup(self):
    self.fc = nn.Dense(self.config.hidden)

  def __call__(self, x):
    return nn.relu(self.fc(x))


class Block(nn.Module):
  config: Config

  def setup(self):
    self.extract = (
      LayerNormConv(self.config) if self.config.norm == "layer" else GroupNormConv(self.config)
    )
    self.bias_table = BiasTable(self.config) if self.config.use_bias_table else None
    self.mlp = Mlp(self.config)

  def __call__(self, x):
    if x.shape[-1] != self.config.num_channels:  # as Dinov2 checks its pixels' channels
      raise ValueError("the input's channels do not match config.num_channels")
    h = self.extract(x)
    if self.bias_table is not None:
      h = h + self.bias_table(h)
    return self.mlp(h)


class GatedBlock(nn.Module):
  """Dinov2's layer: one MLP class or the other."""

  config: Config

  def setup(self):
    self.fc = nn.Dense(self.config.hidden)
    if self.config.use_gated_mlp:
      self.mlp = GatedMlp(self.config)
    else:
      self.mlp = Mlp(self.config)

  def __call__(self, x):
    return self.mlp(self.fc(x))


class MlpWithInits(nn.Module):
  """big_vision's MlpBlock: initializers collected in a dict local, passed as `**inits`."""

  mlp_dim: int = 16

  @nn.compact
  def __call__(self, x):
    inits = dict(
      kernel_init=nn.initializers.xavier_uniform(),
      bias_init=nn.initializers.normal(stddev=1e-6),
    )
    d = x.shape[-1]
    x = nn.Dense(self.mlp_dim, **inits)(x)
    return nn.Dense(d, **inits)(nn.gelu(x))


class HeadWithChosenInit(nn.Module):
  """big_vision's ViT head: `kw = {"kernel_init": zeros} if self.head_zeroinit else {}`, then
  `nn.Dense(..., **kw)`, both under the `if` that builds the head."""

  num_classes: int = 4
  head_zeroinit: bool = True

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    if self.num_classes:
      kw = {"kernel_init": nn.initializers.zeros} if self.head_zeroinit else {}
      head = nn.Dense(self.num_classes, name="head", **kw)
      x = head(x)
    return x


class HeadWithLinenOnlyKeyword(nn.Module):
  """The same idiom with a key nnx.Linear has no parameter for."""

  plain_dot: bool = True

  @nn.compact
  def __call__(self, x):
    kw = {"dot_general_cls": None} if self.plain_dot else {}
    return nn.Dense(4, **kw)(x)


class WidthInAChosenDict(nn.Module):
  """The idiom with the width in the dict: the draft writes widths itself."""

  small: bool = True

  @nn.compact
  def __call__(self, x):
    kw = {"features": 4} if self.small else {"features": 8}
    return nn.Dense(**kw)(x)


def learned_posemb(module, shape, name):
  """big_vision's `get_posemb`: a function of the file handed the module, making its param."""
  return module.param(name, nn.initializers.normal(0.02), shape)


class PosembByHelper(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + learned_posemb(self, (1, *x.shape[1:]), "pos_embedding")


class RarelyBuilt(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(x.shape[-1])(x)


class BuildsByNumber(nn.Module):
  """A class only an integer setting builds: no setting flipped one at a time reaches it."""

  mode: int = 0

  @nn.compact
  def __call__(self, x):
    if self.mode == 3:
      x = RarelyBuilt()(x)
    return nn.Dense(4)(x)


class PoolHead(nn.Module):
  """big_vision's MAPHead: a class only `pool_type="map"` builds."""

  @nn.compact
  def __call__(self, x):
    probe = self.param("probe", nn.initializers.normal(0.5), (1, 1, x.shape[-1]))
    return (x * probe).mean(axis=1)


class PooledEncoder(nn.Module):
  """big_vision's ViT head: each pool type builds its own layers, in a compact method; the
  `cls` token is a param only `pool_type="tok"` makes, sized from the input; the stack is
  scanned only when `scan` is set."""

  width: int = 8
  depth: int = 2
  pool_type: str = "gap"
  rep_size: bool = False
  scan: bool = False

  @nn.compact
  def __call__(self, x):
    n, _, c = x.shape
    if self.pool_type == "tok":
      cls = self.param("cls", nn.initializers.normal(0.5), (1, 1, c))
      x = jnp.concatenate([jnp.tile(cls, [n, 1, 1]), x], axis=1)
    x = nn.Dense(self.width, name="embed")(x)
    if self.scan:
      x, _ = nn.scan(
        ScanBlock,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        length=self.depth,
      )(name="stack")(x, None)
    else:
      for i in range(self.depth):
        x, _ = ScanBlock(name=f"layer_{i}")(x, None)
    if self.pool_type == "map":
      x = PoolHead()(x)
    elif self.pool_type == "tok":
      x = x[:, 0]
    else:
      x = x.mean(axis=1)
    if self.rep_size:
      x = nn.tanh(nn.Dense(self.width, name="pre_logits")(x))
    return x


class ScanBlock(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return x + nn.Dense(x.shape[-1])(nn.relu(x)), None


class WeightNormConv(nn.Module):
  """HF Wav2Vec2's FlaxConvWithWeightNorm: the conv is built and never called (its settings
  are read, its kernel applied by hand), so no trace gives its input width."""

  def setup(self):
    self.conv = nn.Conv(4, kernel_size=(3,), padding="VALID")
    self.weight_g = self.param("weight_g", nn.initializers.ones, (1, 1, self.conv.features))

  def __call__(self, x):
    return x.sum(-1, keepdims=True) * self.weight_g


class OptionalLayerScale(nn.Module):
  """HF BEiT's layer: `self.lambda_1 = self.param(...)` when a setting asks for it, else None."""

  scale_init: float = 0.1

  def setup(self):
    if self.scale_init > 0:
      self.lambda_1 = self.param("lambda_1", nn.initializers.ones, (4,))
    else:
      self.lambda_1 = None

  def __call__(self, x):
    return x if self.lambda_1 is None else self.lambda_1 * x


class ShortcutOnTheInput(nn.Module):
  """diffusers' VAE ResnetBlock2D: the shortcut is built only where the block changes its
  width, and is given `residual = hidden_states`, the block's own input. A sample that keeps
  the width never calls it."""

  in_channels: int
  out_channels: int | None = None

  def setup(self):
    out = self.in_channels if self.out_channels is None else self.out_channels
    self.dense = nn.Dense(out)
    self.shortcut = None
    if self.in_channels != out:
      self.shortcut = nn.Dense(out)

  def __call__(self, hidden_states):
    residual = hidden_states
    hidden_states = self.dense(nn.relu(hidden_states))
    if self.shortcut is not None:
      residual = self.shortcut(residual)
    return hidden_states + residual


class NormOnlyAContextReaches(nn.Module):
  """HF GPT-2's block: the cross-attention norm is built when the config asks for it and runs
  only when the call passes a context, on the value the next norm is given otherwise."""

  features: int
  cross: bool = False

  def setup(self):
    self.norm1 = nn.LayerNorm()
    self.dense = nn.Dense(self.features)
    if self.cross:
      self.norm_cross = nn.LayerNorm()
    self.norm2 = nn.LayerNorm()
    self.out = nn.Dense(3)

  def __call__(self, x, context=None):
    x = self.dense(self.norm1(x))
    if context is not None:
      x = self.norm_cross(x) + context
    return self.out(self.norm2(x))


class NormOnAnExpression(nn.Module):
  """A norm only a context reaches, given an expression no trace saw: no width to read."""

  def setup(self):
    self.first = nn.Dense(4)
    self.layer = nn.LayerNorm()

  def __call__(self, x, c=None):
    x = self.first(x)
    if c is not None:
      x = self.layer(jnp.concatenate([x, c], -1))
    return x


class LayerScale(nn.Module):
  """HF Dinov2's FlaxDinov2LayerScale, its own lines: setup's attribute is an array computed
  from the Param, twice, under the Param's own name."""

  hidden: int = 8
  value: float = 0.5

  def setup(self):
    self.lambda1 = self.value * self.param("lambda1", nn.initializers.ones, (self.hidden,))
    self.lambda1 = self.lambda1 * self.value

  def __call__(self, x):
    return self.lambda1 * x


class ScaleUnderAnotherName(nn.Module):
  """The same with the attribute named apart from the Param."""

  def setup(self):
    self.scale = 2.0 * self.param("gamma", nn.initializers.ones, (8,))

  def __call__(self, x):
    return x * self.scale


class ScaleFromALocal(nn.Module):
  """The arithmetic reads a setup local, which a property cannot read again."""

  def setup(self):
    c = 0.5
    self.lambda1 = c * self.param("lambda1", nn.initializers.ones, (8,))

  def __call__(self, x):
    return self.lambda1 * x


class SwiGLUHidden(nn.Module):
  """HF Dinov2's SwiGLU MLP: the hidden width is a setup local computed in two lines, which no
  field, product or sum of two explains."""

  hidden: int = 10
  ratio: float = 4.0

  def setup(self):
    hidden_features = int(self.hidden * self.ratio)
    hidden_features = (int(hidden_features * 2 / 3) + 7) // 8 * 8
    self.weights_in = nn.Dense(2 * hidden_features)
    self.weights_out = nn.Dense(self.hidden)

  def __call__(self, x):
    a, b = jnp.split(self.weights_in(x), 2, axis=-1)
    return self.weights_out(nn.silu(a) * b)


class OptionalWidth(nn.Module):
  """big_vision's ViT MLP: the hidden width is a setting when set, else four times the input's."""

  mlp_dim: int | None = None

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    h = nn.gelu(nn.Dense(self.mlp_dim or 4 * d)(x))
    return nn.Dense(d)(h)


@dataclasses.dataclass
class InnerConfig:
  hidden: int = 8
  n_inner: int | None = None


class OptionalConfigWidth(nn.Module):
  """HF GPT-2's MLP: `n_inner` when the config sets it, else four times the hidden size."""

  config: InnerConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    inner = c.n_inner if c.n_inner is not None else 4 * c.hidden
    return nn.Dense(c.hidden)(nn.gelu(nn.Dense(inner)(nn.Dense(c.hidden)(x))))
