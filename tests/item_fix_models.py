"""Small Linen models, written the way real code writes them, for the drafting fixes of
`test_port_item_fixes.py` (the draft reads their source from this file)."""

import typing as tp

import flax.linen as nn
import jax
import jax.numpy as jnp

SCALE = 3.0  # a module setting a program may rebind at startup


class ScaledByGlobal(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(x) * SCALE


class ScanBlock(nn.Module):
  @nn.compact
  def __call__(self, c, _):
    return jnp.tanh(nn.Dense(8)(c)), None


class ScanSameInit(nn.Module):
  @nn.compact
  def __call__(self, x):
    stack = nn.scan(ScanBlock, variable_axes={"params": 0}, split_rngs={"params": False}, length=3)
    return stack(name="s")(x, None)[0]


class ScanSplitInit(nn.Module):
  @nn.compact
  def __call__(self, x):
    stack = nn.scan(ScanBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
    return stack(name="s")(x, None)[0]


class EpsFromCall(nn.Module):
  @nn.compact
  def __call__(self, x, eps: float = 1e-6):
    return nn.LayerNorm(epsilon=eps)(x)


class DtypeFromInput(nn.Module):
  width: int = 3

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.width, dtype=x.dtype)(x)


class ReductionFromRank(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm(reduction_axes=tuple(range(1, x.ndim)))(x)


class PaddingFromFlag(nn.Module):
  width: int = 4

  @nn.compact
  def __call__(self, x, same: bool = True):
    return nn.Conv(self.width, (3,), padding="SAME" if same else "VALID")(x)


class MomentumFromCall(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False, momentum: float = 0.9):
    return nn.BatchNorm(use_running_average=not train, momentum=momentum)(x)


class NamedInner(nn.Module):
  width: int = 3

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.width)(x)
    if (self.name or "").startswith("enc"):  # behaviour chosen by the module's name
      h = h * 2
    return h


class ChoosesByName(nn.Module):
  width: int = 3

  @nn.compact
  def __call__(self, x):
    return NamedInner(self.width, name="encoder")(x) + NamedInner(self.width, name="decoder")(x)


class PartitionedDense(nn.Module):
  @nn.compact
  def __call__(self, x):
    init = nn.with_partitioning(nn.initializers.lecun_normal(), (None, "model"))
    return nn.Dense(8, kernel_init=init)(x)


class DenseBase(nn.Module):
  features: int = 4
  dtype: tp.Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features, dtype=self.dtype)(x)


class ScaledChild(DenseBase):
  scale: float = 2.0

  def __call__(self, x):
    return super().__call__(x) * self.scale


class GruStep(nn.Module):
  width: int = 5

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.width)(x)
    h, y = nn.GRUCell(self.width)(h, x)
    return y


class GruSequence(nn.Module):
  width: int = 5

  @nn.compact
  def __call__(self, x):
    return nn.RNN(nn.GRUCell(self.width))(x)


class LstmByHand(nn.Module):
  width: int = 6

  @nn.compact
  def __call__(self, x):
    cell = nn.LSTMCell(self.width)
    carry = cell.initialize_carry(jax.random.key(0), x[:, 0].shape)
    outs = []
    for t in range(x.shape[1]):
      carry, y = cell(carry, x[:, t])
      outs.append(y)
    return jnp.stack(outs, 1)


class NormOverTwoAxes(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm(reduction_axes=(-2, -1), feature_axes=(-2, -1))(x)


class BatchNormOverTwoAxes(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    return nn.BatchNorm(use_running_average=not train, axis=(-2, -1))(x)


class FrozenBatchNormOverTwoAxes(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.BatchNorm(use_running_average=True, axis=(-2, -1))(x)


class UNetish(nn.Module):
  width: int = 4

  @nn.compact
  def __call__(self, x):
    skips = []
    for _ in range(2):
      x = nn.relu(nn.Dense(self.width)(x))
      skips.append(x)
    for s in reversed(skips):
      x = nn.relu(nn.Dense(self.width)(jnp.concatenate([x, s], -1)))
    return x


class SelfAttentionMasked(nn.Module):
  heads: int = 2

  @nn.compact
  def __call__(self, x, mask):
    return nn.SelfAttention(num_heads=self.heads)(x, mask, deterministic=True)


class CrossAttention(nn.Module):
  @nn.compact
  def __call__(self, q, kv):
    return nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)(q, kv, deterministic=True)


def _drop_path_mask(x, rate, deterministic, make_rng):
  """big_vision's stochastic depth: one keep-or-drop per example, drawn with the rng function
  the module hands in."""
  if not deterministic and rate:
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    return 1.0 - jax.random.bernoulli(make_rng("dropout"), rate, shape)
  return 1.0


class StochasticDepthBlock(nn.Module):
  width: int = 6
  drop_p: float = 0.5

  @nn.compact
  def __call__(self, x, *, train=False):
    y = nn.Dense(x.shape[-1])(nn.relu(nn.Dense(self.width)(nn.LayerNorm()(x))))
    return x + y * _drop_path_mask(x, self.drop_p, not train, self.make_rng)
