"""Small Linen models written the way published Linen code writes them (HuggingFace
transformers' and diffusers' Flax modules, flax's examples), for the drafting tests.

Each class names the real code whose idiom it copies. A file, so their source is readable.
"""

# The models keep the published code's lines as written: flax's `combine_masks` is typed
# Optional (None only when every mask is None), which HF's attention does not narrow.
# pyright: reportOptionalOperand=false, reportOptionalMemberAccess=false

import dataclasses
import types
import typing as tp
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
      "embedding",
      self.embedding_init,
      (self.num_embeddings + self.offset, self.features),
      self.param_dtype,
    )

  def __call__(self, positions):
    return super().__call__(positions + self.offset)


class UsesOffsetEmbed(nn.Module):
  @nn.compact
  def __call__(self, positions):
    return nn.Dense(3)(OffsetEmbed(10, 4, dtype=jnp.float32)(positions))


class ShiftedEmbed(nn.Embed):
  """A subclass of nn.Embed keeping nn.Embed's setup: not drafted (a TODO for the class)."""

  def __call__(self, ids):
    return super().__call__(ids + 1)


class ScaledDense(nn.Dense):
  """A subclass of a flax layer other than nn.Embed: not drafted (a TODO for the class)."""

  def __call__(self, x):
    return 2 * super().__call__(x)


class UsesUndraftedSubclasses(nn.Module):
  @nn.compact
  def __call__(self, ids):
    return ScaledDense(3)(ShiftedEmbed(10, 4)(ids))


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


class BasicLayer(nn.Module):
  in_features: int
  out_features: int

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(self.out_features)(x))


class BottleneckLayer(nn.Module):
  in_features: int
  out_features: int

  @nn.compact
  def __call__(self, x):
    hidden = nn.relu(nn.Dense(self.in_features // 2)(x))
    return nn.relu(nn.Dense(self.out_features)(hidden) + nn.Dense(self.out_features)(x))


class ChosenLayerStage(nn.Module):
  """HF ResNet's stage: `layer = Bottleneck if layer_type == "bottleneck" else Basic`, then its
  layers built through `layer(...)`, named "0" and str(i + 1)."""

  in_features: int = 4
  out_features: int = 6
  depth: int = 2
  layer_type: str = "bottleneck"

  def setup(self):
    layer = BottleneckLayer if self.layer_type == "bottleneck" else BasicLayer
    layers = [layer(self.in_features, self.out_features, name="0")]
    for i in range(self.depth - 1):
      layers.append(layer(self.out_features, self.out_features, name=str(i + 1)))
    self.layers = layers

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


class CachedSelfAttention(nn.Module):
  """HF GPT-2/Llama/Bart's decode cache: `_concatenate_to_cache` declares the cache sized by the
  call's keys, and `__call__` tests for it and reads it through `self.variables`."""

  features: int = 8
  num_heads: int = 2
  max_length: int = 6

  def setup(self):
    self.qkv = nn.Dense(3 * self.features)
    self.out = nn.Dense(self.features)

  def _split_heads(self, hidden_states):
    return hidden_states.reshape((*hidden_states.shape[:2], self.num_heads, -1))

  @nn.compact
  def _concatenate_to_cache(self, key, value, query, attention_mask):
    # detect if we're initializing by absence of existing cache data.
    is_initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
    if is_initialized:
      *batch_dims, max_length, _num_heads, _depth_per_head = cached_key.value.shape
      cur_index = cache_index.value
      indices = (0,) * len(batch_dims) + (cur_index, 0, 0)
      key = jax.lax.dynamic_update_slice(cached_key.value, key, indices)
      value = jax.lax.dynamic_update_slice(cached_value.value, value, indices)
      cached_key.value = key
      cached_value.value = value
      num_updated_cache_vectors = query.shape[1]
      cache_index.value = cache_index.value + num_updated_cache_vectors
      pad_mask = jnp.broadcast_to(
        jnp.arange(max_length) < cur_index + num_updated_cache_vectors,
        (*batch_dims, 1, num_updated_cache_vectors, max_length),
      )
      attention_mask = nn.combine_masks(pad_mask, attention_mask)
    return key, value, attention_mask

  def __call__(self, hidden_states, attention_mask, init_cache: bool = False):
    batch_size = hidden_states.shape[0]
    query, key, value = jnp.split(self.qkv(hidden_states), 3, axis=2)
    query, key, value = self._split_heads(query), self._split_heads(key), self._split_heads(value)
    query_length, key_length = query.shape[1], key.shape[1]
    # HF keeps this mask as an array attribute made in setup, which NNX on flax 0.10 refuses
    # (a gap of its own); made here, the cache idiom is the same.
    full_mask = nn.make_causal_mask(jnp.ones((1, self.max_length), dtype="bool"), dtype="bool")
    if self.has_variable("cache", "cached_key"):
      mask_shift = self.variables["cache"]["cache_index"]
      max_decoder_length = self.variables["cache"]["cached_key"].shape[1]
      causal_mask = jax.lax.dynamic_slice(
        full_mask, (0, 0, mask_shift, 0), (1, 1, query_length, max_decoder_length)
      )
    else:
      causal_mask = full_mask[:, :, :query_length, :key_length]
    causal_mask = jnp.broadcast_to(causal_mask, (batch_size, *causal_mask.shape[1:]))
    attention_mask = jnp.broadcast_to(
      jnp.expand_dims(attention_mask, axis=(-3, -2)), causal_mask.shape
    )
    attention_mask = nn.combine_masks(attention_mask, causal_mask)
    # During fast autoregressive decoding, we feed one position at a time.
    if self.has_variable("cache", "cached_key") or init_cache:
      key, value, attention_mask = self._concatenate_to_cache(key, value, query, attention_mask)
    bias = jax.lax.select(
      attention_mask > 0,
      jnp.full(attention_mask.shape, 0.0),
      jnp.full(attention_mask.shape, -1e9),
    )
    weights = nn.dot_product_attention_weights(query, key, bias=bias)
    out = jnp.einsum("...hqk,...khd->...qhd", weights, value)
    return self.out(out.reshape((*out.shape[:2], self.features)))


class CachedDecoder(nn.Module):
  """HF's decoder stack over that attention: layers named `str(i)` in setup, `init_cache`
  passed down to each."""

  vocab_size: int = 11
  features: int = 8
  num_layers: int = 2

  def setup(self):
    self.embed = nn.Embed(self.vocab_size, self.features)
    self.layers = [CachedSelfAttention(self.features, name=str(i)) for i in range(self.num_layers)]

  def __call__(self, input_ids, attention_mask, init_cache: bool = False):
    hidden_states = self.embed(input_ids)
    for layer in self.layers:
      hidden_states = hidden_states + layer(hidden_states, attention_mask, init_cache=init_cache)
    return hidden_states


class UndeclaredVariableTest(nn.Module):
  """Asks for a variable no method of the class declares: nothing the draft can answer."""

  @nn.compact
  def __call__(self, x):
    if self.has_variable("cache", "elsewhere"):
      return x + 1
    return nn.Dense(4)(x)


class SmallConfig:
  """HF's `PretrainedConfig` in miniature: no dataclass, its settings in `to_dict()`, rebuilt
  with `type(config)(**config.to_dict())`, and an alias name read as an attribute."""

  def __init__(self, n_embd: int = 8, n_inner: int = 16, vocab_size: int = 20, **kwargs):
    self.n_embd, self.n_inner, self.vocab_size = n_embd, n_inner, vocab_size

  @property
  def hidden_size(self) -> int:  # HF's attribute_map alias
    return self.n_embd

  def to_dict(self) -> dict:
    return {"n_embd": self.n_embd, "n_inner": self.n_inner, "vocab_size": self.vocab_size}


class ConfiguredConv1D(nn.Module):
  """HF GPT-2's `FlaxConv1D`: the kernel takes its input width from the call."""

  features: int

  @nn.compact
  def __call__(self, inputs):
    kernel = self.param(
      "kernel", jax.nn.initializers.normal(0.02), (self.features, inputs.shape[-1])
    )
    return jnp.dot(inputs, kernel.T)


class ConfiguredMLP(nn.Module):
  """HF GPT-2's MLP: widths from a config object, the hidden width read as an alias."""

  config: SmallConfig

  def setup(self):
    self.embed = nn.Embed(self.config.vocab_size, self.config.hidden_size)
    self.c_fc = ConfiguredConv1D(self.config.n_inner)
    self.c_proj = ConfiguredConv1D(self.config.hidden_size)

  def __call__(self, ids):
    return self.c_proj(jax.nn.gelu(self.c_fc(self.embed(ids))))


class StrictConfig(SmallConfig):
  """A config whose constructor checks its values (HF's configs validate some settings)."""

  def __init__(self, n_embd: int = 8, n_inner: int = 16, vocab_size: int = 20, **kwargs):
    if n_inner != 2 * n_embd:
      raise ValueError("n_inner must be 2 * n_embd")
    super().__init__(n_embd, n_inner, vocab_size)


class CrossBlock(nn.Module):
  """A block with a setting the other kind of block lacks (diffusers' cross-attention blocks)."""

  features: int
  heads: int = 1

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features * self.heads)(x)


class PlainBlock(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(self.features)(x))


class BranchedBlockList(nn.Module):
  """diffusers' UNet: each block's class chosen by a branch in a loop, settings read from a
  setup local, the blocks appended to one list."""

  kinds: tuple[str, ...] = ("cross", "plain")
  widths: tuple[int, ...] = (8, 12)
  heads: int = 2

  def setup(self):
    heads = self.heads
    if isinstance(heads, int):
      heads = (heads,) * len(self.kinds)
    blocks = []
    for i, kind in enumerate(self.kinds):
      if kind == "cross":
        block = CrossBlock(features=self.widths[i], heads=heads[i])
      else:
        block = PlainBlock(features=self.widths[i])
      blocks.append(block)
    self.blocks = blocks

  def __call__(self, x):
    for block in self.blocks:
      x = block(x)
    return x


class ConfigLike:
  """diffusers' ConfigMixin: the model's dataclass fields, read back through `self.config`."""

  @property
  def config(self) -> types.SimpleNamespace:
    fields = dataclasses.fields(tp.cast(tp.Any, self))
    return types.SimpleNamespace(
      **{f.name: getattr(self, f.name) for f in fields if f.name not in ("parent", "name")}
    )


class ReadsItsConfig(nn.Module, ConfigLike):
  """diffusers' VAE: widths read through the config mixin in setup and in the call; a dropout
  made in setup is called with `deterministic` by position."""

  features: int = 8
  scale: float = 2.0
  rate: float = 0.5

  def setup(self):
    self.dense = nn.Dense(self.config.features)
    self.dropout_layer = nn.Dropout(self.rate)

  def __call__(self, x, deterministic: bool = True):
    h = self.dropout_layer(self.dense(x), deterministic)
    return h * self.config.scale


class ShortcutWhenWidened(nn.Module):
  """diffusers' ResnetBlock2D: `self.conv_shortcut = None`, then a layer in its place when the
  block changes the width."""

  features: int = 8

  def setup(self):
    self.dense = nn.Dense(self.features)
    self.conv_shortcut = None
    if self.features != 4:
      self.conv_shortcut = nn.Dense(self.features)

  def __call__(self, x):
    h = self.dense(x)
    if self.conv_shortcut is not None:
      x = self.conv_shortcut(x)
    return x + h


class T5SelfPart(nn.Module):
  features: int = 8

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(self.features)(x)


class T5CrossPart(nn.Module):
  features: int = 8

  @nn.compact
  def __call__(self, x):
    return x * nn.Dense(self.features)(x)


class T5FeedForward(nn.Module):
  features: int = 8

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(self.features)(x))


class TupleGrownInSetup(nn.Module):
  """HF T5's FlaxT5Block: a tuple of layers grown by `+=` under a setting, each named
  `str(k)` by a counter a branch advances (the feed-forward layer is "1" in the encoder, "2" in
  the decoder)."""

  features: int = 8
  causal: bool = False

  def setup(self):
    self.layer = (T5SelfPart(self.features, name=str(0)),)
    index = 1
    if self.causal:
      self.layer += (T5CrossPart(self.features, name=str(1)),)
      index += 1
    self.layer += (T5FeedForward(self.features, name=str(index)),)

  def __call__(self, x):
    x = self.layer[0](x)
    if self.causal:
      # the checker reads the tuple's type off its first line; `+=` grew it
      x = self.layer[1](x)  # pyright: ignore[reportGeneralTypeIssues]
    return self.layer[-1](x)


class EncoderDecoderBlocks(nn.Module):
  """T5's stacks: the same block class, causal in one and not in the other."""

  @nn.compact
  def __call__(self, x):
    encoded = TupleGrownInSetup(8, causal=False)(x)
    return TupleGrownInSetup(8, causal=True)(encoded)
