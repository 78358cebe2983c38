"""The HOLDOUT: real Linen classes the drafter was not built on, measured once, at the end.

Chosen from repositories the drafter's authors do not draft from (CNN blocks, transformer
blocks and MLPs, MoE routers, recurrent layers, norm variants, small whole models). Each
entry pins the commit its source is read at; its `second` setting changes every width (all
distinct from each other), every tuple and every config field the class reads.

Do not draft these classes while the drafter is being worked on, and do not read their
drafts: `measure.py` runs them once, at the end (README.md).
"""

from __future__ import annotations

from cases import Arr, Case, Obj, Ones, Positions, Ref, Setting, by_name

JAX_RESNET = ("n2cholas/jax-resnet", "5b00735aa0a68ec239af4a728ad4a596c1b551f6")
FLAXMODELS = ("matthias-wright/flaxmodels", "09bc77215032375d124e3f1eba828dd89c80a850")
RECURRENTGEMMA = ("google-deepmind/recurrentgemma", "2efa84dac0e68e63547a27a18fa943c98f1c312e")
EASYLM = ("young-geng/EasyLM", "fe5b2c354e25d697fce7cd225e23bbbe72570da3")
VMOE = ("google-research/vmoe", "942a78bc81d2e63199f0933733582ddae0715416")
SCENIC = ("google-research/scenic", "4a38d475ee89cb821078c0e2bf2065ee030e1535")
FLAXFORMER = ("google/flaxformer", "399ea3a85e9807ada653fd0de1a9de627eb0acde")


def _gpt2_config(**kw: object) -> Obj:
  """flaxmodels' GPT-2 reads its settings from a `SimpleNamespace` (its `ops.load_config`)."""
  base = dict(
    attn_pdrop=0.0,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    scale_attn_weights=True,
    n_inner=None,
  )
  return Obj("types:SimpleNamespace", {**base, **kw})


def _llama_config(**kw: object) -> Obj:
  """EasyLM's LLaMA modules read a transformers `PretrainedConfig` (its `finalize_config`)."""
  base = dict(
    initializer_range=0.02,
    residue_dropout=0.0,
    attention_dropout=0.0,
    embedding_dropout=0.0,
    feedforward_dropout=0.0,
    scan_attention=False,
    scan_mlp=False,
    scan_query_chunk_size=1024,
    scan_key_chunk_size=1024,
    scan_mlp_chunk_size=1024,
    fcm_min_ratio=0.0,
    fcm_max_ratio=0.0,
    remat_policy="nothing_saveable",
  )
  return Obj("transformers:PretrainedConfig", {**base, **kw})


HOLDOUT: list[Case] = [
  # ---------------------------------------------------------------- n2cholas/jax-resnet
  Case(
    "jr_bottleneck",
    *JAX_RESNET,
    module="jax_resnet.resnet",
    cls="ResNetBottleneckBlock",
    kind="CNN block (grouped conv, BatchNorm, projection skip)",
    first=Setting(
      dict(n_hidden=4, strides=(1, 1), expansion=4, groups=2, base_width=64),
      args=(Arr((2, 6, 6, 5)),),
    ),
    second=Setting(
      dict(n_hidden=6, strides=(2, 2), expansion=3, groups=3, base_width=128),
      args=(Arr((1, 10, 10, 7)),),
    ),
  ),
  Case(
    "jr_dblock",
    *JAX_RESNET,
    module="jax_resnet.resnet",
    cls="ResNetDBlock",
    kind="CNN block (field-only subclass, avg-pool skip)",
    first=Setting(dict(n_hidden=5, strides=(2, 2)), args=(Arr((2, 8, 8, 3)),)),
    second=Setting(dict(n_hidden=7, strides=(1, 1)), args=(Arr((3, 6, 6, 4)),)),
  ),
  Case(
    "jr_resnest",
    *JAX_RESNET,
    module="jax_resnet.resnet",
    cls="ResNeStBottleneckBlock",
    kind="CNN block (split attention)",
    first=Setting(
      dict(n_hidden=4, strides=(2, 2), expansion=2, avg_pool_first=False),
      args=(Arr((2, 8, 8, 6)),),
    ),
    second=Setting(
      dict(n_hidden=6, strides=(1, 1), expansion=3, base_width=128, avg_pool_first=True),
      args=(Arr((3, 5, 5, 7)),),
    ),
  ),
  Case(
    "jr_dstem",
    *JAX_RESNET,
    module="jax_resnet.resnet",
    cls="ResNetDStem",
    kind="CNN stem",
    first=Setting(dict(stem_width=6), args=(Arr((2, 16, 16, 3)),)),
    second=Setting(dict(stem_width=10, adaptive_first_width=True), args=(Arr((1, 12, 12, 4)),)),
  ),
  Case(
    "jr_convblock",
    *JAX_RESNET,
    module="jax_resnet.common",
    cls="ConvBlock",
    kind="conv + BatchNorm (is_mutable_collection)",
    first=Setting(
      dict(n_filters=5, kernel_size=(3, 3), padding=((1, 1), (1, 1))),
      args=(Arr((2, 7, 7, 4)),),
    ),
    second=Setting(
      dict(n_filters=9, kernel_size=(5, 5), strides=(2, 2), padding=((2, 2), (2, 2)), groups=3),
      args=(Arr((1, 8, 8, 6)),),
    ),
  ),
  # ---------------------------------------------------------------- matthias-wright/flaxmodels
  Case(
    "fm_gpt2_block",
    *FLAXMODELS,
    module="flaxmodels.gpt2.gpt2",
    cls="GPT2Block",
    kind="transformer block (SimpleNamespace config)",
    first=Setting(
      dict(
        config=_gpt2_config(
          n_positions=16,
          n_embd=12,
          n_head=3,
          layer_norm_epsilon=1e-5,
          activation_function="gelu_new",
        )
      ),
      args=(Arr((2, 5, 12)),),
    ),
    second=Setting(
      dict(
        config=_gpt2_config(
          n_positions=20,
          n_embd=14,
          n_head=2,
          n_inner=22,
          layer_norm_epsilon=1e-6,
          activation_function="relu",
        )
      ),
      args=(Arr((3, 9, 14)),),
    ),
  ),
  Case(
    "fm_gpt2_mlp",
    *FLAXMODELS,
    module="flaxmodels.gpt2.gpt2",
    cls="GPT2MLP",
    kind="MLP (width from a config object)",
    first=Setting(
      dict(intermediate_dim=20, config=_gpt2_config(n_embd=12, activation_function="gelu_new")),
      args=(Arr((2, 5, 12)),),
    ),
    second=Setting(
      dict(intermediate_dim=26, config=_gpt2_config(n_embd=15, activation_function="relu")),
      args=(Arr((3, 7, 15)),),
    ),
  ),
  Case(
    "fm_basic_block",
    *FLAXMODELS,
    module="flaxmodels.resnet.resnet",
    cls="BasicBlock",
    kind="CNN block (activations dict argument, functional batch_norm)",
    first=Setting(
      dict(features=6, downsample=True, block_name="block1"),
      args=(Arr((2, 8, 8, 4)), {}),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(features=9, downsample=True, block_name="block2"),
      args=(Arr((3, 10, 10, 7)), {}),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "fm_bottleneck",
    *FLAXMODELS,
    module="flaxmodels.resnet.resnet",
    cls="Bottleneck",
    kind="CNN bottleneck block",
    first=Setting(
      dict(features=4, downsample=True, expansion=4, block_name="block1"),
      args=(Arr((2, 8, 8, 6)), {}),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(features=5, downsample=True, expansion=2, block_name="block2"),
      args=(Arr((3, 6, 6, 7)), {}),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "fm_mapping",
    *FLAXMODELS,
    module="flaxmodels.stylegan2.generator",
    cls="MappingNetwork",
    kind="MLP stack in a loop (StyleGAN2 mapping, equalized lr)",
    first=Setting(
      dict(z_dim=8, w_dim=6, layer_features=10, num_ws=3, num_layers=2),
      args=(Arr((2, 8)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(z_dim=12, c_dim=5, w_dim=9, embed_features=7, layer_features=14, num_ws=4, num_layers=3),
      args=(Arr((3, 12)), Arr((3, 5))),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "fm_synthesis_layer",
    *FLAXMODELS,
    module="flaxmodels.stylegan2.generator",
    cls="SynthesisLayer",
    kind="modulated conv (StyleGAN2)",
    first=Setting(
      dict(fmaps=6, kernel=3, layer_idx=1, res=8),
      args=(Arr((2, 8, 8, 5)), Arr((2, 3, 7))),
      kwargs=dict(noise_mode="none"),
    ),
    second=Setting(
      dict(fmaps=9, kernel=1, layer_idx=2, res=4, activation="linear"),
      args=(Arr((3, 4, 4, 11)), Arr((3, 4, 10))),
      kwargs=dict(noise_mode="none"),
    ),
  ),
  Case(
    "fm_batchnorm",
    *FLAXMODELS,
    module="flaxmodels.resnet.ops",
    cls="BatchNorm",
    kind="norm variant (a copy of flax's BatchNorm)",
    first=Setting(
      dict(use_running_average=True, momentum=0.9, epsilon=1e-5),
      args=(Arr((2, 5, 6)),),
    ),
    second=Setting(
      dict(use_running_average=True, momentum=0.8, epsilon=1e-3, use_bias=False),
      args=(Arr((3, 4, 9)),),
    ),
  ),
  # ---------------------------------------------------------------- google-deepmind/recurrentgemma
  Case(
    "rg_rglru",
    *RECURRENTGEMMA,
    module="recurrentgemma.jax.layers",
    cls="RGLRU",
    kind="recurrent (RG-LRU scan)",
    first=Setting(
      dict(width=8, num_heads=2),
      args=(Arr((2, 5, 8)), Positions((2, 5))),
    ),
    second=Setting(
      dict(width=12, num_heads=3, min_rad=0.8),
      args=(Arr((3, 7, 12)), Positions((3, 7))),
    ),
  ),
  Case(
    "rg_conv1d",
    *RECURRENTGEMMA,
    module="recurrentgemma.jax.layers",
    cls="Conv1D",
    kind="temporal conv",
    first=Setting(dict(width=6, temporal_width=3), args=(Arr((2, 5, 6)), Positions((2, 5)))),
    second=Setting(dict(width=10, temporal_width=4), args=(Arr((3, 7, 10)), Positions((3, 7)))),
  ),
  Case(
    "rg_block_diag",
    *RECURRENTGEMMA,
    module="recurrentgemma.jax.layers",
    cls="BlockDiagonalLinear",
    kind="block-diagonal linear",
    first=Setting(dict(width_input=8, num_blocks=2, width_output=6), args=(Arr((2, 5, 8)),)),
    second=Setting(dict(width_input=15, num_blocks=3, width_output=12), args=(Arr((4, 7, 15)),)),
  ),
  Case(
    "rg_recurrent_block",
    *RECURRENTGEMMA,
    module="recurrentgemma.jax.modules",
    cls="RecurrentBlock",
    kind="recurrent block (conv + RG-LRU)",
    first=Setting(
      dict(width=8, num_heads=2, lru_width=12, conv1d_temporal_width=3),
      args=(Arr((2, 5, 8)), Positions((2, 5))),
    ),
    second=Setting(
      dict(width=10, num_heads=3, lru_width=18, conv1d_temporal_width=4),
      args=(Arr((3, 7, 10)), Positions((3, 7))),
    ),
  ),
  Case(
    "rg_mlp",
    *RECURRENTGEMMA,
    module="recurrentgemma.jax.modules",
    cls="MLPBlock",
    kind="gated MLP",
    first=Setting(dict(width=8, expanded_width=20), args=(Arr((2, 5, 8)),)),
    second=Setting(dict(width=11, expanded_width=26), args=(Arr((3, 7, 11)),)),
  ),
  Case(
    "rg_residual_attn",
    *RECURRENTGEMMA,
    module="recurrentgemma.jax.modules",
    cls="ResidualBlock",
    kind="residual block (local MQA attention + MLP, enum setting)",
    first=Setting(
      dict(
        width=8,
        mlp_expanded_width=20,
        num_heads=2,
        attention_window_size=4,
        temporal_block_type=Ref("recurrentgemma.common:TemporalBlockType.ATTENTION"),
      ),
      args=(Arr((2, 5, 8)), Positions((2, 5))),
    ),
    second=Setting(
      dict(
        width=12,
        mlp_expanded_width=22,
        num_heads=3,
        attention_window_size=6,
        temporal_block_type=Ref("recurrentgemma.common:TemporalBlockType.ATTENTION"),
      ),
      args=(Arr((3, 7, 12)), Positions((3, 7))),
    ),
  ),
  # ---------------------------------------------------------------- young-geng/EasyLM
  Case(
    "el_rmsnorm",
    *EASYLM,
    module="EasyLM.models.llama.llama_model",
    cls="RMSNorm",
    kind="norm variant",
    first=Setting(dict(dim=12, eps=1e-6), args=(Arr((2, 5, 12)),)),
    second=Setting(dict(dim=14, eps=1e-5), args=(Arr((3, 7, 14)),)),
  ),
  Case(
    "el_mlp",
    *EASYLM,
    module="EasyLM.models.llama.llama_model",
    cls="FlaxLLaMAMLP",
    kind="gated MLP (PretrainedConfig, setup)",
    first=Setting(
      dict(config=_llama_config(hidden_size=12, intermediate_size=20)),
      args=(Arr((2, 5, 12)),),
    ),
    second=Setting(
      dict(config=_llama_config(hidden_size=14, intermediate_size=26)),
      args=(Arr((3, 7, 14)),),
    ),
  ),
  Case(
    "el_block",
    *EASYLM,
    module="EasyLM.models.llama.llama_model",
    cls="FlaxLLaMABlock",
    kind="transformer block (rotary, GQA)",
    first=Setting(
      dict(
        config=_llama_config(
          hidden_size=12,
          intermediate_size=20,
          num_attention_heads=3,
          num_key_value_heads=3,
          rms_norm_eps=1e-6,
          max_position_embeddings=16,
          rope_theta=10000.0,
        )
      ),
      args=(Arr((2, 5, 12)), Ones((2, 5)), Positions((2, 5))),
    ),
    second=Setting(
      dict(
        config=_llama_config(
          hidden_size=16,
          intermediate_size=26,
          num_attention_heads=4,
          num_key_value_heads=2,
          rms_norm_eps=1e-5,
          max_position_embeddings=24,
          rope_theta=500.0,
        )
      ),
      args=(Arr((3, 7, 16)), Ones((3, 7)), Positions((3, 7))),
    ),
  ),
  # ---------------------------------------------------------------- google-research/vmoe
  Case(
    "vm_soft_router",
    *VMOE,
    module="vmoe.projects.soft_moe.router",
    cls="SoftRouter",
    kind="MoE router (Soft MoE)",
    first=Setting(dict(num_experts=3, num_slots=2), args=(Arr((2, 5, 8)),)),
    second=Setting(
      dict(num_experts=4, num_slots=6, compute_similarity_metrics=False),
      args=(Arr((3, 7, 9)),),
    ),
  ),
  Case(
    "vm_topk_router",
    *VMOE,
    module="vmoe.nn.routing",
    cls="NoisyTopExpertsPerItemRouter",
    kind="MoE router (top-k, gating Dense)",
    first=Setting(
      dict(
        num_experts=4,
        num_selected_experts=2,
        deterministic=True,
        dispatcher=dict(name="einsum", batch_priority=False, capacity_factor=1.0),
      ),
      args=(Arr((2, 6, 8)),),
    ),
    second=Setting(
      dict(
        num_experts=5,
        num_selected_experts=3,
        deterministic=True,
        gshard_loss_weight=0.5,
        dispatcher=dict(name="einsum", batch_priority=True, capacity_factor=2.0),
      ),
      args=(Arr((3, 7, 9)),),
    ),
  ),
  # ---------------------------------------------------------------- google-research/scenic
  Case(
    "sc_mixer_block",
    *SCENIC,
    module="scenic.projects.baselines.mixer",
    cls="MixerBlock",
    kind="MLP-Mixer block (token mixing)",
    first=Setting(
      dict(channels_mlp_dim=12, sequence_mlp_dim=10, layer_scale=0.5),
      args=(Arr((2, 5, 8)),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(channels_mlp_dim=14, sequence_mlp_dim=18, layer_scale=0.25),
      args=(Arr((3, 7, 11)),),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "sc_mlp_block",
    *SCENIC,
    module="scenic.model_lib.layers.attention_layers",
    cls="MlpBlock",
    kind="transformer MLP",
    first=Setting(
      dict(mlp_dim=10, out_dim=7, dropout_rate=0.0),
      args=(Arr((2, 5, 8)),),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(mlp_dim=13, out_dim=6, dropout_rate=0.0, use_bias=False),
      args=(Arr((3, 4, 11)),),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "sc_bit_unit",
    *SCENIC,
    module="scenic.projects.baselines.bit_resnet",
    cls="ResidualUnit",
    kind="CNN block (StdConv subclass of nn.Conv, GroupNorm)",
    first=Setting(
      dict(nout=4, strides=(1, 1), gn_num_groups=2),
      args=(Arr((2, 6, 6, 5)),),
    ),
    second=Setting(
      dict(nout=6, strides=(2, 2), dilation=(1, 1), gn_num_groups=3),
      args=(Arr((1, 8, 8, 7)),),
    ),
  ),
  Case(
    "sc_unet_down",
    *SCENIC,
    module="scenic.projects.baselines.unet",
    cls="DownsampleBlock",
    kind="U-Net block (BatchNorm, two outputs)",
    first=Setting(dict(features=6), args=(Arr((2, 8, 8, 3)),), kwargs=dict(train=False)),
    second=Setting(
      dict(features=9, padding="VALID"), args=(Arr((3, 12, 12, 5)),), kwargs=dict(train=False)
    ),
  ),
  # ---------------------------------------------------------------- google/flaxformer
  Case(
    "ff_relpos",
    *FLAXFORMER,
    module="flaxformer.components.relative_position_biases",
    cls="RelativePositionBiases",
    kind="T5 relative position bias",
    first=Setting(
      dict(num_buckets=8, max_distance=16, num_heads=2, dtype=Ref("jax.numpy:float32")),
      args=(5, 6),
      kwargs=dict(bidirectional=True),
    ),
    second=Setting(
      dict(num_buckets=10, max_distance=20, num_heads=3, dtype=Ref("jax.numpy:float32")),
      args=(7, 9),
      kwargs=dict(bidirectional=True),
    ),
  ),
  Case(
    "ff_t5_layernorm",
    *FLAXFORMER,
    module="flaxformer.components.layer_norm",
    cls="T5LayerNorm",
    kind="norm variant (mixin base)",
    first=Setting(dict(epsilon=1e-6), args=(Arr((2, 5, 12)),)),
    second=Setting(dict(epsilon=1e-5, center_scale_at_zero=True), args=(Arr((3, 7, 14)),)),
  ),
]

_BY_NAME = by_name(HOLDOUT)


def names() -> list[str]:
  return [c.name for c in HOLDOUT]


def case(name: str) -> Case:
  return _BY_NAME[name]
