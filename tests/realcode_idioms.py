"""Small Linen models written the way published Linen code writes them (HuggingFace
transformers' and diffusers' Flax modules, flax's examples), for the drafting tests.

Each class names the real code whose idiom it copies. A file, so their source is readable.
"""

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp


class PartialDenseAttention(nn.Module):
  """HF BART/GPT-J/Llama: `dense = partial(nn.Dense, ...)` then `self.q_proj = dense()` in
  setup, three unpacked on one line, and one sized at the call of the partial (HF BLOOM)."""

  embed_dim: int = 8
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    dense = partial(
      nn.Dense,
      self.embed_dim,
      use_bias=False,
      dtype=self.dtype,
      kernel_init=jax.nn.initializers.normal(0.02),
    )
    self.q_proj, self.k_proj, self.v_proj = dense(), dense(), dense()
    self.out_proj = dense()
    sized = partial(nn.Dense, dtype=self.dtype)
    self.wide = sized(self.embed_dim * 3)

  def __call__(self, x):
    q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    w = jax.nn.softmax(q @ k.swapaxes(-1, -2), axis=-1)
    return self.out_proj(w @ v) + self.wide(x)[..., : self.embed_dim]


class OffsetEmbed(nn.Embed):
  """HF OPT's learned positions: a subclass of flax's own nn.Embed with its own setup."""

  def setup(self):
    self.offset = 2
    self.embedding = self.param(
      "embedding", self.embedding_init, (self.num_embeddings + self.offset, self.features)
    )

  def __call__(self, positions):
    return super().__call__(positions + self.offset)


class UsesOffsetEmbed(nn.Module):
  @nn.compact
  def __call__(self, positions):
    return nn.Dense(3)(OffsetEmbed(10, 4)(positions))


class ConvLayer(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Conv(self.features, (3, 3))(x))


class NamedLayerList(nn.Module):
  """HF ResNet/RegNet: a literal list of layers named "0", "1", ... assigned in setup."""

  features: int = 4

  def setup(self):
    self.layer = [
      ConvLayer(self.features, name="0"),
      ConvLayer(self.features, name="1"),
    ]

  def __call__(self, x):
    for layer in self.layer:
      x = layer(x)
    return x


class AppendedStage(nn.Module):
  """HF ResNet's stage: a local list, its first layer named "0", then appended named str(i + 1)
  in a loop, then assigned; diffusers append a local `block = X(...)` the same way."""

  depth: int = 3
  features: int = 4

  def setup(self):
    layers = [ConvLayer(self.features, name="0")]
    for i in range(self.depth - 1):
      layers.append(ConvLayer(self.features, name=str(i + 1)))
    self.layers = layers
    blocks = []
    for _ in range(2):
      block = nn.Dense(3)
      blocks.append(block)
    self.blocks = blocks

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    for block in self.blocks:
      x = block(x)
    return x


class SetupLocalsInOrder(nn.Module):
  """HF CLIP's vision embeddings: a setup local reads an attribute setup assigned before it."""

  image_size: int = 8
  patch_size: int = 4

  def setup(self):
    patch_size = self.patch_size
    self.num_patches = (self.image_size // patch_size) ** 2
    num_positions = self.num_patches + 1
    self.position_embedding = nn.Embed(num_positions, 6)
    self.position_ids = tuple(range(num_positions))  # HF's is an array: see flax 0.10's TODO

  def __call__(self, x):
    return x + self.position_embedding(jnp.asarray(self.position_ids)).sum()


class Pooler(nn.Module):
  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(x.shape[-1])(x[:, 0]))


class OptionalPooler(nn.Module):
  """HF ViT/BEiT: `self.pooler = Pooler(...) if self.add_pooling_layer else None`."""

  add_pooling_layer: bool = True

  def setup(self):
    self.encoder = nn.Dense(5)
    self.pooler = Pooler() if self.add_pooling_layer else None

  def __call__(self, x):
    x = self.encoder(x)
    pooled = self.pooler(x) if self.add_pooling_layer else None  # pyright: ignore[reportOptionalCall]
    return x, pooled


class LoadingMixin:
  """diffusers' FlaxModelMixin: loading and saving that work on the Linen model."""

  def params_shape(self, x):
    return jax.eval_shape(self.init_weights, jax.random.key(0), x)


def register_fields(cls):
  """diffusers' @flax_register_to_config: wraps __init__ and reads the dataclass fields."""
  import dataclasses

  original = cls.__init__

  def init(self, *args, **kwargs):
    original(self, *args, **kwargs)
    object.__setattr__(self, "registered", [f.name for f in dataclasses.fields(self)])

  cls.__init__ = init
  return cls


@register_fields
class WithInitWeights(nn.Module, LoadingMixin):
  """diffusers' UNet/VAE/ControlNet: a decorator, a mixin base and `init_weights`."""

  features: int = 3

  def init_weights(self, rng, x):
    return self.init(rng, x)["params"]

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features)(x)


class MeshAtTheCall(nn.Module):
  """MaxText: a `jax.sharding.Mesh` handed to the call (it has a `shape` and no dtype)."""

  @nn.compact
  def __call__(self, x, mesh):
    del mesh  # MaxText constrains shardings with it; one device here
    return nn.Dense(3)(x)


class LoopOfUntracedDense(nn.Module):
  """T5's `self.layer += (...)`-style list the trace cannot pair: the TODO says so plainly."""

  @nn.compact
  def __call__(self, x):
    for _ in range(2):
      dense = nn.Dense(3)
      del dense  # built, never called: the trace saw no submodule
    return x


class LambdaParamNorm(nn.Module):
  """HF Llama/Mistral/Gemma's RMSNorm: `self.param(name, lambda _, shape: ..., n)` in setup."""

  hidden_size: int = 4
  eps: float = 1e-6

  def setup(self):
    self.weight = self.param("weight", lambda _, shape: jnp.ones(shape), self.hidden_size)

  def __call__(self, x):
    variance = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return self.weight * (x * jax.lax.rsqrt(variance + self.eps))


class Squeeze(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x * nn.sigmoid(nn.Dense(x.shape[-1])(x.mean(axis=(1, 2), keepdims=True)))


class MixedNamedList(nn.Module):
  """HF RegNet's layer: conv, squeeze-excite, conv in one list named "0", "1", "2"."""

  def setup(self):
    self.layer = [ConvLayer(4, name="0"), Squeeze(name="1"), ConvLayer(5, name="2")]

  def __call__(self, x):
    for layer in self.layer:
      x = layer(x)
    return x


class ChosenClass(nn.Module):
  """HF ResNet's stage: `layer = Bottleneck if ... else Basic`, then `layer(...)`."""

  bottleneck: bool = False

  def setup(self):
    layer = Squeeze if self.bottleneck else ConvLayer
    self.layers = [layer(4, name="0")] if not self.bottleneck else [layer(name="0")]

  def __call__(self, x):
    return self.layers[0](x)
