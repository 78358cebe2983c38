"""HOLDOUT_G: a seventh holdout of real Linen classes, from repositories no other set uses.

Chosen after HOLDOUT and HOLDOUT_B to HOLDOUT_F had been looked at, from repositories that
none of them, the TUNING set or the HF enumeration draws on: octo-models/octo (the Octo robot
policy's components: a 1D transposed-conv upsampler, a conv-GroupNorm-mish block, a residual
block FiLM-conditioned on a vector with an optional 1x1 projection, the conditional 1D UNet
with tuple widths, a time embedding and skip concatenations, learned Fourier features, an
MLP-ResNet block and network, the diffusion score head given its three sub-networks as module
instances, a FiLM layer, a patchifying encoder and a small weight-standardized conv stem whose
kernel sizes, strides, widths and paddings are tuples zipped together), dibyaghosh/jaxrl_m
(vision encoders: the IMPALA residual stack and encoder, whose stacks are built in `setup`
while its multiplicative condition is a compact Dense, spatial learned embeddings, a spatial
softmax given its position arrays as fields, and a preprocessing wrapper given its encoder as
a module instance and dicts of call keywords as fields), young-geng/m3ae_public (M3AE: an MLP
head, the transformer MLP, attention with a padding mask and a `deterministic` field merged
with a call argument, block, transformer, the multimodal autoencoder's encoder read by its
`forward_representation` method, built in `setup` from a dict of config updates, and a ViT
classifier that calls a method of an autoencoder instance given as a field) and
google-deepmind/gemma at a commit where its modules are Linen and import no kauldron (Gemma
2: a shaped einsum weight contracted by an equation passed at call, RMS norm, the embedder's
`encode`, attention with RoPE, grouped-query or fused qkv projections, logit soft cap and a
sliding window, the gated feed-forward with an optionally transposed param, the block built
in `setup`, and the whole model configured by a frozen dataclass with enum fields and a tuple
of attention types). Each entry pins the commit its source is read at; its `second` setting
changes every width, every tuple item and every config field the class reads, with inputs
of other sizes where the class allows; where a class takes a tuple of widths, its `second`
tuple is one item longer (octo's UNet, score-head MLP and stem, jaxrl_m's IMPALA encoders,
gemma's attention types). No class here has a compute dtype other than float32 (jaxrl_m's
`param_dtype` stays float32); dropout and drop path are off at both settings (rate 0 or
None, `train=False`, `deterministic=True`), since the comparison runs without a dropout key.

Where a switch changes which params exist, the second setting flips it: octo's residual
block projects its shortcut in the first sample and not in the second (input width equal to
`features` there), the patch encoder and stem take FiLM and ImageNet normalization (six
channels: two stacked RGB images) only in the second, the IMPALA encoder its multiplicative
condition only in the second; gemma's attention is grouped-query in the first sample and
fused-qkv multi-head in the second, its block multi-head then grouped-query, its model
multi-query then grouped-query; m3ae's models use type embeddings in the first and not in
the second. Left unchanged: octo's `FourierFeatures.learnable` (unlearned features have no
params), the Gemma `Einsum` equation (a call argument; only the sizes change), gemma's
`head_dim`s even (RoPE splits them in halves), m3ae's emb dims multiples of 4 and its image
lengths squares (its 2D sin-cos position embedding), jaxrl_m's spatial-softmax temperature
(-1, the learned one: any other value leaves the class without params), octo's group counts
dividing the widths and its stem widths multiples of 32 (its GroupNorms take the default 32
groups), the PreprocessEncoder's `normalize` (without it the normalization it is given is
not read), and the classes with no fields (octo's `FilmConditioning`, gemma's `RMSNorm`), whose
inputs change. The ScoreActor's second observation encoding has a unit batch axis (the class
broadcasts it), and the PreprocessEncoder's second image has no batch axis (the class adds
one and squeezes it), with ImageNet normalization, resizing, a frozen encoder and call
keywords forced over defaults.

Left out: google-research/long-range-arena (its models are `flax.deprecated.nn`),
google-research/diffusion_distillation (no snapshot could be had), sanchit-gandhi/whisper-jax
(a copy of HF transformers' Flax Whisper, which the drafter is built on), octo's transformer,
tokenizers and action heads (`octo.utils.typing` reads `jax.random.KeyArray`, gone from the
newest jax; the action heads also import distrax), octo's ViT-ResNet and its residual units
and jaxrl_m's ResNet V2 and ViT (copies of vision_transformer and big_vision, which other
sets use), jaxrl_m's ResNet V1 and Atari encoder (copies of the flax examples the drafter is
built on), its bridge ResNet encoder (it reads `x` before assigning it), its networks module
(distrax), its MAE (a copy of m3ae's), m3ae's `MaskedAutoencoder` and the multimodal
autoencoder's `__call__` (they draw a random mask from a `noise` key at apply time), m3ae's
`DropPath` alone (no params), and gemma's newest `gm` package (it imports kauldron).

Do not draft these classes while the drafter is being worked on, and do not read their
drafts: `measure.py --cases holdout_g` runs them once, at the end (README.md).
"""

from __future__ import annotations

from cases import Arr, Case, Ints, Obj, Positions, Ref, Setting, by_name

OCTO = ("octo-models/octo", "241fb3514b7c40957a86d869fecb7c7fc353f540")
JAXRL_M = ("dibyaghosh/jaxrl_m", "54ef8acb640b3955ae1370a1a309c2ab12427dc9")
M3AE = ("young-geng/m3ae_public", "a5eb14f851a2ad9b4fe84768af9d853b1e10436e")
GEMMA = ("google-deepmind/gemma", "91c3739f6ec1c118167b1e7f7b69953e79c37a52")

_UNET = "octo.model.components.unet"
_DIFF = "octo.model.components.diffusion"
_VIT_ENC = "octo.model.components.vit_encoders"
_IMPALA = "jaxrl_m.vision.impala"
_BRIDGE = "jaxrl_m.vision.bridge_resnet_v1"
_M3AE = "m3ae.model"
_GEMMA_MOD = "gemma.modules"


def _init(name: str, *args: object, **kw: object) -> Obj:
  """A `jax.nn.initializers` initializer, built (some classes take them as fields)."""
  return Obj(f"jax.nn.initializers:{name}", kw, args=args)


def _linspace(start: float, stop: float, num: int) -> Obj:
  """A float32 `numpy.linspace` (jaxrl_m's spatial softmax takes its positions as fields)."""
  return Obj("numpy:linspace", dict(num=num, dtype="float32"), args=(start, stop))


def _causal(batch: int, length: int) -> Obj:
  """A [batch, length, length] boolean causal mask (gemma's attention mask), as a jax array."""
  tri = Obj("jax.numpy:tri", dict(dtype="bool"), args=(length,))
  return Obj("jax.numpy:broadcast_to", args=(tri, (batch, length, length)))


def _attn_type(name: str) -> Ref:
  return Ref(f"{_GEMMA_MOD}:AttentionType.{name}")


def _impala(**kw: object) -> Obj:
  """A jaxrl_m `ImpalaEncoder` instance (the encoder a `PreprocessEncoder` wraps)."""
  return Obj(f"{_IMPALA}:ImpalaEncoder", kw)


def _mae(**config: object) -> Obj:
  """An m3ae `MaskedAutoencoder` whose `config_updates` are `config` (a plain dict)."""
  image_output_dim = config.pop("image_output_dim")
  return Obj(
    f"{_M3AE}:MaskedAutoencoder",
    dict(config_updates=config, image_output_dim=image_output_dim),
  )


# m3ae's multimodal autoencoder: the config updates of each setting (every field differs; the
# emb dims are multiples of 4, as its 2D sin-cos position embedding needs).
_M3AE_FIRST = dict(
  emb_dim=8,
  dec_emb_dim=6,
  depth=1,
  dec_depth=1,
  num_heads=2,
  dec_num_heads=3,
  mlp_ratio=2,
  output_head_depth=0,
  use_type_embedding=True,
)
_M3AE_SECOND = dict(
  emb_dim=12,
  dec_emb_dim=10,
  depth=2,
  dec_depth=2,
  num_heads=3,
  dec_num_heads=5,
  mlp_ratio=3,
  output_head_depth=1,
  use_type_embedding=False,
)


def _gemma_config(**kw: object) -> Obj:
  return Obj("gemma.transformer:TransformerConfig", kw)


HOLDOUT_G: list[Case] = [
  # ----------------------------------------------------------------------- octo-models/octo
  Case(
    "octo_upsample1d",
    *OCTO,
    module=_UNET,
    cls="Upsample1d",
    kind="resampler (1D transposed conv, stride 2)",
    first=Setting(dict(features=6), args=(Arr((2, 5, 4)),)),
    second=Setting(dict(features=10), args=(Arr((1, 7, 3)),)),
  ),
  Case(
    "octo_conv1d_block",
    *OCTO,
    module=_UNET,
    cls="Conv1dBlock",
    kind="CNN block (1D conv with integer padding, GroupNorm, mish)",
    first=Setting(dict(features=8, kernel_size=3, n_groups=4), args=(Arr((2, 6, 5)),)),
    second=Setting(dict(features=12, kernel_size=5, n_groups=3), args=(Arr((1, 9, 7)),)),
  ),
  Case(
    "octo_cond_residual_block1d",
    *OCTO,
    module=_UNET,
    cls="ConditionalResidualBlock1D",
    kind="CNN block (two conv blocks, FiLM scale and bias from a condition, optional 1x1 proj)",
    first=Setting(
      dict(features=8, kernel_size=3, n_groups=4, residual_proj=True),
      args=(Arr((2, 6, 5)), Arr((2, 7))),
    ),
    second=Setting(
      dict(features=12, kernel_size=5, n_groups=6, residual_proj=False),
      args=(Arr((1, 9, 12)), Arr((1, 11))),
    ),
  ),
  Case(
    "octo_cond_unet1d",
    *OCTO,
    module=_UNET,
    cls="ConditionalUnet1D",
    kind="UNet (1D, tuple widths, time embedding, skip concatenations, conditioned blocks)",
    first=Setting(
      dict(down_features=(8, 16), mid_layers=1, kernel_size=3, n_groups=4, time_features=8),
      args=(Arr((2, 5)), Arr((2, 8, 3)), Arr((2, 1))),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(down_features=(6, 12, 18), mid_layers=2, kernel_size=5, n_groups=3, time_features=10),
      args=(Arr((1, 7)), Arr((1, 12, 4)), Arr((1, 1))),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "octo_fourier_features",
    *OCTO,
    module=_DIFF,
    cls="FourierFeatures",
    kind="embedding (learned Fourier features: a kernel shaped from the input width)",
    first=Setting(dict(output_size=8, learnable=True), args=(Arr((2, 3)),)),
    second=Setting(dict(output_size=12, learnable=True), args=(Arr((4, 5)),)),
  ),
  Case(
    "octo_mlp_resnet_block",
    *OCTO,
    module=_DIFF,
    cls="MLPResNetBlock",
    kind="MLP block (optional layer norm, 4x expansion, projected shortcut when widths differ)",
    first=Setting(
      dict(features=8, act=Ref("flax.linen:swish")),
      args=(Arr((3, 5)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(features=12, act=Ref("flax.linen:relu"), dropout_rate=0.0, use_layer_norm=True),
      args=(Arr((4, 12)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "octo_mlp_resnet",
    *OCTO,
    module=_DIFF,
    cls="MLPResNet",
    kind="MLP (input projection, a loop of residual blocks, activation as a field)",
    first=Setting(
      dict(num_blocks=1, out_dim=3, hidden_dim=8), args=(Arr((3, 5)),), kwargs=dict(train=False)
    ),
    second=Setting(
      dict(
        num_blocks=3,
        out_dim=4,
        hidden_dim=12,
        dropout_rate=0.0,
        use_layer_norm=True,
        activation=Ref("flax.linen:gelu"),
      ),
      args=(Arr((2, 7)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "octo_score_actor",
    *OCTO,
    module=_DIFF,
    cls="ScoreActor",
    kind="diffusion head (three module instances as fields: time features, MLP, MLP-ResNet)",
    first=Setting(
      dict(
        time_preprocess=Obj(f"{_DIFF}:FourierFeatures", dict(output_size=8)),
        cond_encoder=Obj(f"{_DIFF}:MLP", dict(hidden_dims=(16, 8))),
        reverse_network=Obj(f"{_DIFF}:MLPResNet", dict(num_blocks=2, out_dim=3, hidden_dim=8)),
      ),
      args=(Arr((2, 6)), Arr((2, 3)), Arr((2, 1))),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        time_preprocess=Obj(f"{_DIFF}:FourierFeatures", dict(output_size=12)),
        cond_encoder=Obj(
          f"{_DIFF}:MLP",
          dict(
            hidden_dims=(20, 14, 10),
            activation=Ref("flax.linen:gelu"),
            activate_final=True,
            use_layer_norm=True,
          ),
        ),
        reverse_network=Obj(
          f"{_DIFF}:MLPResNet",
          dict(
            num_blocks=1,
            out_dim=4,
            hidden_dim=10,
            use_layer_norm=True,
            activation=Ref("flax.linen:tanh"),
          ),
        ),
      ),
      # The observation encoding has a unit batch axis here: the class broadcasts it.
      args=(Arr((1, 9)), Arr((3, 4)), Arr((3, 1))),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "octo_film_conditioning",
    *OCTO,
    module="octo.model.components.film_conditioning_layer",
    cls="FilmConditioning",
    kind="conditioning (FiLM: two zero-initialized Dense layers sized from the feature map)",
    first=Setting(dict(), args=(Arr((2, 4, 4, 6)), Arr((2, 5)))),
    second=Setting(dict(), args=(Arr((1, 3, 5, 9)), Arr((1, 7)))),
  ),
  Case(
    "octo_patch_encoder",
    *OCTO,
    module=_VIT_ENC,
    cls="PatchEncoder",
    kind="encoder (image normalization, patchifying conv, optional FiLM on a condition)",
    first=Setting(
      dict(use_film=False, patch_size=4, num_features=8, img_norm_type="default"),
      args=(Arr((2, 8, 8, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(use_film=True, patch_size=2, num_features=12, img_norm_type="imagenet"),
      args=(Arr((1, 6, 4, 6)),),
      kwargs=dict(train=False, cond_var=Arr((1, 5))),
    ),
  ),
  Case(
    "octo_small_stem",
    *OCTO,
    module=_VIT_ENC,
    cls="SmallStem",
    kind="CNN stem (tuples zipped: weight-standardized convs, GroupNorm, patchifying conv)",
    first=Setting(
      dict(
        use_film=False,
        patch_size=16,
        kernel_sizes=(3, 3),
        strides=(2, 2),
        features=(32, 64),
        padding=(1, 1),
        num_features=8,
        img_norm_type="default",
      ),
      args=(Arr((2, 8, 8, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        use_film=True,
        patch_size=32,
        kernel_sizes=(5, 3, 3),
        strides=(1, 1, 2),
        features=(96, 128, 32),
        padding=(2, 0, 1),
        num_features=10,
        img_norm_type="imagenet",
      ),
      args=(Arr((1, 14, 12, 6)),),
      kwargs=dict(train=False, cond_var=Arr((1, 4))),
    ),
  ),
  # --------------------------------------------------------------------- dibyaghosh/jaxrl_m
  Case(
    "jaxrl_m_resnet_stack",
    *JAXRL_M,
    module=_IMPALA,
    cls="ResnetStack",
    kind="CNN stage (IMPALA: conv, optional max pool, a loop of residual conv pairs)",
    first=Setting(dict(num_ch=6, num_blocks=1), args=(Arr((2, 8, 8, 3)),)),
    second=Setting(dict(num_ch=10, num_blocks=2, use_max_pooling=False), args=(Arr((1, 5, 7, 4)),)),
  ),
  Case(
    "jaxrl_m_impala_encoder",
    *JAXRL_M,
    module=_IMPALA,
    cls="ImpalaEncoder",
    kind="CNN (stacks built in setup from tuple widths, a compact multiplicative condition)",
    first=Setting(
      dict(width=1, stack_sizes=(4, 6), num_blocks=1),
      args=(Arr((2, 8, 8, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        width=2,
        use_multiplicative_cond=True,
        stack_sizes=(3, 5, 7),
        num_blocks=2,
        dropout_rate=0.0,
      ),
      args=(Arr((1, 12, 10, 4)),),
      kwargs=dict(train=False, cond_var=Arr((1, 6))),
    ),
  ),
  Case(
    "jaxrl_m_spatial_learned_embeddings",
    *JAXRL_M,
    module=_BRIDGE,
    cls="SpatialLearnedEmbeddings",
    kind="pooling (a learned [H, W, C, F] kernel summed over space; sizes as fields)",
    first=Setting(dict(height=4, width=5, channel=6, num_features=3), args=(Arr((2, 4, 5, 6)),)),
    second=Setting(
      dict(height=3, width=6, channel=7, num_features=5, kernel_init=_init("normal", 0.1)),
      args=(Arr((1, 3, 6, 7)),),
    ),
  ),
  Case(
    "jaxrl_m_spatial_softmax",
    *JAXRL_M,
    module=_BRIDGE,
    cls="SpatialSoftmax",
    kind="pooling (spatial softmax keypoints: position arrays as fields, learned temperature)",
    first=Setting(
      dict(
        height=3,
        width=4,
        channel=5,
        pos_x=_linspace(-1.0, 1.0, 12),
        pos_y=_linspace(1.0, -1.0, 12),
        temperature=-1,
      ),
      args=(Arr((2, 3, 4, 5)),),
    ),
    second=Setting(
      dict(
        height=4,
        width=2,
        channel=7,
        pos_x=_linspace(-0.5, 2.0, 8),
        pos_y=_linspace(0.0, 1.0, 8),
        temperature=-1,
        log_heatmap=True,
      ),
      args=(Arr((1, 4, 2, 7)),),
    ),
  ),
  Case(
    "jaxrl_m_preprocess_encoder",
    *JAXRL_M,
    module="jaxrl_m.vision.preprocess",
    cls="PreprocessEncoder",
    kind="wrapper (normalize and resize images, then an encoder instance given as a field)",
    first=Setting(
      dict(encoder=_impala(stack_sizes=(4,), num_blocks=1)),
      args=(Arr((2, 8, 8, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        encoder=_impala(width=2, stack_sizes=(3, 5), num_blocks=2),
        normalize=True,
        normalization_params="imagenet",
        resize=True,
        resize_shape=(12, 10),
        freeze_encoder=True,
        default_kwargs=dict(train=True),
        force_kwargs=dict(train=False),
      ),
      # One image without a batch axis: the class adds one and squeezes it back.
      args=(Arr((7, 9, 3)),),
    ),
  ),
  # ------------------------------------------------------------------ young-geng/m3ae_public
  Case(
    "m3ae_mlp",
    *M3AE,
    module=_M3AE,
    cls="MLP",
    kind="MLP (optional input norm, residual Dense-gelu-LayerNorm layers, output Dense)",
    first=Setting(dict(hidden_dim=8, output_dim=3, depth=1), args=(Arr((2, 4, 5)),)),
    second=Setting(
      dict(hidden_dim=12, output_dim=5, depth=3, input_norm=False), args=(Arr((3, 6)),)
    ),
  ),
  Case(
    "m3ae_transformer_mlp",
    *M3AE,
    module=_M3AE,
    cls="TransformerMLP",
    kind="MLP (two named Dense layers, an initializer as a field)",
    first=Setting(
      dict(dim=16, out_dim=8, dropout=0.0),
      args=(Arr((2, 5, 6)),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(dim=20, out_dim=10, dropout=0.0, kernel_init=_init("lecun_normal")),
      args=(Arr((1, 7, 9)),),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "m3ae_attention",
    *M3AE,
    module=_M3AE,
    cls="Attention",
    kind="attention (fused qkv Dense, padding mask, sown weights; deterministic merged)",
    first=Setting(
      dict(dim=8, num_heads=2),
      args=(Arr((2, 5, 8)),),
      kwargs=dict(deterministic=True, padding_mask=Ints((2, 5), high=2, dtype="float32")),
    ),
    second=Setting(
      dict(
        dim=12, num_heads=3, use_bias=True, kernel_init=_init("xavier_normal"), deterministic=True
      ),
      args=(Arr((1, 7, 12)),),
      kwargs=dict(padding_mask=Ints((1, 7), high=2, dtype="float32")),
    ),
  ),
  Case(
    "m3ae_block",
    *M3AE,
    module=_M3AE,
    cls="Block",
    kind="transformer block (pre-norm attention and MLP, drop path off)",
    first=Setting(
      dict(emb_dim=8, num_heads=2, mlp_ratio=2),
      args=(Arr((2, 5, 8)),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(emb_dim=12, num_heads=4, mlp_ratio=3),
      args=(Arr((1, 6, 12)),),
      kwargs=dict(deterministic=True, padding_mask=Ints((1, 6), high=2, dtype="float32")),
    ),
  ),
  Case(
    "m3ae_transformer",
    *M3AE,
    module=_M3AE,
    cls="Transformer",
    kind="transformer (a loop of blocks, final norm)",
    first=Setting(
      dict(emb_dim=8, depth=1, num_heads=2, mlp_ratio=2),
      args=(Arr((2, 5, 8)),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(emb_dim=12, depth=3, num_heads=3, mlp_ratio=4),
      args=(Arr((1, 6, 12)),),
      kwargs=dict(deterministic=True, padding_mask=Ints((1, 6), high=2, dtype="float32")),
    ),
  ),
  Case(
    "m3ae_multimodal_representation",
    *M3AE,
    module=_M3AE,
    cls="MaskedMultimodalAutoencoder",
    kind="whole model (M3AE encoder: image and text embeddings, type embeddings; config dict)",
    first=Setting(
      dict(config_updates=_M3AE_FIRST, text_vocab_size=11, image_output_dim=5),
      args=(Arr((2, 4, 7)), Ints((2, 3), high=11), Ints((2, 3), high=2, dtype="float32")),
      kwargs=dict(deterministic=True),
      method="forward_representation",
    ),
    second=Setting(
      dict(config_updates=_M3AE_SECOND, text_vocab_size=13, image_output_dim=7),
      args=(Arr((1, 9, 5)), Ints((1, 4), high=13), Ints((1, 4), high=2, dtype="float32")),
      kwargs=dict(deterministic=True),
      method="forward_representation",
    ),
  ),
  Case(
    "m3ae_vit_classifier",
    *M3AE,
    module=_M3AE,
    cls="ViTClassifier",
    kind="classifier (calls a method of an autoencoder instance given as a field, then a head)",
    first=Setting(
      dict(
        base_model=_mae(**_M3AE_FIRST, image_output_dim=5),
        num_classes=3,
      ),
      args=(Arr((2, 4, 6)),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(
        base_model=_mae(**_M3AE_SECOND, image_output_dim=7),
        num_classes=5,
        global_pool=True,
        stop_gradient=True,
      ),
      args=(Arr((1, 9, 8)),),
      kwargs=dict(deterministic=True),
    ),
  ),
  # ----------------------------------------------------------------- google-deepmind/gemma
  Case(
    "gemma_einsum",
    *GEMMA,
    module="gemma.layers",
    cls="Einsum",
    kind="projection (a weight of a given shape contracted by an equation passed at call)",
    first=Setting(dict(shape=(3, 4, 5)), args=("BTD,NDH->BTNH", Arr((2, 6, 4)))),
    second=Setting(dict(shape=(2, 7, 3)), args=("BTD,NDH->BTNH", Arr((1, 4, 7)))),
  ),
  Case(
    "gemma_rms_norm",
    *GEMMA,
    module="gemma.layers",
    cls="RMSNorm",
    kind="norm (RMS norm with a zero-initialized scale sized from the input)",
    first=Setting(dict(), args=(Arr((2, 5, 6)),)),
    second=Setting(dict(), args=(Arr((1, 3, 4, 10)),)),
  ),
  Case(
    "gemma_embedder_encode",
    *GEMMA,
    module=_GEMMA_MOD,
    cls="Embedder",
    kind="embedding (a table param in setup; scaled lookup by its `encode` method)",
    first=Setting(dict(vocab_size=11, embed_dim=6), args=(Ints((2, 5), high=11),), method="encode"),
    second=Setting(
      dict(vocab_size=17, embed_dim=10), args=(Ints((3, 4), high=17),), method="encode"
    ),
  ),
  Case(
    "gemma_attention",
    *GEMMA,
    module=_GEMMA_MOD,
    cls="Attention",
    kind="attention (RoPE; grouped-query or fused qkv einsums; soft cap; sliding window)",
    first=Setting(
      dict(
        num_heads=4,
        num_kv_heads=2,
        features=8,
        head_dim=6,
        attn_type=_attn_type("GLOBAL"),
        query_pre_attn_scalar=6**-0.5,
      ),
      args=(Arr((3, 5, 8)), Positions((3, 5)), None, _causal(3, 5)),
    ),
    second=Setting(
      dict(
        num_heads=6,
        num_kv_heads=6,
        features=10,
        head_dim=4,
        attn_type=_attn_type("LOCAL_SLIDING"),
        query_pre_attn_scalar=0.5,
        attn_logits_soft_cap=20.0,
        sliding_window_size=3,
      ),
      args=(Arr((1, 7, 10)), Positions((1, 7)), None, _causal(1, 7)),
    ),
  ),
  Case(
    "gemma_feed_forward",
    *GEMMA,
    module=_GEMMA_MOD,
    cls="FeedForward",
    kind="MLP (gated gelu from a stacked gating param, optionally stored transposed)",
    first=Setting(
      dict(features=6, hidden_dim=10, transpose_gating_einsum=False), args=(Arr((2, 4, 6)),)
    ),
    second=Setting(
      dict(features=8, hidden_dim=14, transpose_gating_einsum=True), args=(Arr((1, 5, 8)),)
    ),
  ),
  Case(
    "gemma_block",
    *GEMMA,
    module=_GEMMA_MOD,
    cls="Block",
    kind="transformer block (RMS norms, optional post norms, attention and gated MLP; setup)",
    first=Setting(
      dict(
        num_heads=2,
        num_kv_heads=2,
        embed_dim=8,
        head_dim=4,
        hidden_dim=12,
        use_post_attn_norm=False,
        use_post_ffw_norm=False,
        attn_type=_attn_type("GLOBAL"),
        query_pre_attn_scalar=0.5,
        transpose_gating_einsum=False,
      ),
      args=(Arr((3, 5, 8)), Positions((3, 5)), None, _causal(3, 5)),
    ),
    second=Setting(
      dict(
        num_heads=6,
        num_kv_heads=3,
        embed_dim=10,
        head_dim=14,
        hidden_dim=18,
        use_post_attn_norm=True,
        use_post_ffw_norm=True,
        attn_type=_attn_type("LOCAL_SLIDING"),
        query_pre_attn_scalar=0.25,
        transpose_gating_einsum=True,
        attn_logits_soft_cap=30.0,
        sliding_window_size=2,
      ),
      args=(Arr((1, 7, 10)), Positions((1, 7)), None, _causal(1, 7)),
    ),
  ),
  Case(
    "gemma_transformer",
    *GEMMA,
    module="gemma.transformer",
    cls="Transformer",
    kind="whole model (Gemma: embedder, blocks per attention type, tied decode; config)",
    first=Setting(
      dict(
        config=_gemma_config(
          num_layers=2,
          num_embed=13,
          embed_dim=8,
          hidden_dim=12,
          num_heads=2,
          head_dim=4,
          num_kv_heads=1,
          final_logit_softcap=None,
          use_post_attn_norm=False,
          use_post_ffw_norm=False,
          attention_types=(_attn_type("GLOBAL"), _attn_type("GLOBAL")),
          max_cache_length=16,
        )
      ),
      args=(Ints((3, 5), high=13), Positions((3, 5)), None, _causal(3, 5)),
    ),
    second=Setting(
      dict(
        config=_gemma_config(
          num_layers=3,
          num_embed=17,
          embed_dim=12,
          hidden_dim=20,
          num_heads=4,
          head_dim=6,
          num_kv_heads=2,
          final_logit_softcap=30.0,
          use_post_attn_norm=True,
          use_post_ffw_norm=True,
          attention_types=(
            _attn_type("LOCAL_SLIDING"),
            _attn_type("LOCAL_SLIDING"),
            _attn_type("GLOBAL"),
          ),
          max_cache_length=24,
          query_pre_attn_norm=Ref(
            "gemma.transformer:QueryPreAttentionNormalisation."
            "BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS"
          ),
          attn_logits_soft_cap=50.0,
          sliding_window_size=3,
          transpose_gating_einsum=True,
        )
      ),
      args=(Ints((1, 7), high=17), Positions((1, 7)), None, _causal(1, 7)),
    ),
  ),
]

_BY_NAME = by_name(HOLDOUT_G)


def names() -> list[str]:
  return [c.name for c in HOLDOUT_G]


def case(name: str) -> Case:
  return _BY_NAME[name]
