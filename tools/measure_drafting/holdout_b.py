"""HOLDOUT_B: a second holdout of real Linen classes, from repositories neither set uses.

Chosen after the first HOLDOUT had been looked at, from repositories that neither it nor
the TUNING set draws on: google-research/vision_transformer, google-research/maskgit,
google-research/t5x, google/maxtext and srush/annotated-s4 (CNN blocks, attention and
transformer blocks, MLPs, norms, embeddings and heads, small whole models, state-space
recurrent layers, settings held in `ml_collections.ConfigDict`, `SimpleNamespace` configs,
dicts and tuples). Each entry pins the commit its source is read at; its `second` setting
changes every width (all distinct from each other and from the first's), every tuple item
and every config field the class reads, with inputs of other sizes where the class allows.

Do not draft these classes while the drafter is being worked on, and do not read their
drafts: `measure.py --cases holdout_b` runs them once, at the end (README.md).
"""

from __future__ import annotations

from cases import Arr, Case, Ints, Obj, Ones, Ref, Setting, by_name

VIT = ("google-research/vision_transformer", "c6de1e5378c9831a8477feb30994971bdc409e46")
MASKGIT = ("google-research/maskgit", "1db23594e1bd328ee78eadcd148a19281cd0f5b8")
T5X = ("google-research/t5x", "cc342d419ec3e3e9c4bf1df33c82330cafdc1e16")
MAXTEXT = ("google/maxtext", "e64f6813e0e22b57395f070741d24948029a59ba")
S4 = ("srush/annotated-s4", "f19e2464990f0c07943bb922894d6f2af65c9bd9")

# t5x's package `__init__` imports its whole trainer (seqio, tensorstore); its example layers
# import nothing of t5x, so they are imported as the top-level package `t5` from here.
T5X_EXAMPLES = "t5x/examples"
# MaxText's layers import each other as the top-level package `layers` (its own convention).
MAXTEXT_SRC = "MaxText"


def _config_dict(**kw: object) -> Obj:
  """An `ml_collections.ConfigDict` (nested dicts become nested ConfigDicts)."""
  return Obj("ml_collections:ConfigDict", args=(kw,))


def _vqvae(**kw: object) -> Obj:
  """maskgit's VQGAN modules read `config.vqvae.*` (its configs/vqgan_config.py)."""
  return _config_dict(vqvae=kw)


def _trunc_normal(stddev: float) -> Obj:
  """maskgit's own initializer factory (a closure), as its Transformer builds it."""
  return Obj("maskgit.nets.maskgit_transformer:truncated_normal", args=(stddev,))


def _maxtext_config(**kw: object) -> Obj:
  """MaxText's layers read a pyconfig object; only the attributes a class reads are set."""
  return Obj("types:SimpleNamespace", kw)


HOLDOUT_B: list[Case] = [
  # ------------------------------------------------------- google-research/vision_transformer
  Case(
    "vt_encoder_block",
    *VIT,
    module="vit_jax.models_vit",
    cls="Encoder1DBlock",
    kind="transformer block (pre-LN attention + MLP)",
    first=Setting(
      dict(mlp_dim=12, num_heads=3, dropout_rate=0.1, attention_dropout_rate=0.1),
      args=(Arr((2, 5, 12)),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(mlp_dim=20, num_heads=2, dropout_rate=0.2, attention_dropout_rate=0.3),
      args=(Arr((3, 7, 14)),),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "vt_encoder",
    *VIT,
    module="vit_jax.models_vit",
    cls="Encoder",
    kind="transformer encoder (block loop, learned position embedding)",
    first=Setting(
      dict(num_layers=2, mlp_dim=8, num_heads=2, dropout_rate=0.1, attention_dropout_rate=0.1),
      args=(Arr((2, 6, 8)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        num_layers=3,
        mlp_dim=18,
        num_heads=4,
        dropout_rate=0.2,
        attention_dropout_rate=0.3,
        add_position_embedding=False,
      ),
      args=(Arr((3, 5, 12)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "vt_add_posemb",
    *VIT,
    module="vit_jax.models_vit",
    cls="AddPositionEmbs",
    kind="embedding (learned positions, initializer field)",
    first=Setting(
      dict(posemb_init=Obj("flax.linen.initializers:normal", {"stddev": 0.02})),
      args=(Arr((2, 6, 6)),),
    ),
    second=Setting(
      dict(posemb_init=Obj("flax.linen.initializers:uniform", {"scale": 0.5})),
      args=(Arr((3, 9, 5)),),
    ),
  ),
  Case(
    "vt_vit",
    *VIT,
    module="vit_jax.models_vit",
    cls="VisionTransformer",
    kind="whole model (ViT; ConfigDict patches and transformer settings)",
    first=Setting(
      dict(
        num_classes=5,
        patches=_config_dict(size=(4, 4)),
        transformer=_config_dict(
          num_layers=1, mlp_dim=8, num_heads=2, dropout_rate=0.1, attention_dropout_rate=0.1
        ),
        hidden_size=8,
        classifier="token",
      ),
      args=(Arr((2, 8, 8, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        num_classes=7,
        patches=_config_dict(size=(3, 3)),
        transformer=_config_dict(
          num_layers=2, mlp_dim=20, num_heads=3, dropout_rate=0.2, attention_dropout_rate=0.3
        ),
        hidden_size=12,
        representation_size=10,
        head_bias_init=0.5,
        classifier="gap",
      ),
      args=(Arr((3, 9, 9, 4)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "vt_hybrid",
    *VIT,
    module="vit_jax.models_vit",
    cls="VisionTransformer",
    kind="whole model (ResNet stem + ViT; ConfigDict resnet settings, StdConv, GroupNorm)",
    first=Setting(
      dict(
        num_classes=4,
        patches=_config_dict(size=(1, 1)),
        transformer=_config_dict(
          num_layers=1, mlp_dim=16, num_heads=2, dropout_rate=0.1, attention_dropout_rate=0.1
        ),
        hidden_size=16,
        resnet=_config_dict(num_layers=(1,), width_factor=0.5),
        classifier="token",
      ),
      args=(Arr((2, 16, 16, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        num_classes=6,
        patches=_config_dict(size=(2, 2)),
        transformer=_config_dict(
          num_layers=2, mlp_dim=22, num_heads=3, dropout_rate=0.2, attention_dropout_rate=0.3
        ),
        hidden_size=9,
        resnet=_config_dict(num_layers=(3, 4), width_factor=1.0),
        classifier="gap",
        head_bias_init=-0.5,
      ),
      args=(Arr((1, 24, 24, 5)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "vt_mixer",
    *VIT,
    module="vit_jax.models_mixer",
    cls="MlpMixer",
    kind="whole model (MLP-Mixer; ConfigDict patches, einops)",
    first=Setting(
      dict(
        patches=_config_dict(size=(4, 4)),
        num_classes=6,
        num_blocks=2,
        hidden_dim=6,
        tokens_mlp_dim=6,
        channels_mlp_dim=10,
      ),
      args=(Arr((2, 8, 8, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        patches=_config_dict(size=(3, 3)),
        num_classes=5,
        num_blocks=1,
        hidden_dim=9,
        tokens_mlp_dim=7,
        channels_mlp_dim=13,
      ),
      args=(Arr((3, 9, 9, 4)),),
      kwargs=dict(train=False),
    ),
  ),
  # ---------------------------------------------------------------- google-research/maskgit
  Case(
    "mg_vq_encoder",
    *MASKGIT,
    module="maskgit.nets.vqgan_tokenizer",
    cls="Encoder",
    kind="CNN encoder (nested ConfigDict read in setup, norm chosen by name)",
    first=Setting(
      dict(
        config=_vqvae(
          filters=4,
          num_res_blocks=1,
          channel_multipliers=[1, 2],
          embedding_dim=4,
          conv_downsample=False,
          norm_type="LN",
          activation_fn="relu",
        ),
        train=False,
      ),
      args=(Arr((2, 8, 8, 4)),),
    ),
    second=Setting(
      dict(
        config=_vqvae(
          filters=3,
          num_res_blocks=2,
          channel_multipliers=[5, 6, 7],
          embedding_dim=9,
          conv_downsample=True,
          norm_type="BN",
          activation_fn="swish",
        ),
        train=False,
      ),
      args=(Arr((3, 12, 12, 10)),),
    ),
  ),
  Case(
    "mg_vq_decoder",
    *MASKGIT,
    module="maskgit.nets.vqgan_tokenizer",
    cls="Decoder",
    kind="CNN decoder (nested ConfigDict, nearest upsampling)",
    first=Setting(
      dict(
        config=_vqvae(
          filters=4,
          num_res_blocks=1,
          channel_multipliers=[1, 2],
          norm_type="LN",
          activation_fn="relu",
        ),
        train=False,
        output_dim=3,
      ),
      args=(Arr((2, 4, 4, 4)),),
    ),
    second=Setting(
      dict(
        config=_vqvae(
          filters=3,
          num_res_blocks=2,
          channel_multipliers=[5, 6, 7],
          norm_type="BN",
          activation_fn="swish",
        ),
        train=False,
        output_dim=4,
      ),
      args=(Arr((1, 3, 3, 10)),),
    ),
  ),
  Case(
    "mg_vq",
    *MASKGIT,
    module="maskgit.nets.vqgan_tokenizer",
    cls="VectorQuantizer",
    kind="vector quantizer (codebook, argmin, losses in a dict output)",
    first=Setting(
      dict(
        config=_vqvae(
          codebook_size=8,
          commitment_cost=0.25,
          entropy_loss_ratio=0.1,
          entropy_loss_type="softmax",
          entropy_temperature=0.01,
        ),
        train=True,
      ),
      args=(Arr((2, 4, 4, 8)),),
    ),
    second=Setting(
      dict(
        config=_vqvae(
          codebook_size=13,
          commitment_cost=0.5,
          entropy_loss_ratio=0.3,
          entropy_loss_type="argmax",
          entropy_temperature=0.2,
        ),
        train=True,
      ),
      args=(Arr((3, 5, 5, 6)),),
    ),
  ),
  Case(
    "mg_resblock",
    *MASKGIT,
    module="maskgit.nets.vqgan_tokenizer",
    cls="ResBlock",
    kind="CNN block (layer classes and partials as fields, projection by shape)",
    first=Setting(
      dict(
        filters=6,
        norm_fn=Obj("functools:partial", {"num_groups": 2}, (Ref("flax.linen:GroupNorm"),)),
        conv_fn=Ref("flax.linen:Conv"),
        activation_fn=Ref("flax.linen:relu"),
      ),
      args=(Arr((2, 6, 6, 4)),),
    ),
    second=Setting(
      dict(
        filters=9,
        norm_fn=Ref("flax.linen:LayerNorm"),
        conv_fn=Obj("functools:partial", {"kernel_dilation": (2, 2)}, (Ref("flax.linen:Conv"),)),
        activation_fn=Ref("flax.linen:swish"),
        use_conv_shortcut=True,
      ),
      args=(Arr((3, 5, 5, 7)),),
    ),
  ),
  Case(
    "mg_vqvae_encode",
    *MASKGIT,
    module="maskgit.nets.vqgan_tokenizer",
    cls="VQVAE",
    kind="whole model's method (VQGAN `encode`: setup submodules, dict input, quantizer by name)",
    first=Setting(
      dict(
        config=_vqvae(
          quantizer="vq",
          codebook_size=8,
          filters=4,
          num_res_blocks=1,
          channel_multipliers=[1, 2],
          embedding_dim=4,
          conv_downsample=False,
          norm_type="LN",
          activation_fn="relu",
        ),
        train=False,
      ),
      args=({"image": Arr((2, 8, 8, 3))},),
      method="encode",
    ),
    second=Setting(
      dict(
        config=_vqvae(
          quantizer="gumbel",
          codebook_size=11,
          filters=3,
          num_res_blocks=2,
          channel_multipliers=[5, 6, 7],
          embedding_dim=9,
          conv_downsample=True,
          norm_type="BN",
          activation_fn="swish",
        ),
        train=False,
      ),
      args=({"image": Arr((1, 12, 12, 8))},),
      method="encode",
    ),
  ),
  Case(
    "mg_transformer_layer",
    *MASKGIT,
    module="maskgit.nets.maskgit_transformer",
    cls="TransformerLayer",
    kind="transformer block (post-LN BERT layer, padding mask)",
    first=Setting(
      dict(
        intermediate_size=16,
        hidden_size=8,
        hidden_dropout_prob=0.1,
        num_attention_heads=2,
        attention_probs_dropout_prob=0.1,
        initializer_fn=_trunc_normal(0.02),
      ),
      args=(Arr((2, 5, 8)), Ones((2, 5)), True),
    ),
    second=Setting(
      dict(
        intermediate_size=20,
        hidden_size=12,
        hidden_dropout_prob=0.2,
        num_attention_heads=3,
        attention_probs_dropout_prob=0.3,
        initializer_fn=_trunc_normal(0.05),
      ),
      args=(Arr((3, 7, 12)), Ones((3, 7)), True),
    ),
  ),
  Case(
    "mg_transformer",
    *MASKGIT,
    module="maskgit.nets.maskgit_transformer",
    cls="Transformer",
    kind="whole model (bidirectional token transformer, tied output embedding)",
    first=Setting(
      dict(
        vocab_size=12,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=12,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=12,
        initializer_range=0.02,
      ),
      args=(Ints((2, 6), 12),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(
        vocab_size=17,
        hidden_size=10,
        num_hidden_layers=2,
        num_attention_heads=5,
        intermediate_size=14,
        hidden_dropout_prob=0.2,
        attention_probs_dropout_prob=0.3,
        max_position_embeddings=9,
        initializer_range=0.05,
      ),
      args=(Ints((3, 7), 17),),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "mg_embed",
    *MASKGIT,
    module="maskgit.nets.maskgit_transformer",
    cls="Embed",
    kind="embedding (token + position, LayerNorm, projection)",
    first=Setting(
      dict(
        embedding_size=8,
        hidden_dropout_prob=0.1,
        vocab_size=10,
        max_position_embeddings=8,
        initializer_fn=_trunc_normal(0.02),
        hidden_size=8,
      ),
      args=(Ints((2, 5), 10), True),
    ),
    second=Setting(
      dict(
        embedding_size=6,
        hidden_dropout_prob=0.2,
        vocab_size=13,
        max_position_embeddings=9,
        initializer_fn=_trunc_normal(0.05),
        hidden_size=11,
      ),
      args=(Ints((3, 7), 13), True),
    ),
  ),
  Case(
    "mg_mlm_layer",
    *MASKGIT,
    module="maskgit.nets.maskgit_transformer",
    cls="MlmLayer",
    kind="head (masked-token logits against a given embedding matrix, Bias submodule)",
    first=Setting(
      dict(hidden_size=8, initializer_fn=_trunc_normal(0.02)),
      args=(Arr((2, 5, 8)), Arr((10, 8))),
    ),
    second=Setting(
      dict(hidden_size=7, initializer_fn=_trunc_normal(0.05)),
      args=(Arr((3, 4, 9)), Arr((12, 7))),
    ),
  ),
  # ---------------------------------------------------------------- google-research/t5x
  Case(
    "t5_attention",
    *T5X,
    module="t5.layers",
    cls="MultiHeadDotProductAttention",
    kind="attention (T5: DenseGeneral projections, head_dim field, cross-attention)",
    path=T5X_EXAMPLES,
    first=Setting(
      dict(num_heads=2, head_dim=4, dropout_rate=0.1),
      args=(Arr((2, 5, 8)), Arr((2, 6, 8))),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(num_heads=3, head_dim=5, dropout_rate=0.2, float32_logits=True),
      args=(Arr((3, 4, 7)), Arr((3, 9, 7))),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "t5_mlp",
    *T5X,
    module="t5.layers",
    cls="MlpBlock",
    kind="gated MLP (tuple of activation names)",
    path=T5X_EXAMPLES,
    first=Setting(
      dict(intermediate_dim=12, activations=("gelu", "linear"), intermediate_dropout_rate=0.1),
      args=(Arr((2, 5, 12)),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(
        intermediate_dim=20,
        activations=("relu", "silu", "tanh"),
        intermediate_dropout_rate=0.2,
      ),
      args=(Arr((3, 7, 9)),),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "t5_dense_general",
    *T5X,
    module="t5.layers",
    cls="DenseGeneral",
    kind="linear (tuple features and axes)",
    path=T5X_EXAMPLES,
    first=Setting(
      dict(features=(2, 3), axis=-1, kernel_axes=("embed", "heads", "kv")),
      args=(Arr((2, 5, 6)),),
    ),
    second=Setting(
      dict(features=(4, 5, 7), axis=(-2, -1), kernel_axes=("a", "b", "c", "d", "e")),
      args=(Arr((3, 8, 9)),),
    ),
  ),
  Case(
    "t5_embed",
    *T5X,
    module="t5.layers",
    cls="Embed",
    kind="embedding (param made in setup, gather or one-hot)",
    path=T5X_EXAMPLES,
    first=Setting(dict(num_embeddings=10, features=10), args=(Ints((2, 5), 10),)),
    second=Setting(dict(num_embeddings=13, features=6, one_hot=True), args=(Ints((3, 7), 13),)),
  ),
  Case(
    "t5_embed_attend",
    *T5X,
    module="t5.layers",
    cls="Embed",
    kind="head (an embedding's `attend` method: logits against the table)",
    path=T5X_EXAMPLES,
    first=Setting(dict(num_embeddings=8, features=6), args=(Arr((2, 5, 6)),), method="attend"),
    second=Setting(dict(num_embeddings=11, features=9), args=(Arr((3, 4, 9)),), method="attend"),
  ),
  # ---------------------------------------------------------------- google/maxtext
  Case(
    "mt_rmsnorm",
    *MAXTEXT,
    module="layers.normalizations",
    cls="RMSNorm",
    kind="norm variant (logically partitioned scale)",
    path=MAXTEXT_SRC,
    first=Setting(dict(epsilon=1e-6, kernel_axes=("norm",)), args=(Arr((2, 5, 8)),)),
    second=Setting(
      dict(epsilon=1e-5, kernel_axes=("embed",), scale_init=Ref("flax.linen.initializers:zeros")),
      args=(Arr((3, 7, 11)),),
    ),
  ),
  Case(
    "mt_embed",
    *MAXTEXT,
    module="layers.embeddings",
    cls="Embed",
    kind="embedding (config object read in setup and call, iota one-hot path)",
    path=MAXTEXT_SRC,
    first=Setting(
      dict(
        config=_maxtext_config(weight_dtype=Ref("jax.numpy:float32"), use_iota_embed=False),
        num_embeddings=10,
        features=8,
      ),
      args=(Ints((2, 5), 10),),
    ),
    second=Setting(
      dict(
        config=_maxtext_config(weight_dtype=Ref("jax.numpy:float32"), use_iota_embed=True),
        num_embeddings=13,
        features=6,
      ),
      args=(Ints((3, 7), 13),),
    ),
  ),
  # ---------------------------------------------------------------- srush/annotated-s4
  Case(
    "s4_ssm",
    *S4,
    module="s4.s4",
    cls="SSMLayer",
    kind="recurrent (state-space layer as a convolution kernel; nn.vmap over channels)",
    first=Setting(dict(N=4, l_max=6), args=(Arr((6, 4)),)),
    second=Setting(dict(N=5, l_max=9), args=(Arr((9, 3)),)),
  ),
  Case(
    "s4_s4layer",
    *S4,
    module="s4.s4",
    cls="S4Layer",
    kind="recurrent (S4: HiPPO DPLR kernel, complex arithmetic; nn.vmap over channels)",
    first=Setting(dict(N=4, l_max=6), args=(Arr((6, 4)),)),
    second=Setting(dict(N=6, l_max=8), args=(Arr((8, 3)),)),
  ),
  Case(
    "s4_s4d",
    *S4,
    module="s4.s4d",
    cls="S4DLayer",
    kind="recurrent (S4D: diagonal kernel, init chosen by name; nn.vmap over channels)",
    first=Setting(dict(N=4, l_max=6, scaling="hippo"), args=(Arr((6, 4)),)),
    second=Setting(dict(N=7, l_max=9, scaling="linear"), args=(Arr((9, 5)),)),
  ),
  Case(
    "s4_dss",
    *S4,
    module="s4.dss",
    cls="DSSLayer",
    kind="recurrent (DSS: diagonal state-space kernel; nn.vmap over channels)",
    first=Setting(dict(N=4, l_max=6), args=(Arr((6, 4)),)),
    second=Setting(dict(N=5, l_max=10), args=(Arr((10, 7)),)),
  ),
  Case(
    "s4_block",
    *S4,
    module="s4.s4",
    cls="SequenceBlock",
    kind="recurrent block (a layer class and its settings dict as fields, GLU)",
    first=Setting(
      dict(
        layer_cls=Ref("s4.s4:S4Layer"),
        layer={"N": 4, "l_max": 6},
        dropout=0.1,
        d_model=4,
        training=False,
      ),
      args=(Arr((6, 4)),),
    ),
    second=Setting(
      dict(
        layer_cls=Ref("s4.s4:S4Layer"),
        layer={"N": 6, "l_max": 8},
        dropout=0.2,
        d_model=5,
        prenorm=False,
        glu=False,
        training=False,
      ),
      args=(Arr((8, 5)),),
    ),
  ),
  Case(
    "s4_stacked",
    *S4,
    module="s4.s4",
    cls="StackedModel",
    kind="whole model (stack of S4 blocks, encoder and decoder Dense, setup list)",
    first=Setting(
      dict(
        layer_cls=Ref("s4.s4:S4Layer"),
        layer={"N": 4, "l_max": 6},
        d_output=5,
        d_model=4,
        n_layers=2,
        dropout=0.1,
        training=False,
      ),
      args=(Arr((6, 1)),),
    ),
    second=Setting(
      dict(
        layer_cls=Ref("s4.s4:S4Layer"),
        layer={"N": 6, "l_max": 8},
        d_output=7,
        d_model=9,
        n_layers=3,
        dropout=0.2,
        prenorm=False,
        classification=True,
        training=False,
      ),
      args=(Arr((8, 2)),),
    ),
  ),
]

_BY_NAME = by_name(HOLDOUT_B)


def names() -> list[str]:
  return [c.name for c in HOLDOUT_B]


def case(name: str) -> Case:
  return _BY_NAME[name]
