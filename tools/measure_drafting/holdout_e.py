"""HOLDOUT_E: a fifth holdout of real Linen classes, from repositories no other set uses.

Chosen after HOLDOUT, HOLDOUT_B, HOLDOUT_C and HOLDOUT_D had been looked at, from
repositories that none of them, the TUNING set or the HF enumeration draws on:
google-research/nested-transformer (NesT: ResNet V1 blocks, stages and model given their
norm as a `functools.partial` and their block as a class, the wide ResNet's block, group and
model, multi-head and multi-query local attention, the MLP and encoder blocks given their
norm and dense layers as partials, position and patch embeddings, the conv-pool downsampler
and the whole NesT configured by an `ml_collections.ConfigDict`), ott-jax/ott (the input
convex network ICNN built in `setup`, potential MLPs, a positive dense layer and
positive-definite quadratic potentials), ikostrikov/jaxrl (an MLP with tuple widths, value
and Q critics, and an ensemble of critics under `nn.vmap`), google/evojax (policy networks:
an MLP with a named output function, a small CNN, and an attention-neuron layer with an
LSTM cell and a positional table as a field) and google/edward2 (its JAX layers: BatchEnsemble
dense, general dense and attention, an ensemble layer norm, spectral normalization of a
Dense or Conv layer given as a field, and a random-feature Gaussian process built in
`setup`). Each entry pins the commit its source is read at; its `second` setting changes
every width (all distinct from each other and from the first's), every tuple item and every
config field the class reads, with inputs of other sizes where the class allows (evojax's
`CNN` has no fields: only its input sizes change). Compute dtypes stay float32 at both
settings, so that the comparison stays a float32 one; dropout and stochastic depth are off
at both (`train=False` / `deterministic`), since the comparison runs without a dropout key;
classes handed a block class (`ResNetStage`, `ResNet`) keep it at both. The ResNet
bottleneck block and stage and the wide ResNet block and group take their identity shortcut
in the first sample (input width equal to the block's) and their projected or padded one in
the second; the plain ResNet block projects at both; NesT's encoder block needs its input
width to equal `hidden_dims` at both.

Do not draft these classes while the drafter is being worked on, and do not read their
drafts: `measure.py --cases holdout_e` runs them once, at the end (README.md).
"""

from __future__ import annotations

from cases import Arr, Case, Obj, Ref, Setting, by_name

NEST = ("google-research/nested-transformer", "59c0d6aa1a0526fbca15507a172f3dc110f52a3c")
OTT = ("ott-jax/ott", "6aace50f673b877cc3394d0b53a24da0bbf11308")
JAXRL = ("ikostrikov/jaxrl", "4a9abaff1c915b00ca73d35a30faf16b165e52ec")
EVOJAX = ("google/evojax", "acf5252475e4fbf47e0e3f7994c03de11dd3c4ca")
EDWARD2 = ("google/edward2", "ee025600cb3cf288230f34929d8a7110e719686b")

_OTT_NETS = "ott.neural.networks"
_ED2 = "edward2.jax.nn"


def _partial(target: str, **kw: object) -> Obj:
  """`functools.partial(target, **kw)`: NesT passes norm, dense and conv layers as partials."""
  return Obj("functools:partial", kw, args=(Ref(target),))


def _batch_norm(**kw: object) -> Obj:
  """An inference-mode BatchNorm partial, as the ResNets build theirs with `train=False`."""
  return _partial("flax.linen:BatchNorm", use_running_average=True, **kw)


def _nest_config(**kw: object) -> Obj:
  """NesT's `ml_collections.ConfigDict` (the fields `nest_net.default_config` and a
  registered model set)."""
  return Obj("ml_collections:ConfigDict", args=(kw,))


HOLDOUT_E: list[Case] = [
  # ------------------------------------------------------ google-research/nested-transformer
  Case(
    "nest_resnet_block",
    *NEST,
    module="models.resnet_v1",
    cls="ResNetBlock",
    kind="CNN block (two 3x3 convs, norm given as a BatchNorm partial, projection shortcut)",
    first=Setting(dict(filters=8, norm=_batch_norm()), args=(Arr((2, 6, 6, 4)),)),
    second=Setting(
      dict(filters=12, norm=_batch_norm(momentum=0.8, epsilon=1e-3), strides=(2, 2)),
      args=(Arr((1, 8, 5, 7)),),
    ),
  ),
  Case(
    "nest_bottleneck_block",
    *NEST,
    module="models.resnet_v1",
    cls="BottleneckResNetBlock",
    kind="CNN block (a ResNetBlock subclass: 1x1-3x3-1x1 bottleneck, shortcut when shapes differ)",
    first=Setting(dict(filters=4, norm=_batch_norm()), args=(Arr((2, 5, 5, 16)),)),
    second=Setting(
      dict(filters=6, norm=_batch_norm(momentum=0.8, epsilon=1e-3), strides=(2, 2)),
      args=(Arr((1, 8, 6, 10)),),
    ),
  ),
  Case(
    "nest_resnet_stage",
    *NEST,
    module="models.resnet_v1",
    cls="ResNetStage",
    kind="CNN stage (a loop of blocks; block class and norm partial as fields)",
    first=Setting(
      dict(
        stage_size=1,
        filters=8,
        block_cls=Ref("models.resnet_v1:ResNetBlock"),
        norm=_batch_norm(),
        first_block_strides=(1, 1),
      ),
      args=(Arr((2, 6, 6, 8)),),
    ),
    second=Setting(
      dict(
        stage_size=3,
        filters=10,
        block_cls=Ref("models.resnet_v1:ResNetBlock"),
        norm=_batch_norm(momentum=0.8, epsilon=1e-3),
        first_block_strides=(2, 2),
      ),
      args=(Arr((1, 9, 7, 5)),),
    ),
  ),
  Case(
    "nest_resnet",
    *NEST,
    module="models.resnet_v1",
    cls="ResNet",
    kind="whole model (ResNet V1: root conv, stages of blocks, mean pool, head)",
    first=Setting(
      dict(
        num_classes=5,
        block_cls=Ref("models.resnet_v1:ResNetBlock"),
        stage_sizes=(1,),
        width_factor=1,
        small_input=True,
      ),
      args=(Arr((2, 8, 8, 3)),),
    ),
    second=Setting(
      dict(
        num_classes=7,
        block_cls=Ref("models.resnet_v1:ResNetBlock"),
        stage_sizes=(3, 1),
        width_factor=2,
        small_input=False,
      ),
      args=(Arr((1, 16, 12, 4)),),
    ),
  ),
  Case(
    "nest_wrn_block",
    *NEST,
    module="models.wide_resnet",
    cls="WideResnetBlock",
    kind="CNN block (wide ResNet: BatchNorm-ReLU-conv, pooled and zero-padded shortcut)",
    first=Setting(dict(channels=8), args=(Arr((2, 6, 6, 8)),), kwargs=dict(train=False)),
    second=Setting(
      dict(channels=12, strides=(2, 2), activate_before_residual=True),
      args=(Arr((1, 8, 6, 5)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "nest_wrn_group",
    *NEST,
    module="models.wide_resnet",
    cls="WideResnetGroup",
    kind="CNN stage (a loop of wide ResNet blocks, optional outer skip connection)",
    first=Setting(
      dict(blocks_per_group=1, channels=8), args=(Arr((2, 6, 6, 8)),), kwargs=dict(train=False)
    ),
    second=Setting(
      dict(
        blocks_per_group=2,
        channels=10,
        strides=(2, 2),
        activate_before_residual=True,
        use_additional_skip_connections=False,
      ),
      args=(Arr((1, 8, 8, 6)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "nest_wrn",
    *NEST,
    module="models.wide_resnet",
    cls="WideResnet",
    kind="whole model (wide ResNet: three groups, channel multiplier, custom initializers)",
    first=Setting(
      dict(blocks_per_group=1, channel_multiplier=1, num_classes=5), args=(Arr((2, 8, 8, 3)),)
    ),
    second=Setting(
      dict(
        blocks_per_group=2,
        channel_multiplier=3,
        num_classes=7,
        use_additional_skip_connections=False,
      ),
      args=(Arr((1, 12, 12, 4)),),
    ),
  ),
  Case(
    "nest_multi_head_attention",
    *NEST,
    module="libml.self_attention",
    cls="MultiHeadAttention",
    kind="attention (local multi-head over blocked images: DenseGeneral heads, raw param proj)",
    first=Setting(
      dict(num_heads=2, hidden_dims=8, qkv_bias=True, attn_drop=0.0, train=False),
      args=(Arr((2, 4, 5, 6)),),
    ),
    second=Setting(
      dict(num_heads=3, hidden_dims=12, qkv_bias=False, attn_drop=0.1, train=False),
      args=(Arr((1, 3, 6, 10)),),
    ),
  ),
  Case(
    "nest_multi_query_attention",
    *NEST,
    module="libml.self_attention",
    cls="MultiQueryAttention",
    kind="attention (local multi-query: per-head queries, one shared key/value Dense)",
    first=Setting(
      dict(num_heads=2, hidden_dims=8, qkv_bias=True, attn_drop=0.0, train=False),
      args=(Arr((2, 4, 5, 6)),),
    ),
    second=Setting(
      dict(num_heads=5, hidden_dims=15, qkv_bias=False, attn_drop=0.1, train=False),
      args=(Arr((1, 2, 7, 9)),),
    ),
  ),
  Case(
    "nest_mlp_block",
    *NEST,
    module="libml.self_attention",
    cls="MlpBlock",
    kind="MLP (dense layers from a partial given as a field, activation as a field)",
    first=Setting(
      dict(
        norm_fn=_partial("flax.linen:LayerNorm", epsilon=1e-6),
        mlp_dim=16,
        out_dim=6,
        dense_fn=_partial("flax.linen:Dense", use_bias=True),
        activation_fn=Ref("flax.linen:gelu"),
        proj_drop=0.0,
        train=False,
      ),
      args=(Arr((2, 3, 8)),),
    ),
    second=Setting(
      dict(
        norm_fn=_partial("flax.linen:LayerNorm", epsilon=1e-5),
        mlp_dim=24,
        out_dim=10,
        dense_fn=_partial("flax.linen:Dense", use_bias=False),
        activation_fn=Ref("flax.linen:relu"),
        proj_drop=0.2,
        train=False,
      ),
      args=(Arr((1, 4, 5, 7)),),
    ),
  ),
  Case(
    "nest_encoder_block",
    *NEST,
    module="libml.self_attention",
    cls="EncoderNDBlock",
    kind="transformer block (norm partial, attention type chosen by a string, MLP, drop path)",
    first=Setting(
      dict(
        num_heads=2,
        norm_fn=_partial("flax.linen:LayerNorm", epsilon=1e-6),
        hidden_dims=8,
        mlp_ratio=2,
        attn_type="local_multi_head",
        dense_fn=_partial("flax.linen:Dense", use_bias=True),
        activation_fn=Ref("flax.linen:relu"),
        qkv_bias=True,
        train=False,
      ),
      args=(Arr((2, 4, 5, 8)),),
    ),
    second=Setting(
      dict(
        num_heads=3,
        norm_fn=_partial("flax.linen:LayerNorm", epsilon=1e-5),
        hidden_dims=12,
        mlp_ratio=5,
        attn_type="local_multi_query",
        dense_fn=_partial("flax.linen:Dense", use_bias=False),
        activation_fn=Ref("flax.linen:gelu"),
        qkv_bias=False,
        path_drop=0.1,
        attn_drop=0.1,
        proj_drop=0.1,
        train=False,
      ),
      args=(Arr((1, 2, 6, 12)),),
    ),
  ),
  Case(
    "nest_position_embedding",
    *NEST,
    module="libml.self_attention",
    cls="PositionEmbedding",
    kind="params only (a learned position table shaped by the input and the embedded axes)",
    first=Setting(dict(), args=(Arr((2, 4, 5, 8)),)),
    second=Setting(dict(embed_axis=(1, 3)), args=(Arr((3, 5, 6, 7)),)),
  ),
  Case(
    "nest_patch_embedding",
    *NEST,
    module="libml.self_attention",
    cls="PatchEmbedding",
    kind="conv (patchify: conv from a partial given as a field, kernel and stride = patch)",
    first=Setting(
      dict(patch_size=(2, 2), embedding_dim=8, conv_fn=_partial("flax.linen:Conv", use_bias=True)),
      args=(Arr((2, 8, 8, 3)),),
    ),
    second=Setting(
      dict(
        patch_size=(3, 4), embedding_dim=12, conv_fn=_partial("flax.linen:Conv", use_bias=False)
      ),
      args=(Arr((1, 9, 8, 5)),),
    ),
  ),
  Case(
    "nest_conv_pool",
    *NEST,
    module="libml.self_attention",
    cls="ConvPool",
    kind="CNN block (unblock patches, conv, LayerNorm, max pool, block again)",
    first=Setting(
      dict(patch_size=(2, 2), grid_size=(2, 2), conv_fn=_partial("flax.linen:Conv")),
      args=(Arr((2, 4, 4, 6)),),
    ),
    second=Setting(
      dict(
        patch_size=(3, 4),
        grid_size=(4, 6),
        output_dim=10,
        conv_fn=_partial("flax.linen:Conv", use_bias=False),
      ),
      args=(Arr((1, 24, 12, 5)),),
    ),
  ),
  Case(
    "nest_net",
    *NEST,
    module="models.nest_net",
    cls="NestNet",
    kind="whole model (NesT: patch embedding, nested local-attention blocks, conv-pool; "
    "ConfigDict)",
    first=Setting(
      dict(
        num_classes=11,
        config=_nest_config(
          norm_type="LN",
          attn_type="local_multi_head",
          mlp_ratio=3,
          qkv_bias=True,
          attn_drop=0.0,
          proj_drop=0.0,
          stochastic_depth_drop=0.1,
          init_patch_embed_size=1,
          patch_size=4,
          num_layers_per_block=(1, 1),
          embedding_dim=10,
          num_heads=2,
        ),
      ),
      args=(Arr((2, 8, 8, 6)),),
    ),
    second=Setting(
      dict(
        num_classes=7,
        config=_nest_config(
          norm_type="BN",
          attn_type="local_multi_query",
          mlp_ratio=5,
          qkv_bias=False,
          attn_drop=0.1,
          proj_drop=0.2,
          stochastic_depth_drop=0.3,
          init_patch_embed_size=2,
          patch_size=3,
          num_layers_per_block=(2, 1, 1),
          embedding_dim=12,
          num_heads=4,
          scale_hidden_dims=2,
        ),
        activation_fn=Ref("flax.linen:relu"),
      ),
      args=(Arr((1, 24, 24, 9)),),
    ),
  ),
  # ------------------------------------------------------------------------------ ott-jax/ott
  Case(
    "ott_icnn",
    *OTT,
    module=f"{_OTT_NETS}.icnn",
    cls="ICNN",
    kind="MLP (input convex network: lists of layers built in setup, quadratic potentials)",
    path="src",
    first=Setting(dict(dim_data=3, dim_hidden=(8, 6), ranks=1), args=(Arr((4, 3)),)),
    second=Setting(
      dict(
        dim_data=5,
        dim_hidden=(7, 9, 10),
        ranks=(2, 3, 1, 4, 2),
        init_fn=Obj("flax.linen.initializers:normal", {"stddev": 0.2}),
        pos_weights=True,
      ),
      args=(Arr((6, 5)),),
    ),
  ),
  Case(
    "ott_potential_mlp",
    *OTT,
    module=f"{_OTT_NETS}.potentials",
    cls="PotentialMLP",
    kind="MLP (tuple widths; a potential with a quadratic term, or a residual gradient map)",
    path="src",
    first=Setting(dict(dim_hidden=(8, 6)), args=(Arr((4, 3)),)),
    second=Setting(
      dict(dim_hidden=(5, 9, 7), is_potential=False, act_fn=Ref("flax.linen:elu")),
      args=(Arr((6, 4)),),
    ),
  ),
  Case(
    "ott_mlp",
    *OTT,
    module=f"{_OTT_NETS}.potentials",
    cls="MLP",
    kind="MLP (tuple widths, the last the output width)",
    path="src",
    first=Setting(dict(dim_hidden=(8, 6, 2)), args=(Arr((4, 3)),)),
    second=Setting(
      dict(dim_hidden=(5, 9, 7, 11), act_fn=Ref("flax.linen:relu")), args=(Arr((3, 10)),)
    ),
  ),
  Case(
    "ott_positive_dense",
    *OTT,
    module=f"{_OTT_NETS}.layers.posdef",
    cls="PositiveDense",
    kind="dense (a rectified kernel param, tensordot)",
    path="src",
    first=Setting(dict(dim_hidden=6), args=(Arr((4, 3)),)),
    second=Setting(
      dict(dim_hidden=9, use_bias=False, rectifier_fn=Ref("flax.linen:softplus")),
      args=(Arr((2, 5, 7)),),
    ),
  ),
  Case(
    "ott_posdef_potentials",
    *OTT,
    module=f"{_OTT_NETS}.layers.posdef",
    cls="PosDefPotentials",
    kind="params only (low-rank plus diagonal quadratic forms, linear and bias terms)",
    path="src",
    first=Setting(dict(num_potentials=4, rank=2), args=(Arr((5, 3)),)),
    second=Setting(
      dict(num_potentials=6, rank=5, use_bias=False, rectifier_fn=Ref("flax.linen:softplus")),
      args=(Arr((2, 4, 7)),),
    ),
  ),
  # ------------------------------------------------------------------------- ikostrikov/jaxrl
  Case(
    "jaxrl_mlp",
    *JAXRL,
    module="jaxrl.networks.common",
    cls="MLP",
    kind="MLP (tuple widths, orthogonal init, optional final activation and dropout)",
    first=Setting(dict(hidden_dims=(8, 6)), args=(Arr((3, 4)),)),
    second=Setting(
      dict(
        hidden_dims=(5, 9, 7),
        activations=Ref("flax.linen:tanh"),
        activate_final=True,
        dropout_rate=0.1,
      ),
      args=(Arr((2, 10)),),
      kwargs=dict(training=False),
    ),
  ),
  Case(
    "jaxrl_value_critic",
    *JAXRL,
    module="jaxrl.networks.critic_net",
    cls="ValueCritic",
    kind="MLP (a state-value head: an MLP submodule with a width-1 output, squeezed)",
    first=Setting(dict(hidden_dims=(8, 6)), args=(Arr((3, 4)),)),
    second=Setting(dict(hidden_dims=(5, 9, 7)), args=(Arr((2, 10)),)),
  ),
  Case(
    "jaxrl_critic",
    *JAXRL,
    module="jaxrl.networks.critic_net",
    cls="Critic",
    kind="MLP (a Q head over concatenated observations and actions)",
    first=Setting(dict(hidden_dims=(8, 6)), args=(Arr((3, 4)), Arr((3, 2)))),
    second=Setting(
      dict(hidden_dims=(5, 9, 7), activations=Ref("flax.linen:tanh")),
      args=(Arr((2, 10)), Arr((2, 11))),
    ),
  ),
  Case(
    "jaxrl_double_critic",
    *JAXRL,
    module="jaxrl.networks.critic_net",
    cls="DoubleCritic",
    kind="ensemble (nn.vmap over a critic class: stacked params, one output per member)",
    first=Setting(dict(hidden_dims=(8, 6)), args=(Arr((3, 4)), Arr((3, 2)))),
    second=Setting(
      dict(hidden_dims=(5, 9, 7), activations=Ref("flax.linen:elu"), num_qs=3),
      args=(Arr((2, 10)), Arr((2, 11))),
    ),
  ),
  # ---------------------------------------------------------------------------- google/evojax
  Case(
    "evojax_mlp",
    *EVOJAX,
    module="evojax.policy.mlp",
    cls="MLP",
    kind="MLP (tuple widths, tanh hidden layers, output function named by a string)",
    first=Setting(dict(feat_dims=(8, 6), out_dim=3, out_fn="tanh"), args=(Arr((2, 4)),)),
    second=Setting(dict(feat_dims=(5, 9, 7), out_dim=11, out_fn="softmax"), args=(Arr((3, 10)),)),
  ),
  Case(
    "evojax_cnn",
    *EVOJAX,
    module="evojax.policy.convnet",
    cls="CNN",
    kind="whole model (MNIST CNN: two conv-pool stages, flatten, dense; no fields)",
    first=Setting(dict(), args=(Arr((2, 8, 8, 1)),)),
    second=Setting(dict(), args=(Arr((3, 12, 4, 2)),)),
  ),
  Case(
    "evojax_attention_neuron",
    *EVOJAX,
    module="evojax.policy.mlp_pi",
    cls="AttentionNeuronMLP",
    kind="attention (permutation-invariant: LSTM cell keys, a position table field as queries)",
    first=Setting(
      dict(
        act_dim=3,
        msg_dim=4,
        hidden_dim=6,
        pos_em_dim=5,
        pos_em=Obj("evojax.policy.mlp_pi:pos_table", args=(6, 5)),
      ),
      args=(Arr((7,)), Arr((3,)), (Arr((7, 5)), Arr((7, 5)))),
    ),
    second=Setting(
      dict(
        act_dim=2,
        msg_dim=8,
        hidden_dim=9,
        pos_em_dim=11,
        pos_em=Obj("evojax.policy.mlp_pi:pos_table", args=(9, 11)),
      ),
      args=(Arr((10,)), Arr((2,)), (Arr((10, 11)), Arr((10, 11)))),
    ),
  ),
  # --------------------------------------------------------------------------- google/edward2
  Case(
    "ed2_dense_batch_ensemble",
    *EDWARD2,
    module=f"{_ED2}.dense",
    cls="DenseBatchEnsemble",
    kind="dense (BatchEnsemble: shared kernel, per-member fast weights, einsum)",
    first=Setting(dict(features=6, ens_size=2), args=(Arr((4, 5)),)),
    second=Setting(
      dict(features=9, ens_size=3, activation=Ref("flax.linen:relu"), use_bias=False),
      args=(Arr((6, 2, 7)),),
    ),
  ),
  Case(
    "ed2_dense_general_batch_ensemble",
    *EDWARD2,
    module=f"{_ED2}.dense",
    cls="DenseGeneralBatchEnsemble",
    kind="dense (BatchEnsemble DenseGeneral: tuple features and axes, dot_general)",
    first=Setting(dict(features=6, ens_size=2), args=(Arr((2, 3, 5)),)),
    second=Setting(
      dict(features=(4, 9), ens_size=3, axis=(-2, -1), use_bias=False),
      args=(Arr((3, 2, 7, 8)),),
    ),
  ),
  Case(
    "ed2_attention_batch_ensemble",
    *EDWARD2,
    module=f"{_ED2}.attention",
    cls="MultiHeadDotProductAttentionBE",
    kind="attention (multi-head dot-product with BatchEnsemble projections)",
    first=Setting(
      dict(num_heads=2, ens_size=3, qkv_features=8),
      args=(Arr((3, 1, 4, 6)), Arr((3, 1, 4, 6))),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(num_heads=4, ens_size=5, qkv_features=12, out_features=9, use_bias=False),
      args=(Arr((5, 2, 3, 7)), Arr((5, 2, 6, 7))),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "ed2_layer_norm_ensemble",
    *EDWARD2,
    module=f"{_ED2}.normalization",
    cls="LayerNormEnsemble",
    kind="norm (layer norm with a scale and bias per ensemble member)",
    first=Setting(dict(ens_size=2), args=(Arr((4, 6)),)),
    second=Setting(dict(ens_size=3, epsilon=1e-5, use_bias=False), args=(Arr((6, 2, 5)),)),
  ),
  Case(
    "ed2_spectral_norm",
    *EDWARD2,
    module=f"{_ED2}.normalization",
    cls="SpectralNormalization",
    kind="wrapper (spectral norm of a Dense given as a field: its params nested, power iteration)",
    first=Setting(
      dict(layer=Obj("flax.linen:Dense", {"features": 6})),
      args=(Arr((3, 4)),),
      kwargs=dict(training=False),
    ),
    second=Setting(
      dict(layer=Obj("flax.linen:Dense", {"features": 9}), iteration=2, norm_multiplier=0.9),
      args=(Arr((2, 7)),),
      kwargs=dict(training=False),
    ),
  ),
  Case(
    "ed2_spectral_norm_conv",
    *EDWARD2,
    module=f"{_ED2}.normalization",
    cls="SpectralNormalizationConv2D",
    kind="wrapper (spectral norm of a Conv given as a field, the kernel applied as a conv)",
    first=Setting(
      dict(layer=Obj("flax.linen:Conv", {"features": 6, "kernel_size": (3, 3)})),
      args=(Arr((2, 5, 5, 3)),),
      kwargs=dict(training=False),
    ),
    second=Setting(
      dict(
        layer=Obj("flax.linen:Conv", {"features": 8, "kernel_size": (2, 4)}),
        iteration=2,
        norm_multiplier=0.9,
      ),
      args=(Arr((1, 6, 7, 5)),),
      kwargs=dict(training=False),
    ),
  ),
  Case(
    "ed2_random_feature_gp",
    *EDWARD2,
    module=f"{_ED2}.random_feature",
    cls="RandomFeatureGaussianProcess",
    kind="head (random Fourier features, logits, Laplace covariance; submodules in setup)",
    first=Setting(dict(features=3, hidden_features=16), args=(Arr((4, 5)),)),
    second=Setting(
      dict(features=7, hidden_features=24, normalize_input=False), args=(Arr((6, 9)),)
    ),
  ),
]

_BY_NAME = by_name(HOLDOUT_E)


def names() -> list[str]:
  return [c.name for c in HOLDOUT_E]


def case(name: str) -> Case:
  return _BY_NAME[name]
