"""HOLDOUT_F: a sixth holdout of real Linen classes, from repositories no other set uses.

Chosen after HOLDOUT, HOLDOUT_B, HOLDOUT_C, HOLDOUT_D and HOLDOUT_E had been looked at, from
repositories that none of them, the TUNING set or the HF enumeration draws on:
patil-suraj/vqgan-jax (the taming-transformers VQGAN in Flax: up- and downsampling layers, a
GroupNorm residual block with a 1x1 or 3x3 shortcut, a spatial self-attention block, up- and
downsampling stages, the middle block, the encoder, decoder, vector quantizer and whole
VQGAN, all built in `setup`, the larger ones from a `transformers.PretrainedConfig` field),
ikostrikov/rlpd (an MLP with tuple widths, layer norm and an L2-normalized output, a pre-norm
residual MLP block and network, a conv encoder with tuple widths, kernel sizes and strides,
a Q head given its trunk as a `functools.partial`, an ensemble of heads under `nn.vmap`, and
a multi-camera pixel encoder given its encoder and network as partials and fed a dict of
observations), google/nerfies (an MLP with skip connections and an output head, the NeRF MLP
with a trunk, alpha and RGB branches fed conditioning vectors, an annealed-sinusoid time
encoder built in `setup`, a GLO embedding) and google-research/multinerf (the mip-NeRF 360
MLP: integrated positional encoding on a geodesic basis, density gradients as normals, a
view-direction branch; its proposal subclass without RGB; its NeRF subclass in the Ref-NeRF
configuration, with reflected view directions, predicted normals and roughness, diffuse
color, specular tint and a GLO vector). Each entry pins the commit its source is read at;
its `second` setting changes every width (all distinct from each other and from the
first's), every tuple item and every config field the class reads, with inputs of other
sizes where the class allows; where a class takes a tuple of widths, some `second` tuples
are one item longer (rlpd's MLP, conv encoder and Q-head trunk, nerfies' skips, the VQGAN's
channel multipliers and attention resolutions). Compute dtypes stay float32 at both
settings, so that the comparison stays a float32 one; dropout is off at both (rate 0, or
`deterministic` / `training=False`), since the comparison runs without a dropout key.

Left unchanged: the `with_conv` of a single VQGAN resampler (without a conv it has no
params), the VQGAN's dropout and its blocks' time-embedding width (no time embedding is
passed, so no layer reads it), rlpd's `scale_final` (a non-None value is passed positionally
to `xavier_uniform` as its `in_axis`, which fails on the newest jax), the RGB width of the
Ref-NeRF case (its specular tint is three channels wide), multinerf's input coordinates (3D
points, 3x3 covariances and 3D view directions by construction) and each case's call
structure (which optional inputs are given). VQGAN channel counts are multiples of 32 (its
GroupNorms have 32 groups); multinerf's positional-encoding degrees stay low, since the
cases' covariances are random (not positive) and a high degree would overflow the encoding.
rlpd's residual MLP block projects its shortcut in the first sample and takes the identity
one in the second (input width equal to `features` there).

Left out: wilson1yan/teco (its models package imports `jax.experimental.maps`),
lindermanlab/S5 and borisdayma/dalle-mini (`jnp.DeviceArray`), patil-suraj/vit-vqgan (a jax
array as a dataclass default), google/mipnerf (`flax.nn`), google/brax (its package imports
mujoco), young-geng/JaxCQL (distrax), google-research/meliad (tensorboard, through clu),
google/dopamine (its Atari module does not parse), nerfies' warp fields (their module
imports `flax.optim`), rlpd's temperature and policies (their package imports gym and
tensorflow-probability), nerfies' sinusoidal encoders alone (no params) and multinerf's
integrated directional encoding (it calls `np.math`, gone from numpy 2).

Do not draft these classes while the drafter is being worked on, and do not read their
drafts: `measure.py --cases holdout_f` runs them once, at the end (README.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from cases import Arr, Case, Ints, Obj, Ref, Setting, by_name

VQGAN = ("patil-suraj/vqgan-jax", "10ef240f8ace869e437f3c32d14898f61512db12")
RLPD = ("ikostrikov/rlpd", "c90fd4baf28c9c9ef40a81460a2e395092844f88")
NERFIES = ("google/nerfies", "1a38512214cfa14286ef0561992cca9398265e13")
MULTINERF = ("google-research/multinerf", "5b4d4f64608ec8077222c52fdf814d40acc10bc1")

_VQ = "vqgan_jax.modeling_flax_vqgan"
_RLPD_MLP = "rlpd.networks.mlp:MLP"


def _partial(target: str, **kw: object) -> Obj:
  """`functools.partial(target, **kw)`: rlpd passes its trunks and encoders as partials."""
  return Obj("functools:partial", kw, args=(Ref(target),))


def _init(name: str, **kw: object) -> Obj:
  """A `jax.nn.initializers` initializer, built (nerfies takes them as fields)."""
  return Obj(f"jax.nn.initializers:{name}", kw)


# The VQGAN config of each setting: every field the modules read differs between the two
# (channel multipliers and attention resolutions one item longer at the second).
_VQ_FIRST = dict(
  ch=32,
  ch_mult=(1, 2),
  num_res_blocks=1,
  resolution=8,
  z_channels=4,
  attn_resolutions=(4,),
  n_embed=16,
  embed_dim=5,
  out_ch=3,
  double_z=False,
  resamp_with_conv=True,
  give_pre_end=False,
  dropout=0.0,
)
_VQ_SECOND = dict(
  ch=96,
  ch_mult=(2, 3, 4),
  num_res_blocks=2,
  resolution=16,
  z_channels=6,
  attn_resolutions=(16, 8),
  n_embed=24,
  embed_dim=7,
  out_ch=2,
  double_z=True,
  resamp_with_conv=False,
  give_pre_end=True,
  dropout=0.0,
)


def _vq_config(base: Mapping[str, object], **kw: object) -> Obj:
  """A `VQGANConfig` (a `transformers.PretrainedConfig`) with `base`'s fields, `kw` over them."""
  return Obj("vqgan_jax.configuration_vqgan:VQGANConfig", {**base, **kw})


# multinerf's MLP: the first and second settings of the fields both its cases read.
_MNERF_FIRST = dict(
  net_depth=2,
  net_width=8,
  min_deg_point=0,
  max_deg_point=1,
  skip_layer=1,
  basis_shape="icosahedron",
  basis_subdivisions=1,
  density_bias=-1.0,
)
_MNERF_SECOND = dict(
  net_depth=3,
  net_width=12,
  min_deg_point=1,
  max_deg_point=2,
  skip_layer=2,
  basis_shape="octahedron",
  basis_subdivisions=2,
  density_bias=-0.5,
  net_activation=Ref("flax.linen:elu"),
  weight_init="glorot_uniform",
)


# The Ref-NeRF switches of multinerf's MLP, set at both settings of its NerfMLP case (the
# specular tint is three channels wide, so the RGB channels stay 3 there).
_REFNERF = dict(
  use_reflections=True,
  enable_pred_roughness=True,
  enable_pred_normals=True,
  use_diffuse_color=True,
  use_specular_tint=True,
  use_n_dot_v=True,
  num_rgb_channels=3,
)


def _gaussians(batch: int, samples: int) -> tuple[Arr, Arr]:
  """multinerf's `gaussians`: sample means [batch, samples, 3] and covariances [..., 3, 3]."""
  return (Arr((batch, samples, 3)), Arr((batch, samples, 3, 3)))


HOLDOUT_F: list[Case] = [
  # ------------------------------------------------------------------ patil-suraj/vqgan-jax
  Case(
    "vqgan_upsample",
    *VQGAN,
    module=_VQ,
    cls="Upsample",
    kind="resampler (nearest 2x upsampling, then a 3x3 conv built in setup)",
    first=Setting(dict(in_channels=6, with_conv=True), args=(Arr((2, 3, 3, 4)),)),
    second=Setting(dict(in_channels=10, with_conv=True), args=(Arr((1, 4, 2, 7)),)),
  ),
  Case(
    "vqgan_downsample",
    *VQGAN,
    module=_VQ,
    cls="Downsample",
    kind="resampler (asymmetric pad, then a stride-2 3x3 conv built in setup)",
    first=Setting(dict(in_channels=6, with_conv=True), args=(Arr((2, 6, 6, 4)),)),
    second=Setting(dict(in_channels=10, with_conv=True), args=(Arr((1, 7, 9, 5)),)),
  ),
  Case(
    "vqgan_resnet_block",
    *VQGAN,
    module=_VQ,
    cls="ResnetBlock",
    kind="CNN block (GroupNorm-swish-conv twice, 1x1 or 3x3 shortcut chosen by a flag)",
    first=Setting(
      dict(in_channels=32, out_channels=64, temb_channels=16, dropout_prob=0.0),
      args=(Arr((2, 5, 5, 32)),),
    ),
    second=Setting(
      dict(
        in_channels=96, out_channels=160, use_conv_shortcut=True, temb_channels=24, dropout_prob=0.0
      ),
      args=(Arr((1, 6, 4, 96)),),
    ),
  ),
  Case(
    "vqgan_attn_block",
    *VQGAN,
    module=_VQ,
    cls="AttnBlock",
    kind="attention (single-head spatial self-attention of 1x1 convs, residual)",
    first=Setting(dict(in_channels=32), args=(Arr((2, 4, 4, 32)),)),
    second=Setting(dict(in_channels=96), args=(Arr((1, 3, 5, 96)),)),
  ),
  Case(
    "vqgan_upsampling_block",
    *VQGAN,
    module=_VQ,
    cls="UpsamplingBlock",
    kind="CNN stage (residual and attention blocks, then upsampling; read from a config)",
    first=Setting(
      dict(config=_vq_config(_VQ_FIRST), curr_res=4, block_idx=1), args=(Arr((2, 4, 4, 64)),)
    ),
    second=Setting(
      dict(config=_vq_config(_VQ_SECOND, resamp_with_conv=True), curr_res=8, block_idx=2),
      args=(Arr((1, 5, 5, 384)),),
    ),
  ),
  Case(
    "vqgan_downsampling_block",
    *VQGAN,
    module=_VQ,
    cls="DownsamplingBlock",
    kind="CNN stage (residual and attention blocks, then downsampling; read from a config)",
    first=Setting(
      dict(config=_vq_config(_VQ_FIRST), curr_res=4, block_idx=0), args=(Arr((2, 8, 8, 32)),)
    ),
    second=Setting(
      dict(config=_vq_config(_VQ_SECOND, resamp_with_conv=True), curr_res=16, block_idx=1),
      args=(Arr((1, 8, 6, 192)),),
    ),
  ),
  Case(
    "vqgan_mid_block",
    *VQGAN,
    module=_VQ,
    cls="MidBlock",
    kind="CNN block (residual, attention, residual at one width)",
    first=Setting(dict(in_channels=64, temb_channels=0, dropout=0.0), args=(Arr((2, 4, 4, 64)),)),
    second=Setting(
      dict(in_channels=128, temb_channels=8, dropout=0.0), args=(Arr((1, 3, 5, 128)),)
    ),
  ),
  Case(
    "vqgan_encoder",
    *VQGAN,
    module=_VQ,
    cls="Encoder",
    kind="whole encoder (conv in, downsampling stages, middle block, norm, conv out; config)",
    first=Setting(dict(config=_vq_config(_VQ_FIRST)), args=(Arr((2, 8, 8, 3)),)),
    second=Setting(dict(config=_vq_config(_VQ_SECOND)), args=(Arr((1, 16, 16, 4)),)),
  ),
  Case(
    "vqgan_decoder",
    *VQGAN,
    module=_VQ,
    cls="Decoder",
    kind="whole decoder (conv in, middle block, upsampling stages, optional end; config)",
    first=Setting(dict(config=_vq_config(_VQ_FIRST)), args=(Arr((2, 4, 4, 4)),)),
    second=Setting(dict(config=_vq_config(_VQ_SECOND)), args=(Arr((1, 4, 4, 6)),)),
  ),
  Case(
    "vqgan_vector_quantizer",
    *VQGAN,
    module=_VQ,
    cls="VectorQuantizer",
    kind="quantizer (nearest codebook entry by distance to an Embed table; codes and indices)",
    first=Setting(dict(config=_vq_config(_VQ_FIRST)), args=(Arr((2, 3, 3, 5)),)),
    second=Setting(dict(config=_vq_config(_VQ_SECOND)), args=(Arr((1, 4, 2, 7)),)),
  ),
  Case(
    "vqgan_model",
    *VQGAN,
    module=_VQ,
    cls="VQModule",
    kind="whole model (VQGAN: encoder, quantizer, decoder, their 1x1 convs; config)",
    first=Setting(dict(config=_vq_config(_VQ_FIRST)), args=(Arr((2, 8, 8, 3)),)),
    second=Setting(
      dict(config=_vq_config(_VQ_SECOND, give_pre_end=False)), args=(Arr((1, 16, 16, 4)),)
    ),
  ),
  # ------------------------------------------------------------------------ ikostrikov/rlpd
  Case(
    "rlpd_mlp",
    *RLPD,
    module="rlpd.networks.mlp",
    cls="MLP",
    kind="MLP (tuple widths, optional layer norm and dropout, L2-normalized output)",
    first=Setting(
      dict(hidden_dims=(16, 8), dropout_rate=0.0),
      args=(Arr((3, 5)),),
      kwargs=dict(training=False),
    ),
    second=Setting(
      dict(
        hidden_dims=(20, 12, 6),
        activations=Ref("flax.linen:tanh"),
        activate_final=True,
        use_layer_norm=True,
        dropout_rate=0.1,
        use_pnorm=True,
      ),
      args=(Arr((4, 7)),),
      kwargs=dict(training=False),
    ),
  ),
  Case(
    "rlpd_mlp_resnet_block",
    *RLPD,
    module="rlpd.networks.mlp_resnet",
    cls="MLPResNetV2Block",
    kind="MLP block (pre-norm residual, projected shortcut when widths differ)",
    first=Setting(dict(features=8, act=Ref("flax.linen:relu")), args=(Arr((3, 5)),)),
    second=Setting(dict(features=12, act=Ref("flax.linen:swish")), args=(Arr((4, 12)),)),
  ),
  Case(
    "rlpd_mlp_resnet",
    *RLPD,
    module="rlpd.networks.mlp_resnet",
    cls="MLPResNetV2",
    kind="MLP (input projection, a loop of residual blocks, final norm)",
    first=Setting(dict(num_blocks=1, features=8), args=(Arr((3, 5)),)),
    second=Setting(
      dict(num_blocks=3, features=12, act=Ref("flax.linen:tanh")), args=(Arr((4, 7)),)
    ),
  ),
  Case(
    "rlpd_d4pg_encoder",
    *RLPD,
    module="rlpd.networks.encoders.d4pg_encoder",
    cls="D4PGEncoder",
    kind="CNN (tuple widths, kernel sizes and strides zipped, flattened output)",
    first=Setting(dict(features=(4, 6), filters=(2, 1), strides=(2, 1)), args=(Arr((2, 9, 9, 3)),)),
    second=Setting(
      dict(features=(5, 7, 9), filters=(3, 2, 2), strides=(1, 2, 1), padding="SAME"),
      args=(Arr((1, 12, 10, 8)),),
    ),
  ),
  Case(
    "rlpd_state_action_value",
    *RLPD,
    module="rlpd.networks.state_action_value",
    cls="StateActionValue",
    kind="Q head (a trunk given as an MLP partial on observations and actions, scalar out)",
    first=Setting(
      dict(base_cls=_partial(_RLPD_MLP, hidden_dims=(8, 6), activate_final=True)),
      args=(Arr((3, 5)), Arr((3, 2))),
    ),
    second=Setting(
      dict(
        base_cls=_partial(
          _RLPD_MLP, hidden_dims=(10, 12, 14), activate_final=True, use_layer_norm=True
        )
      ),
      args=(Arr((4, 7)), Arr((4, 3))),
    ),
  ),
  Case(
    "rlpd_ensemble",
    *RLPD,
    module="rlpd.networks.ensemble",
    cls="Ensemble",
    kind="ensemble (a Q head class given as a partial, its params stacked by nn.vmap)",
    first=Setting(
      dict(
        net_cls=_partial(
          "rlpd.networks.state_action_value:StateActionValue",
          base_cls=_partial(_RLPD_MLP, hidden_dims=(8, 6), activate_final=True),
        ),
        num=2,
      ),
      args=(Arr((3, 5)), Arr((3, 3))),
    ),
    second=Setting(
      dict(
        net_cls=_partial(
          "rlpd.networks.state_action_value:StateActionValue",
          base_cls=_partial(
            _RLPD_MLP, hidden_dims=(10, 12), activate_final=True, use_layer_norm=True
          ),
        ),
        num=7,
      ),
      args=(Arr((4, 9)), Arr((4, 4))),
    ),
  ),
  Case(
    "rlpd_pixel_multiplexer",
    *RLPD,
    module="rlpd.networks.pixel_multiplexer",
    cls="PixelMultiplexer",
    kind="encoder (per-camera conv encoders and a state projection over a dict of inputs)",
    first=Setting(
      dict(
        encoder_cls=_partial(
          "rlpd.networks.encoders.d4pg_encoder:D4PGEncoder",
          features=(4,),
          filters=(2,),
          strides=(2,),
        ),
        network_cls=_partial(_RLPD_MLP, hidden_dims=(8,)),
        latent_dim=6,
      ),
      args=({"pixels": Arr((2, 9, 9, 3, 1)), "state": Arr((2, 5))},),
    ),
    second=Setting(
      dict(
        encoder_cls=_partial(
          "rlpd.networks.encoders.d4pg_encoder:D4PGEncoder",
          features=(10, 14),
          filters=(3, 1),
          strides=(1, 2),
        ),
        network_cls=_partial(_RLPD_MLP, hidden_dims=(15, 16)),
        latent_dim=17,
        stop_gradient=True,
        pixel_keys=("front", "wrist"),
        depth_keys=("front_depth", "wrist_depth"),
      ),
      args=(
        {
          "front": Arr((1, 12, 12, 7, 2)),
          "wrist": Arr((1, 13, 13, 7, 2)),
          "front_depth": Arr((1, 12, 12, 11, 2)),
          "wrist_depth": Arr((1, 13, 13, 11, 2)),
          "state": Arr((1, 18)),
        },
      ),
    ),
  ),
  # ------------------------------------------------------------------------- google/nerfies
  Case(
    "nerfies_mlp",
    *NERFIES,
    module="nerfies.modules",
    cls="MLP",
    kind="MLP (depth and width, input re-concatenated at the skip layers, output head)",
    first=Setting(
      dict(
        depth=2,
        width=8,
        skips=(1,),
        output_channels=3,
        output_init=_init("glorot_uniform"),
      ),
      args=(Arr((3, 4)),),
    ),
    second=Setting(
      dict(
        depth=4,
        width=12,
        skips=(2, 3),
        output_channels=5,
        output_init=_init("lecun_normal"),
        hidden_init=_init("he_uniform"),
        hidden_activation=Ref("flax.linen:elu"),
        output_activation=Ref("flax.linen:sigmoid"),
        use_bias=False,
      ),
      args=(Arr((5, 6)),),
    ),
  ),
  Case(
    "nerfies_nerf_mlp",
    *NERFIES,
    module="nerfies.modules",
    cls="NerfMLP",
    kind="NeRF MLP (trunk, bottleneck, alpha and RGB branches fed broadcast conditions)",
    first=Setting(
      dict(
        trunk_depth=2,
        trunk_width=8,
        rgb_branch_depth=1,
        rgb_branch_width=6,
        rgb_channels=3,
        alpha_branch_depth=0,
        alpha_branch_width=5,
        alpha_channels=1,
        skips=(1,),
      ),
      args=(Arr((2, 10, 4)), Arr((2, 11)), Arr((2, 7)), Arr((2, 9))),
    ),
    second=Setting(
      dict(
        trunk_depth=3,
        trunk_width=18,
        rgb_branch_depth=2,
        rgb_branch_width=19,
        rgb_channels=12,
        alpha_branch_depth=1,
        alpha_branch_width=20,
        alpha_channels=2,
        activation=Ref("flax.linen:elu"),
        skips=(2,),
      ),
      args=(Arr((1, 17, 13)), Arr((1, 14)), Arr((1, 15)), Arr((1, 16))),
    ),
  ),
  Case(
    "nerfies_time_encoder",
    *NERFIES,
    module="nerfies.modules",
    cls="TimeEncoder",
    kind="encoder (annealed sinusoidal encoding, then an MLP; submodules in setup)",
    first=Setting(dict(num_freqs=2, features=3, depth=2, width=8, skips=(1,)), args=(Arr((1,)),)),
    second=Setting(
      dict(
        num_freqs=3,
        features=6,
        depth=3,
        width=12,
        skips=(2,),
        hidden_init=_init("he_uniform"),
        output_init=_init("lecun_normal"),
      ),
      args=(Arr((2,)),),
    ),
  ),
  Case(
    "nerfies_glo_encoder",
    *NERFIES,
    module="nerfies.glo",
    cls="GloEncoder",
    kind="embedding (an Embed built in setup; a trailing unit axis squeezed)",
    first=Setting(dict(num_embeddings=10, features=4), args=(Ints((3, 1), high=10),)),
    second=Setting(
      dict(num_embeddings=14, features=6, embedding_init=_init("normal", stddev=0.1)),
      args=(Ints((5, 2), high=14),),
    ),
  ),
  # -------------------------------------------------------------- google-research/multinerf
  Case(
    "multinerf_mlp",
    *MULTINERF,
    module="internal.models",
    cls="MLP",
    kind="NeRF MLP (integrated positional encoding, gradient normals, view-direction branch)",
    first=Setting(
      dict(
        **_MNERF_FIRST,
        bottleneck_width=6,
        net_depth_viewdirs=1,
        net_width_viewdirs=5,
        skip_layer_dir=1,
        num_rgb_channels=3,
        deg_view=1,
      ),
      args=(None, _gaussians(2, 3), Arr((2, 3))),
    ),
    second=Setting(
      dict(
        **_MNERF_SECOND,
        bottleneck_width=7,
        net_depth_viewdirs=3,
        net_width_viewdirs=9,
        skip_layer_dir=2,
        num_rgb_channels=4,
        deg_view=2,
        use_diffuse_color=True,
        rgb_premultiplier=0.5,
        rgb_bias=0.1,
        rgb_padding=0.002,
      ),
      args=(None, _gaussians(1, 4), Arr((1, 3))),
    ),
  ),
  Case(
    "multinerf_prop_mlp",
    *MULTINERF,
    module="internal.models",
    cls="PropMLP",
    kind="NeRF MLP (the proposal MLP: a gin-configurable subclass, density only)",
    first=Setting(
      dict(**_MNERF_FIRST, disable_rgb=True, disable_density_normals=True),
      args=(None, _gaussians(2, 3)),
    ),
    second=Setting(
      dict(**_MNERF_SECOND, disable_rgb=True, disable_density_normals=False),
      args=(None, _gaussians(1, 5)),
    ),
  ),
  Case(
    "multinerf_nerf_mlp_refnerf",
    *MULTINERF,
    module="internal.models",
    cls="NerfMLP",
    kind="NeRF MLP (Ref-NeRF: reflected view directions, roughness, diffuse and tint, GLO)",
    first=Setting(
      dict(
        **_MNERF_FIRST,
        **_REFNERF,
        bottleneck_width=6,
        net_depth_viewdirs=1,
        net_width_viewdirs=5,
        skip_layer_dir=1,
        deg_view=2,
      ),
      args=(None, _gaussians(2, 3), Arr((2, 3))),
      kwargs=dict(glo_vec=Arr((2, 4))),
    ),
    second=Setting(
      dict(
        **_MNERF_SECOND,
        **_REFNERF,
        bottleneck_width=7,
        net_depth_viewdirs=3,
        net_width_viewdirs=9,
        skip_layer_dir=2,
        deg_view=3,
        roughness_bias=-0.5,
      ),
      args=(None, _gaussians(1, 4), Arr((1, 3))),
      kwargs=dict(glo_vec=Arr((1, 10))),
    ),
  ),
]

_BY_NAME = by_name(HOLDOUT_F)


def names() -> list[str]:
  return [c.name for c in HOLDOUT_F]


def case(name: str) -> Case:
  return _BY_NAME[name]
