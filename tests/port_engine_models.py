"""Small Linen models for the drafting engine's unit tests (a file, so their source is readable)."""

import dataclasses
from functools import partial
from typing import Any

import flax.linen as nn
import jax
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


class Block(nn.Module):
  """A pre-norm attention block; a position counter only while decoding."""

  heads: int = 2
  decode: bool = False

  @nn.compact
  def __call__(self, x):
    if self.decode:
      index = self.variable("cache", "index", lambda: jnp.array(0, jnp.int32))
      index.value += 1
    y = nn.LayerNorm()(x)
    y = nn.MultiHeadDotProductAttention(num_heads=self.heads, decode=self.decode)(y)
    return x + nn.Dense(x.shape[-1])(y)


class RematStack(nn.Module):
  """`layers_N` blocks under nn.remat, in a loop over a config field."""

  depth: int = 2

  @nn.compact
  def __call__(self, x):
    block = nn.remat(Block)
    for i in range(self.depth):
      x = block(name=f"layers_{i}")(x)
    return x


class ScanCell(nn.Module):
  """A scan body: (carry, x) -> (carry, y), sowing its carry."""

  @nn.compact
  def __call__(self, carry, x):
    carry = nn.tanh(nn.Dense(carry.shape[-1])(carry) + x)
    self.sow("intermediates", "carry", carry)
    return carry, carry


class Scanned(nn.Module):
  """nn.scan over a module, with per-step inputs and a broadcast flag."""

  length: int = 3

  @nn.compact
  def __call__(self, carry, xs):
    carry, ys = nn.scan(
      ScanCell,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      in_axes=1,
      out_axes=1,
      length=self.length,
    )(name="cells")(carry, xs)
    return carry + ys.sum(axis=1)


class Recurrent(nn.Module):
  """nn.RNN over an OptimizedLSTMCell, then a head."""

  @nn.compact
  def __call__(self, x):
    h = nn.RNN(nn.OptimizedLSTMCell(5), name="rnn")(x)
    return nn.Dense(2)(h[:, -1])


class Partitioned(nn.Module):
  """Params with logical axis names."""

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(nn.ones_init(), ("embed",)), (4,))
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    return nn.Dense(3, kernel_init=init, use_bias=False)(x * scale)


class Mixed(nn.Module):
  """nn.Sequential, an Einsum without bias and a GRU cell stepped over time."""

  @nn.compact
  def __call__(self, x):
    h = nn.Sequential([nn.Dense(6), nn.relu, nn.Dense(4)])(x)
    h = nn.Einsum((4, 3), "btd,df->btf", use_bias=False)(h)
    cell = nn.GRUCell(3, name="gru")
    carry = jnp.zeros((x.shape[0], 3))
    for t in range(x.shape[1]):
      carry, _ = cell(carry, h[:, t])
    return carry


class Stage(nn.Module):
  """A block that builds its norm through a factory field (the flax ResNet example's shape)."""

  features: int
  norm: Any

  @nn.compact
  def __call__(self, x):
    y = self.norm()(nn.Dense(self.features)(x))
    if x.shape[-1] != self.features:
      x = nn.Dense(self.features, name="proj")(x)
    return x + y


class Stages(nn.Module):
  """partial(...) factories, blocks made in nested loops, a train flag bound by a partial."""

  sizes: tuple[int, ...] = (1, 2)

  @nn.compact
  def __call__(self, x, train: bool = False):
    norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9)
    x = norm(name="stem_norm")(x)
    for i, size in enumerate(self.sizes):
      for _ in range(size):
        x = Stage(4 * (i + 1), norm=norm)(x)
    return x


class Member(nn.Module):
  """One member of a vmapped ensemble (or one example of a batch mapped with shared params)."""

  features: int = 3

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features)(x)


class Ensemble(nn.Module):
  """nn.vmap with params shared over the batch axis, then one set of params per member (each
  member through nn.remat)."""

  members: int = 2

  @nn.compact
  def __call__(self, x):
    shared = nn.vmap(
      Member, variable_axes={"params": None}, split_rngs={"params": False}, in_axes=0
    )(4, name="shared")
    member = nn.remat(Member)  # each member rematerialized in the backward pass
    heads = nn.vmap(
      member,
      variable_axes={"params": 0},
      split_rngs={"params": True},
      in_axes=None,
      out_axes=1,
      axis_size=self.members,
    )(name="heads")
    return heads(shared(x))  # (batch, members, 3)


class Centered(nn.Module):
  """A member that reads the whole mapped axis through a collective."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(x - jax.lax.pmean(x, "batch"))


class DropMember(nn.Module):
  """A member with dropout (inactive here, but a stream it draws in training)."""

  deterministic: bool = True

  @nn.compact
  def __call__(self, x):
    return nn.Dropout(0.5, deterministic=self.deterministic)(nn.Dense(3)(x))


class Sower(nn.Module):
  """A member that sows its output."""

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(3)(x)
    self.sow("intermediates", "y", y)
    return y


class Handed(nn.Module):
  """A submodule handed in as a dataclass field (Linen adopts it under the field's name)."""

  child: nn.Module

  @nn.compact
  def __call__(self, x):
    return Member(3)(self.child(x))  # a Member of another input width: an added argument


class NowrapHelper(nn.Module):
  """A layer built by a helper method and named by a variable: the trace cannot place it."""

  @nn.nowrap
  def _norm(self, name):
    return nn.LayerNorm(name=name)

  @nn.compact
  def __call__(self, x):
    return self._norm("ln")(nn.Dense(4)(x))


class InlineRemat(nn.Module):
  """nn.remat (and its alias nn.checkpoint) applied, built and called in one expression."""

  @nn.compact
  def __call__(self, x):
    x = nn.remat(Member)(4, name="first")(x)
    return nn.checkpoint(Member, prevent_cse=False)()(x)


class RefusedVmaps(nn.Module):
  """nn.vmap forms the draft keeps as TODOs (each in its own statement)."""

  in_axis: int = 0

  @nn.compact
  def __call__(self, x):
    y = nn.vmap(Member, variable_axes={"params": 1}, split_rngs={"params": True}, in_axes=1)()(x.T)
    y = nn.vmap(
      Member, variable_axes={"params": 0, "batch_stats": 0}, split_rngs={"params": True}
    )()(x)
    y = nn.vmap(
      Member, variable_axes={"params": 0}, split_rngs={"params": True}, methods=["__call__"]
    )()(x)
    y = nn.vmap(
      Centered, variable_axes={"params": 0}, split_rngs={"params": True}, axis_name="batch"
    )()(x)
    y = nn.vmap(
      Member, variable_axes={"params": 0}, split_rngs={"params": True}, spmd_axis_name="data"
    )()(x)
    y = nn.vmap(Member, {"params": 0}, {"params": True})()(x)
    y = nn.vmap(
      Member, variable_axes={"params": 0}, split_rngs={"params": True}, axis_size=x.shape[0]
    )()(x)
    y = nn.vmap(
      Member, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=self.in_axis
    )()(x)
    y = nn.vmap(
      Member, variable_axes={"params": None}, split_rngs={"params": False, "dropout": True}
    )()(x)
    y = nn.vmap(
      DropMember, variable_axes={"params": 0}, split_rngs={"params": True}, axis_size=3
    )()(x)
    y = nn.vmap(
      Sower, variable_axes={"params": 0, "intermediates": 0}, split_rngs={"params": True}
    )()(x)
    for _ in range(2):
      y = nn.vmap(Member, variable_axes={"params": None}, split_rngs={"params": False})(3)(y)
    return y


class VmapInSetup(nn.Module):
  """An ensemble built in setup and called in another method: kept as a TODO."""

  def setup(self):
    self.heads = nn.vmap(
      Member, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None, axis_size=2
    )()

  def __call__(self, x):
    return self.heads(x)


@dataclasses.dataclass(frozen=True)
class HFConfig:
  """A frozen config object handed to every module, as HuggingFace Flax models do."""

  width: int = 8
  layers: int = 3
  init_range: float = 0.02


class HFBlock(nn.Module):
  config: HFConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    init = jax.nn.initializers.normal(self.config.init_range)  # jax's, not flax.linen's
    self.fc = nn.Dense(self.config.width, dtype=self.dtype, kernel_init=init)
    self.ln = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype)

  def __call__(self, x):
    return x + self.fc(self.ln(x))


class HFBlockCollection(nn.Module):
  """HuggingFace Flax's layer list: each block named by its index (`0`, `1`, ...)."""

  config: HFConfig
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.blocks = [
      HFBlock(self.config, name=str(i), dtype=self.dtype) for i in range(self.config.layers)
    ]
    self.heads = [nn.Dense(2, name=f"head_{i}") for i in range(2)]

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return [head(x) for head in self.heads]


class CountedDown(nn.Module):
  """Blocks named by a counter that does not count up in the order they are made."""

  def setup(self):
    self.blocks = [nn.Dense(4, name=str(i)) for i in reversed(range(3))]

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return x


class ReadsVariables(nn.Module):
  """Reads Linen's variable dict (no NNX idiom is drafted for it)."""

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(3, name="proj")(x)
    return y * jnp.sum(self.variables["params"]["proj"]["bias"])


hidden = 7  # a module-level name that a method below binds too (as a script's `x = ...` does)


class ShadowsAGlobal(nn.Module):
  """Widths read from the call argument, which shares its name with a module global."""

  @nn.compact
  def __call__(self, hidden):
    scale = self.param("scale", nn.initializers.ones, (hidden.shape[-1],))
    return nn.Dense(hidden.shape[-1])(hidden) * scale


class EnumeratedWidths(nn.Module):
  """Layers built in a loop over `enumerate` of the widths (a tuple loop target)."""

  features: tuple[int, ...] = (6, 4, 3)

  @nn.compact
  def __call__(self, x):
    for i, f in enumerate(self.features):
      x = nn.Dense(f, name=f"dense_{i}")(x)
      x = nn.relu(x) if i < len(self.features) - 1 else x
    return x


class NormUnderAnIfInALoop(nn.Module):
  """A norm after every layer but the last: fewer layers than iterations."""

  features: tuple[int, ...] = (6, 4, 3)

  @nn.compact
  def __call__(self, x):
    for i, f in enumerate(self.features):
      x = nn.Dense(f)(x)
      if i < len(self.features) - 1:
        x = nn.LayerNorm()(x)
    return x


class NormIfTheCallSaysSo(nn.Module):
  """A norm in a loop under an `if` that reads the call: `__init__` cannot evaluate it."""

  @nn.compact
  def __call__(self, x):
    for f in (6, 4):
      x = nn.Dense(f)(x)
      if x.shape[-1] > 4:
        x = nn.LayerNorm()(x)
    return x


class DownAndUp(nn.Module):
  """A UNet's shape: blocks per level in nested loops (convs numbered on past an earlier
  `Conv_0`), a downsampling conv on every level but the last (an `if` in the loop)."""

  mults: tuple[int, ...] = (1, 2)

  @nn.compact
  def __call__(self, x):
    h = nn.Conv(4, (3, 3), padding="SAME")(x)
    for level, mult in enumerate(self.mults):
      for _ in range(2):
        h = nn.relu(nn.Conv(4 * mult, (3, 3), padding="SAME")(h))
      if level != len(self.mults) - 1:
        h = nn.Conv(h.shape[-1], (3, 3), strides=(2, 2), padding="SAME", name=f"down_{level}")(h)
    return h


class ThreeOnOneLine(nn.Module):
  """Three layers of one class built and called on one line, one inside another's input."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(nn.relu(nn.Dense(4)(x))) + nn.Dense(3)(x)


class HeadsInAComprehension(nn.Module):
  """Layers built and called in a list comprehension over a field."""

  widths: tuple[int, ...] = (4, 5)

  @nn.compact
  def __call__(self, x):
    outs = [nn.Dense(w)(x) for w in self.widths]
    scales = [nn.Dense(1, name=f"scale_{i}")(x) for i in range(2)]
    return jnp.concatenate([*outs, *scales], axis=-1)


class ComprehensionOverOutputs(nn.Module):
  """A comprehension of layers over what the call computed: `__init__` cannot replay it."""

  @nn.compact
  def __call__(self, x):
    parts = jnp.split(x, 2, axis=-1)
    return [nn.Dense(2)(p) for p in parts]


class ExampleBlock(nn.Module):
  """flax/examples/imagenet's residual block: conv and norm factories handed in as fields."""

  filters: int
  conv: Any
  norm: Any
  strides: tuple[int, int] = (1, 1)

  @nn.compact
  def __call__(self, x):
    y = self.norm()(self.conv(self.filters, (3, 3), self.strides)(x))
    y = self.norm(scale_init=nn.initializers.zeros_init())(
      self.conv(self.filters, (3, 3))(nn.relu(y))
    )
    if x.shape != y.shape:
      x = self.norm(name="norm_proj")(
        self.conv(self.filters, (1, 1), self.strides, name="conv_proj")(x)
      )
    return nn.relu(x + y)


class ExampleResNet(nn.Module):
  """flax/examples/imagenet's ResNet: the block class and the conv class are fields, the conv
  factory a partial of the field."""

  stage_sizes: tuple[int, ...] = (1, 1)
  block_cls: Any = ExampleBlock
  conv: Any = nn.Conv

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = partial(self.conv, use_bias=False)
    norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9)
    x = nn.relu(norm(name="bn_init")(conv(4, (3, 3), (2, 2), name="conv_init")(x)))
    x = nn.max_pool(x, (3, 3), strides=(1, 1), padding="SAME")
    for i, size in enumerate(self.stage_sizes):
      for j in range(size):
        strides = (2, 2) if i > 0 and j == 0 else (1, 1)
        x = self.block_cls(4 * 2**i, strides=strides, conv=conv, norm=norm)(x)
    return nn.Dense(3)(jnp.mean(x, axis=(1, 2)))


class ScannedLayer(nn.Module):
  """A MaxText-style decoder layer: logically partitioned kernel, a broadcast input."""

  @nn.compact
  def __call__(self, x, positions):
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    y = nn.DenseGeneral(x.shape[-1], kernel_init=init, name="mlp")(nn.RMSNorm()(x))
    return x + y * positions[..., None], None


class PartitionedScan(nn.Module):
  """MaxText's stack: nn.scan with metadata_params naming the layer axis for sharding."""

  num_layers: int = 3

  @nn.compact
  def __call__(self, x, positions):
    x, _ = nn.scan(
      ScannedLayer,
      variable_axes={"params": 0},
      split_rngs={"params": True},
      in_axes=(nn.broadcast,),
      length=self.num_layers,
      metadata_params={nn.PARTITION_NAME: "layers"},
    )(name="layers")(x, positions)
    return x


class FieldNamedLikeASubmodule(nn.Module):
  """A field and a submodule of one name: Linen keeps them apart, NNX cannot."""

  head: int = 3

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.head, name="head")(x)


class ProjectInput(nn.Module):
  """A kernel shaped by the input's width (HF's FlaxConv1D): the port takes its shape."""

  features: int

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features))
    return x @ kernel


class OptionalCrossProjection(nn.Module):
  """HF's decoder layer: a cross-attention projection built only when the config asks for
  it, which the sample's configuration does not."""

  width: int = 6
  cross: bool = False

  def setup(self):
    self.inp = nn.Dense(self.width)
    self.proj = ProjectInput(3)
    if self.cross:
      self.cross_proj = ProjectInput(3)

  def __call__(self, x, context=None):
    y = self.proj(self.inp(x))
    if self.cross:
      y = y + self.cross_proj(context)
    return y
