"""HOLDOUT_C: a third holdout of real Linen classes, from repositories no other set uses.

Chosen after HOLDOUT and HOLDOUT_B had been looked at, from repositories that none of
HOLDOUT, HOLDOUT_B, the TUNING set or the HF enumeration draws on:
google-research/magvit (a custom-padding `nn.Conv` subclass, 2+1D convolutions, 2D, 3D
and 2+1D CNN encoders and a decoder, residual and attention blocks, a StyleGAN
discriminator under `nn.vmap`, BERT pieces, a transformer block and LM held in a
`flax.struct` config), google-deepmind/nanodo (a decoder-only transformer held in a
dataclass config, params boxed with `nn.with_partitioning`) and
kvfrans/jax-diffusion-transformer (DiT: MLP, timestep and label embeddings, patch
embedding, adaLN-Zero block, final layer, the whole model). Each entry pins the commit
its source is read at; its `second` setting changes every width (all distinct from each
other and from the first's), every tuple item and every config field the class reads,
with inputs of other sizes where the class allows.

Do not draft these classes while the drafter is being worked on, and do not read their
drafts: `measure.py --cases holdout_c` runs them once, at the end (README.md).
"""

from __future__ import annotations

from cases import Arr, Case, Ints, Obj, Ones, Ref, Setting, by_name

MAGVIT = ("google-research/magvit", "05e8cfd6559c47955793d70602d62a2f9b0bdef5")
NANODO = ("google-deepmind/nanodo", "10aefdeed40a63293daf112b91a5538cd24fa3a4")
DIT = ("kvfrans/jax-diffusion-transformer", "94ea6076bd934ba687ac23a165e57ed8110619af")

_MODELS = "videogvt.models"


def _partial(target: str, **kw: object) -> Obj:
  """`functools.partial(target, **kw)`: magvit passes norm and conv layers as partials."""
  return Obj("functools:partial", kw, args=(Ref(target),))


def _vqvae(**kw: object) -> Obj:
  """magvit's encoders, decoders and quantizer read `config.vqvae.*` (a ConfigDict)."""
  return Obj("ml_collections:ConfigDict", args=({"vqvae": kw},))


def _discriminator(image_size: int, **kw: object) -> Obj:
  """magvit's StyleGAN discriminator reads `config.image_size` and `config.discriminator.*`."""
  return Obj("ml_collections:ConfigDict", args=({"image_size": image_size, "discriminator": kw},))


def _bert_init(stddev: float) -> Obj:
  """magvit's own truncated-normal initializer factory (a closure)."""
  return Obj(f"{_MODELS}.simplified_bert:truncated_normal", args=(stddev,))


def _lm_config(**kw: object) -> Obj:
  """magvit's `TransformerConfig`, a `flax.struct.dataclass`."""
  return Obj(f"{_MODELS}.transformer_lm:TransformerConfig", kw)


def _do_config(**kw: object) -> Obj:
  """nanodo's `DoConfig`, a plain dataclass (D, H, L, N, V, F and initializers)."""
  return Obj("nanodo.model:DoConfig", kw)


HOLDOUT_C: list[Case] = [
  # ---------------------------------------------------------------- google-research/magvit
  Case(
    "mg_conv2plus1d",
    *MAGVIT,
    module=f"{_MODELS}.model_utils",
    cls="Conv2Plus1D",
    kind="conv (2+1D separable convolution; remat __call__, optional norm partial)",
    first=Setting(dict(features=6, kernel_size=(3, 3, 3)), args=(Arr((2, 4, 6, 6, 5)),)),
    second=Setting(
      dict(
        features=10,
        kernel_size=(2, 5, 4),
        strides=(1, 2, 3),
        padding="VALID",
        use_bias=False,
        norm_fn=_partial("flax.linen:LayerNorm"),
        activation_fn=Ref("flax.linen:swish"),
        expand_mid_features=True,
      ),
      args=(Arr((1, 3, 9, 11, 7)),),
    ),
  ),
  Case(
    "mg_conv_custom_pad",
    *MAGVIT,
    module=f"{_MODELS}.model_utils",
    cls="Conv",
    kind="conv (an nn.Conv subclass with an extra field: jnp.pad modes before a VALID conv)",
    first=Setting(
      dict(features=6, kernel_size=(3, 3), padding="VALID", custom_padding="reflect"),
      args=(Arr((2, 7, 7, 4)),),
    ),
    second=Setting(
      dict(
        features=10,
        kernel_size=(2, 5),
        strides=(2, 1),
        padding="VALID",
        use_bias=False,
        custom_padding="symmetric_odd",
        kernel_init=Obj("flax.linen.initializers:he_normal"),
      ),
      args=(Arr((1, 9, 8, 3)),),
    ),
  ),
  Case(
    "mg_resblock2d",
    *MAGVIT,
    module=f"{_MODELS}.enc_dec_2dcnn",
    cls="ResBlock",
    kind="CNN block (residual; norm and conv layers given as partials)",
    first=Setting(
      dict(
        filters=8,
        norm_fn=_partial("flax.linen:GroupNorm", num_groups=2),
        conv_fn=_partial("flax.linen:Conv"),
      ),
      args=(Arr((2, 6, 6, 4)),),
    ),
    second=Setting(
      dict(
        filters=15,
        norm_fn=_partial("flax.linen:GroupNorm", num_groups=5),
        conv_fn=_partial(f"{_MODELS}.model_utils:Conv", padding="VALID", custom_padding="reflect"),
        activation_fn=Ref("flax.linen:swish"),
        use_conv_shortcut=True,
      ),
      args=(Arr((3, 7, 9, 10)),),
    ),
  ),
  Case(
    "mg_attnblock2d",
    *MAGVIT,
    module=f"{_MODELS}.enc_dec_2dcnn",
    cls="AttnBlock",
    kind="attention block (spatial self-attention over an image, DenseGeneral heads)",
    first=Setting(
      dict(num_heads=2, norm_fn=_partial("flax.linen:LayerNorm")),
      args=(Arr((2, 4, 4, 6)),),
    ),
    second=Setting(
      dict(num_heads=4, norm_fn=_partial("flax.linen:RMSNorm")),
      args=(Arr((3, 7, 9, 20)),),
    ),
  ),
  Case(
    "mg_encoder2d",
    *MAGVIT,
    module=f"{_MODELS}.enc_dec_2dcnn",
    cls="Encoder",
    kind="CNN encoder (VQGAN; ConfigDict settings, setup-derived attributes)",
    first=Setting(
      dict(
        config=_vqvae(
          filters=4,
          num_enc_res_blocks=1,
          channel_multipliers=(1, 2),
          embedding_dim=5,
          conv_downsample=False,
          norm_type="LN",
          activation_fn="relu",
        )
      ),
      args=(Arr((2, 8, 8, 3)),),
    ),
    second=Setting(
      dict(
        config=_vqvae(
          filters=32,
          num_enc_res_blocks=2,
          channel_multipliers=(1, 3),
          embedding_dim=7,
          conv_downsample=True,
          encoder_conv_padding="reflect",
          norm_type="GN",
          activation_fn="swish",
          use_attn=True,
          num_attn_heads=6,
        )
      ),
      args=(Arr((1, 10, 10, 9)),),
    ),
  ),
  Case(
    "mg_decoder2d",
    *MAGVIT,
    module=f"{_MODELS}.enc_dec_2dcnn",
    cls="Decoder",
    kind="CNN decoder (VQGAN; ConfigDict settings, upsampler chosen by name)",
    first=Setting(
      dict(
        config=_vqvae(
          filters=4,
          num_dec_res_blocks=1,
          channel_multipliers=(1, 2),
          upsample="nearest+conv",
          norm_type="LN",
          activation_fn="swish",
          use_attn=True,
          num_attn_heads=2,
        ),
        output_dim=3,
      ),
      args=(Arr((2, 4, 4, 5)),),
    ),
    second=Setting(
      dict(
        config=_vqvae(
          filters=3,
          num_dec_res_blocks=2,
          channel_multipliers=(2, 7, 5),
          upsample="depth_to_space",
          norm_type=None,
          activation_fn="relu",
          use_attn=False,
          num_attn_heads=9,
        ),
        output_dim=6,
      ),
      args=(Arr((1, 3, 5, 11)),),
    ),
  ),
  Case(
    "mg_resblock3d",
    *MAGVIT,
    module=f"{_MODELS}.enc_dec_3dcnn",
    cls="ResBlock",
    kind="CNN block (3D residual over video; norm and conv partials)",
    first=Setting(
      dict(
        filters=6,
        norm_fn=_partial("flax.linen:LayerNorm"),
        conv_fn=_partial("flax.linen:Conv"),
      ),
      args=(Arr((2, 3, 4, 4, 5)),),
    ),
    second=Setting(
      dict(
        filters=9,
        norm_fn=_partial("flax.linen:GroupNorm", num_groups=3),
        conv_fn=_partial(f"{_MODELS}.model_utils:Conv", padding="VALID", custom_padding="edge"),
        activation_fn=Ref("flax.linen:swish"),
        use_conv_shortcut=True,
      ),
      args=(Arr((1, 2, 7, 8, 12)),),
    ),
  ),
  Case(
    "mg_encoder3d",
    *MAGVIT,
    module=f"{_MODELS}.enc_dec_3dcnn",
    cls="Encoder",
    kind="CNN encoder (3D VQGAN; ConfigDict settings, temporal downsampling flags)",
    first=Setting(
      dict(
        config=_vqvae(
          filters=4,
          num_enc_res_blocks=1,
          channel_multipliers=(1, 2),
          temporal_downsample=(True,),
          embedding_dim=5,
          conv_downsample=False,
          norm_type="LN",
          activation_fn="swish",
        )
      ),
      args=(Arr((2, 4, 4, 4, 3)),),
    ),
    second=Setting(
      dict(
        config=_vqvae(
          filters=3,
          num_enc_res_blocks=2,
          channel_multipliers=(2, 3, 6),
          temporal_downsample=1,
          embedding_dim=7,
          conv_downsample=True,
          custom_conv_padding="edge",
          norm_type=None,
          activation_fn="relu",
        )
      ),
      args=(Arr((1, 4, 4, 4, 2)),),
    ),
  ),
  Case(
    "mg_encoder2plus1d",
    *MAGVIT,
    module=f"{_MODELS}.enc_dec_2plus1dcnn",
    cls="Encoder",
    kind="CNN encoder (2+1D VQGAN: separable-conv partials inside residual blocks; ConfigDict)",
    first=Setting(
      dict(
        config=_vqvae(
          filters=4,
          num_enc_res_blocks=1,
          channel_multipliers=(1, 2),
          temporal_downsample=(False, True),
          embedding_dim=5,
          conv_downsample=False,
          expand_mid_features=False,
          norm_type="LN",
          activation_fn="relu",
        )
      ),
      args=(Arr((2, 4, 8, 8, 3)),),
    ),
    second=Setting(
      dict(
        config=_vqvae(
          filters=3,
          num_enc_res_blocks=2,
          channel_multipliers=(2, 5, 3),
          temporal_downsample=(False, True, False),
          embedding_dim=7,
          conv_downsample=True,
          expand_mid_features=True,
          norm_type=None,
          activation_fn="swish",
        )
      ),
      args=(Arr((1, 6, 4, 4, 2)),),
    ),
  ),
  Case(
    "mg_stylegan_resblock",
    *MAGVIT,
    module=f"{_MODELS}.stylegan_discriminator_2d",
    cls="ResBlock",
    kind="CNN block (StyleGAN discriminator; average-pool or blur-pool downsampling)",
    first=Setting(
      dict(filters=6, activation_fn=Ref("jax.nn:relu"), blur_resample=False),
      args=(Arr((2, 8, 8, 4)),),
    ),
    second=Setting(
      dict(filters=11, activation_fn=Ref("flax.linen:swish"), blur_resample=True),
      args=(Arr((3, 6, 10, 5)),),
    ),
  ),
  Case(
    "mg_stylegan_disc",
    *MAGVIT,
    module=f"{_MODELS}.stylegan_discriminator_2d",
    cls="StyleGANDiscriminator",
    kind="whole model (StyleGAN discriminator under nn.vmap over time; ConfigDict)",
    first=Setting(
      dict(config=_discriminator(8, filters=4, channel_multipliers=(1, 2))),
      args=(Arr((2, 3, 8, 8, 3)),),
    ),
    second=Setting(
      dict(config=_discriminator(16, filters=5, channel_multipliers=(2, 3, 1), blur_resample=True)),
      args=(Arr((1, 2, 16, 16, 4)),),
    ),
  ),
  Case(
    "mg_bert_layer",
    *MAGVIT,
    module=f"{_MODELS}.simplified_bert",
    cls="BertLayer",
    kind="transformer block (post-LN BERT layer; initializer closure field)",
    first=Setting(
      dict(
        intermediate_size=12,
        hidden_size=8,
        hidden_dropout_prob=0.1,
        num_attention_heads=2,
        attention_probs_dropout_prob=0.1,
        initializer_fn=_bert_init(0.02),
      ),
      args=(Arr((2, 5, 8)), Ones((2, 5))),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(
        intermediate_size=21,
        hidden_size=15,
        hidden_dropout_prob=0.2,
        num_attention_heads=3,
        attention_probs_dropout_prob=0.3,
        initializer_fn=_bert_init(0.05),
      ),
      args=(Arr((4, 7, 15)), Ones((4, 7))),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "mg_bert_embed",
    *MAGVIT,
    module=f"{_MODELS}.simplified_bert",
    cls="BertEmbed",
    kind="embedding (word, position and segment tables, optional projection)",
    first=Setting(
      dict(
        embedding_size=6,
        hidden_dropout_prob=0.1,
        vocab_size=11,
        max_position_embeddings=9,
        num_segments=2,
        initializer_fn=_bert_init(0.02),
      ),
      args=(Ints((2, 5), 11), Ints((2, 5), 2)),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(
        embedding_size=8,
        hidden_dropout_prob=0.2,
        vocab_size=13,
        max_position_embeddings=12,
        num_segments=3,
        initializer_fn=_bert_init(0.05),
        hidden_size=10,
      ),
      args=(Ints((4, 7), 13), Ints((4, 7), 3)),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "mg_bert_mlm",
    *MAGVIT,
    module=f"{_MODELS}.simplified_bert",
    cls="BertMlmLayer",
    kind="head (masked-token logits against an embedding table given as input, bias)",
    first=Setting(
      dict(hidden_size=8, initializer_fn=_bert_init(0.02)),
      args=(Arr((2, 5, 6)), Arr((11, 8))),
    ),
    second=Setting(
      dict(hidden_size=12, initializer_fn=_bert_init(0.05)),
      args=(Arr((3, 7, 9)), Arr((13, 12))),
    ),
  ),
  Case(
    "mg_bert",
    *MAGVIT,
    module=f"{_MODELS}.simplified_bert",
    cls="Bert",
    kind="whole model (BERT MLM; tied output embedding read from self.variables)",
    first=Setting(
      dict(
        vocab_size=13,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=12,
        max_position_embeddings=10,
      ),
      args=(Ints((2, 6), 13),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(
        vocab_size=17,
        hidden_size=9,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=14,
        hidden_dropout_prob=0.2,
        attention_probs_dropout_prob=0.3,
        max_position_embeddings=11,
        num_segments=4,
        initializer_range=0.05,
        pad_token_id=0,
      ),
      args=(Ints((3, 7), 17), Ints((3, 7), 4)),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "mg_transformer_block",
    *MAGVIT,
    module=f"{_MODELS}.transformer_lm",
    cls="TransformerBlock",
    kind="transformer block (pre-LN; settings in a flax.struct dataclass config)",
    first=Setting(
      dict(
        config=_lm_config(vocab_size=10, output_vocab_size=10, num_heads=2, qkv_dim=8, mlp_dim=12)
      ),
      args=(Arr((2, 5, 6)),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(
        config=_lm_config(
          vocab_size=14,
          output_vocab_size=15,
          num_heads=3,
          qkv_dim=9,
          mlp_dim=16,
          dropout_rate=0.2,
          attention_dropout_rate=0.3,
          activation_fn=Ref("flax.linen:relu"),
          kernel_init=Obj("flax.linen.initializers:lecun_normal"),
          bias_init=Obj("flax.linen.initializers:normal", {"stddev": 0.1}),
        )
      ),
      args=(Arr((3, 7, 11)),),
      kwargs=dict(deterministic=True, attn_mask=Ones((3, 1, 7, 7), dtype="bool")),
    ),
  ),
  Case(
    "mg_transformer_lm",
    *MAGVIT,
    module=f"{_MODELS}.transformer_lm",
    cls="TransformerLM",
    kind="whole model (causal LM; struct config, padding and causal masks, tied logits)",
    first=Setting(
      dict(
        config=_lm_config(
          vocab_size=12,
          output_vocab_size=14,
          emb_dim=8,
          num_heads=2,
          num_layers=1,
          qkv_dim=6,
          mlp_dim=10,
          max_len=9,
        )
      ),
      args=(Ints((2, 6), 12),),
    ),
    second=Setting(
      dict(
        config=_lm_config(
          vocab_size=15,
          output_vocab_size=15,
          logits_via_embedding=True,
          emb_dim=18,
          num_heads=4,
          num_layers=2,
          qkv_dim=20,
          mlp_dim=22,
          max_len=11,
          input_dropout_rate=0.2,
          dropout_rate=0.3,
          attention_dropout_rate=0.4,
          activation_fn=Ref("flax.linen:relu"),
          kernel_init=Obj("flax.linen.initializers:lecun_normal"),
          bias_init=Obj("flax.linen.initializers:normal", {"stddev": 0.1}),
          posemb_init=None,
        )
      ),
      args=(Ints((3, 7), 15),),
    ),
  ),
  # ---------------------------------------------------------------- google-deepmind/nanodo
  Case(
    "nd_mlp",
    *NANODO,
    module="nanodo.model",
    cls="Mlp",
    kind="MLP (no bias; dataclass config, partitioned initializers)",
    first=Setting(dict(cfg=_do_config(D=8, H=2, L=6, N=1, V=11, F=12)), args=(Arr((2, 5, 8)),)),
    second=Setting(
      dict(
        cfg=_do_config(
          D=10,
          H=5,
          L=7,
          N=2,
          V=13,
          F=18,
          kernel_init=Obj("flax.linen.initializers:lecun_normal"),
          fsdp_enabled=False,
        )
      ),
      args=(Arr((3, 4, 10)),),
    ),
  ),
  Case(
    "nd_causal_attn",
    *NANODO,
    module="nanodo.model",
    cls="CausalAttn",
    kind="attention (causal, einsum scores, DenseGeneral heads; dataclass config)",
    first=Setting(dict(cfg=_do_config(D=8, H=2, L=6, N=1, V=11, F=12)), args=(Arr((2, 5, 8)),)),
    second=Setting(
      dict(
        cfg=_do_config(
          D=15,
          H=3,
          L=9,
          N=2,
          V=13,
          F=18,
          kernel_init=Obj("flax.linen.initializers:lecun_normal"),
          fsdp_enabled=False,
        )
      ),
      args=(Arr((4, 7, 15)),),
    ),
  ),
  Case(
    "nd_tblock",
    *NANODO,
    module="nanodo.model",
    cls="TBlock",
    kind="transformer block (pre-LN without bias; dataclass config)",
    first=Setting(dict(docfg=_do_config(D=6, H=2, L=8, N=1, V=11, F=10)), args=(Arr((2, 5, 6)),)),
    second=Setting(
      dict(
        docfg=_do_config(
          D=12,
          H=4,
          L=9,
          N=3,
          V=13,
          F=14,
          kernel_init=Obj("flax.linen.initializers:lecun_normal"),
          fsdp_enabled=False,
        )
      ),
      args=(Arr((3, 7, 12)),),
    ),
  ),
  Case(
    "nd_transformer",
    *NANODO,
    module="nanodo.model",
    cls="TransformerDo",
    kind="whole model (decoder-only LM; setup list of blocks, tied logits, optional remat)",
    first=Setting(dict(docfg=_do_config(D=8, H=2, L=7, N=1, V=11, F=12)), args=(Ints((2, 6), 11),)),
    second=Setting(
      dict(
        docfg=_do_config(
          D=10,
          H=5,
          L=9,
          N=2,
          V=13,
          F=14,
          kernel_init=Obj("flax.linen.initializers:lecun_normal"),
          embed_init=Obj("flax.linen.initializers:normal", {"stddev": 0.3}),
          fsdp_enabled=False,
          remat=True,
        )
      ),
      args=(Ints((3, 8), 13),),
    ),
  ),
  # ---------------------------------------------------------- kvfrans/jax-diffusion-transformer
  Case(
    "dit_timestep",
    *DIT,
    module="diffusion_transformer",
    cls="TimestepEmbedder",
    kind="embedding (sinusoidal timestep features + MLP, a helper method)",
    first=Setting(dict(hidden_size=8, frequency_embedding_size=6), args=(Arr((2,)),)),
    second=Setting(dict(hidden_size=10, frequency_embedding_size=12), args=(Arr((5,)),)),
  ),
  Case(
    "dit_label",
    *DIT,
    module="diffusion_transformer",
    cls="LabelEmbedder",
    kind="embedding (class labels + a null class; label drop by forced ids)",
    first=Setting(
      dict(dropout_prob=0.1, num_classes=5, hidden_size=6),
      args=(Ints((3,), 5),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(dropout_prob=0.2, num_classes=7, hidden_size=9),
      args=(Ints((4,), 7),),
      kwargs=dict(train=False, force_drop_ids=Ints((4,), 2)),
    ),
  ),
  Case(
    "dit_mlp",
    *DIT,
    module="diffusion_transformer",
    cls="MlpBlock",
    kind="MLP (output width defaults to the input's; initializer fields)",
    first=Setting(dict(mlp_dim=12), args=(Arr((2, 5, 6)),)),
    second=Setting(
      dict(
        mlp_dim=14,
        out_dim=9,
        dropout_rate=0.3,
        kernel_init=Obj("flax.linen.initializers:lecun_normal"),
        bias_init=Obj("flax.linen.initializers:normal", {"stddev": 0.1}),
      ),
      args=(Arr((3, 4, 7)),),
    ),
  ),
  Case(
    "dit_patch_embed",
    *DIT,
    module="diffusion_transformer",
    cls="PatchEmbed",
    kind="embedding (strided conv patches, einops rearrange)",
    first=Setting(dict(patch_size=2, embed_dim=6), args=(Arr((2, 8, 8, 3)),)),
    second=Setting(dict(patch_size=3, embed_dim=10, bias=False), args=(Arr((1, 9, 9, 4)),)),
  ),
  Case(
    "dit_block",
    *DIT,
    module="diffusion_transformer",
    cls="DiTBlock",
    kind="transformer block (adaLN-Zero modulation from a condition, MHA, MLP ratio)",
    first=Setting(
      dict(hidden_size=8, num_heads=2, mlp_ratio=4.0), args=(Arr((2, 5, 8)), Arr((2, 8)))
    ),
    second=Setting(
      dict(hidden_size=12, num_heads=3, mlp_ratio=2.5), args=(Arr((3, 7, 12)), Arr((3, 12)))
    ),
  ),
  Case(
    "dit_final",
    *DIT,
    module="diffusion_transformer",
    cls="FinalLayer",
    kind="head (modulated LayerNorm + patch projection)",
    first=Setting(
      dict(patch_size=2, out_channels=3, hidden_size=8), args=(Arr((2, 4, 8)), Arr((2, 8)))
    ),
    second=Setting(
      dict(patch_size=3, out_channels=5, hidden_size=10), args=(Arr((3, 6, 10)), Arr((3, 10)))
    ),
  ),
  Case(
    "dit_model",
    *DIT,
    module="diffusion_transformer",
    cls="DiT",
    kind="whole model (DiT; sin-cos position param, timestep + label conditioning, unpatchify)",
    first=Setting(
      dict(
        patch_size=2,
        hidden_size=8,
        depth=1,
        num_heads=2,
        mlp_ratio=2.0,
        class_dropout_prob=0.1,
        num_classes=5,
      ),
      args=(Arr((2, 8, 8, 3)), Arr((2,)), Ints((2,), 5)),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        patch_size=3,
        hidden_size=12,
        depth=2,
        num_heads=3,
        mlp_ratio=1.5,
        class_dropout_prob=0.2,
        num_classes=7,
        learn_sigma=True,
      ),
      args=(Arr((4, 9, 9, 6)), Arr((4,)), Ints((4,), 7)),
      kwargs=dict(train=False),
    ),
  ),
]

_BY_NAME = by_name(HOLDOUT_C)


def names() -> list[str]:
  return [c.name for c in HOLDOUT_C]


def case(name: str) -> Case:
  return _BY_NAME[name]
