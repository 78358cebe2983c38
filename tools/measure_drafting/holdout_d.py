"""HOLDOUT_D: a fourth holdout of real Linen classes, from repositories no other set uses.

Chosen after HOLDOUT, HOLDOUT_B and HOLDOUT_C had been looked at, from repositories that
none of them, the TUNING set or the HF enumeration draws on: google-research/vdm (the
variational diffusion model's score UNet, its residual and attention blocks, learned noise
schedules and a monotone `nn.Dense` subclass, settings in a `flax.struct` config),
yang-song/score_sde (NCSN / DDPM / DDPM++ / BigGAN++ layers: RefineNet pooling and
residual units, attention and residual blocks given their norm as a class or a partial,
FIR up- and downsampling convolutions, class-conditional instance norm) and
google-research/big_vision (ViT pieces with a scanned and rematerialized encoder and a MAP
head, MLP-Mixer, BiT's weight-standardized ResNet). Each entry pins the commit its source
is read at; its `second` setting changes every width (all distinct from each other and
from the first's), every tuple item and every config field the class reads, with inputs of
other sizes where the class allows. Compute dtypes stay float32 at both settings, so that
the comparison stays a float32 one; score_sde's resamplers keep `with_conv=True` at both
(without a conv they have no params to compare).

Do not draft these classes while the drafter is being worked on, and do not read their
drafts: `measure.py --cases holdout_d` runs them once, at the end (README.md).
"""

from __future__ import annotations

from cases import Arr, Case, Ints, Obj, Ref, Setting, by_name

VDM = ("google-research/vdm", "dc27b98a554f65cdc654b800da5aa1846545d41b")
SCORE_SDE = ("yang-song/score_sde", "0acb9e0ea3b8cccd935068cd9c657318fbc6ce4c")
BIG_VISION = ("google-research/big_vision", "0127fb6b337ee2a27bf4e54dea79cff176527356")

_SDE = "models"
_BV = "big_vision.models"

# The VDMConfig fields a case leaves unset (it has no defaults but its initializer); those
# no measured class reads are the whole VDM's loss settings.
_VDM_BASE = dict(
  vocab_size=256,
  sample_softmax=False,
  antithetic_time_sampling=True,
  with_fourier_features=False,
  with_attention=False,
  gamma_type="learnable_nnet",
  gamma_min=-13.3,
  gamma_max=5.0,
  sm_n_timesteps=0,
  sm_n_embd=32,
  sm_n_layer=1,
  sm_pdrop=0.1,
)


def _vdm_config(**kw: object) -> Obj:
  """vdm's `VDMConfig`, a `flax.struct.dataclass`: `_VDM_BASE` with `kw` over it."""
  return Obj("model_vdm:VDMConfig", {**_VDM_BASE, **kw})


def _partial(target: str, **kw: object) -> Obj:
  """`functools.partial(target, **kw)`: score_sde passes norm layers as partials."""
  return Obj("functools:partial", kw, args=(Ref(target),))


def _cond_norm(num_classes: int, **kw: object) -> Obj:
  """score_sde's class-conditional InstanceNorm++, as `get_normalization` builds it."""
  return _partial(
    f"{_SDE}.normalization:ConditionalInstanceNorm2dPlus", num_classes=num_classes, **kw
  )


HOLDOUT_D: list[Case] = [
  # ------------------------------------------------------------------- google-research/vdm
  Case(
    "vdm_resnet_block",
    *VDM,
    module="model_vdm",
    cls="ResnetBlock",
    kind="CNN block (GroupNorm, conditioning projection, optional skip input; struct config)",
    first=Setting(
      dict(config=_vdm_config(sm_pdrop=0.1), out_ch=64),
      args=(Arr((2, 4, 4, 32)), Arr((2, 6)), True),
    ),
    second=Setting(
      dict(config=_vdm_config(sm_pdrop=0.3), out_ch=160),
      args=(Arr((1, 3, 5, 80)), Arr((1, 10)), True),
      kwargs=dict(enc=Arr((1, 3, 5, 16))),
    ),
  ),
  Case(
    "vdm_attn_block",
    *VDM,
    module="model_vdm",
    cls="AttnBlock",
    kind="attention block (self-attention over both image axes; Dense or DenseGeneral heads)",
    first=Setting(dict(num_heads=1), args=(Arr((2, 3, 3, 32)),)),
    second=Setting(dict(num_heads=4), args=(Arr((1, 4, 2, 64)),)),
  ),
  Case(
    "vdm_score_unet",
    *VDM,
    module="model_vdm",
    cls="ScoreUNet",
    kind="whole model (score UNet: time embedding, Fourier features, ResNet/attention blocks)",
    first=Setting(
      dict(
        config=_vdm_config(
          with_fourier_features=False,
          with_attention=False,
          gamma_min=-13.3,
          gamma_max=5.0,
          sm_n_embd=32,
          sm_n_layer=1,
          sm_pdrop=0.1,
        )
      ),
      args=(Arr((2, 4, 4, 3)), Arr((2,)), Arr((2,))),
    ),
    second=Setting(
      dict(
        config=_vdm_config(
          with_fourier_features=True,
          with_attention=True,
          gamma_min=-10.0,
          gamma_max=4.0,
          sm_n_embd=64,
          sm_n_layer=2,
          sm_pdrop=0.2,
        )
      ),
      args=(Arr((1, 3, 5, 2)), Arr((1,)), Arr((1,))),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "vdm_noise_nnet",
    *VDM,
    module="model_vdm",
    cls="NoiseSchedule_NNet",
    kind="MLP (learned monotone noise schedule in setup; init from config bounds)",
    first=Setting(
      dict(config=_vdm_config(gamma_min=-13.3, gamma_max=5.0), n_features=8),
      args=(Arr((2,)),),
    ),
    second=Setting(
      dict(config=_vdm_config(gamma_min=-10.0, gamma_max=4.0), n_features=12, nonlinear=False),
      args=(Arr((5,)),),
    ),
  ),
  Case(
    "vdm_dense_monotone",
    *VDM,
    module="model_vdm",
    cls="DenseMonotone",
    kind="dense (an nn.Dense subclass: absolute-valued kernel, dot_general)",
    first=Setting(dict(features=6), args=(Arr((2, 4)),)),
    second=Setting(
      dict(
        features=9,
        use_bias=False,
        kernel_init=Obj("flax.linen.initializers:normal", {"stddev": 0.5}),
      ),
      args=(Arr((3, 5, 7)),),
    ),
  ),
  Case(
    "vdm_noise_scalar",
    *VDM,
    module="model_vdm",
    cls="NoiseSchedule_Scalar",
    kind="params only (scale and bias of a linear schedule, set in setup from config)",
    first=Setting(dict(config=_vdm_config(gamma_min=-13.3, gamma_max=5.0)), args=(Arr((2,)),)),
    second=Setting(dict(config=_vdm_config(gamma_min=-10.0, gamma_max=4.0)), args=(Arr((5,)),)),
  ),
  # -------------------------------------------------------------------- yang-song/score_sde
  Case(
    "sde_crp_block",
    *SCORE_SDE,
    module=f"{_SDE}.layers",
    cls="CRPBlock",
    kind="CNN block (RefineNet chained residual pooling; convs from a helper function)",
    first=Setting(dict(features=6, n_stages=1), args=(Arr((2, 5, 5, 6)),)),
    second=Setting(
      dict(features=9, n_stages=3, act=Ref("flax.linen:elu")), args=(Arr((1, 7, 4, 9)),)
    ),
  ),
  Case(
    "sde_rcu_block",
    *SCORE_SDE,
    module=f"{_SDE}.layers",
    cls="RCUBlock",
    kind="CNN block (RefineNet residual conv unit: nested loops of blocks and stages)",
    first=Setting(dict(features=6, n_blocks=1, n_stages=2), args=(Arr((2, 4, 4, 6)),)),
    second=Setting(
      dict(features=10, n_blocks=2, n_stages=3, act=Ref("flax.linen:swish")),
      args=(Arr((1, 5, 3, 10)),),
    ),
  ),
  Case(
    "sde_cond_crp_block",
    *SCORE_SDE,
    module=f"{_SDE}.layers",
    cls="CondCRPBlock",
    kind="CNN block (noise-conditional chained residual pooling: norm partial, label input)",
    first=Setting(
      dict(features=6, n_stages=2, normalizer=_cond_norm(4)),
      args=(Arr((2, 5, 5, 6)), Ints((2,), 4)),
    ),
    second=Setting(
      dict(features=8, n_stages=1, normalizer=_cond_norm(5, bias=False), act=Ref("flax.linen:elu")),
      args=(Arr((3, 4, 6, 8)), Ints((3,), 5)),
    ),
  ),
  Case(
    "sde_conv_mean_pool",
    *SCORE_SDE,
    module=f"{_SDE}.layers",
    cls="ConvMeanPool",
    kind="conv (a conv, then a mean over the four strided pixel phases)",
    first=Setting(dict(output_dim=6), args=(Arr((2, 4, 4, 3)),)),
    second=Setting(dict(output_dim=9, kernel_size=1, biases=False), args=(Arr((1, 6, 8, 5)),)),
  ),
  Case(
    "sde_instance_norm_pp",
    *SCORE_SDE,
    module=f"{_SDE}.normalization",
    cls="InstanceNorm2dPlus",
    kind="norm (InstanceNorm++: per-channel means renormalized; static-method initializer)",
    first=Setting(dict(), args=(Arr((2, 3, 3, 5)),)),
    second=Setting(dict(bias=False), args=(Arr((3, 4, 2, 7)),)),
  ),
  Case(
    "sde_cond_rcu_block",
    *SCORE_SDE,
    module=f"{_SDE}.layers",
    cls="CondRCUBlock",
    kind="CNN block (noise-conditional RCU: class-conditional norm partial, label input)",
    first=Setting(
      dict(features=6, n_blocks=1, n_stages=2, normalizer=_cond_norm(4)),
      args=(Arr((2, 4, 4, 6)), Ints((2,), 4)),
    ),
    second=Setting(
      dict(
        features=9,
        n_blocks=2,
        n_stages=1,
        normalizer=_cond_norm(7, bias=False),
        act=Ref("flax.linen:elu"),
      ),
      args=(Arr((3, 5, 3, 9)), Ints((3,), 7)),
    ),
  ),
  Case(
    "sde_nin",
    *SCORE_SDE,
    module=f"{_SDE}.layers",
    cls="NIN",
    kind="dense (network-in-network: own params, einsum contraction built from letters)",
    first=Setting(dict(num_units=5), args=(Arr((2, 4, 4, 3)),)),
    second=Setting(dict(num_units=7, init_scale=0.5), args=(Arr((3, 2, 6)),)),
  ),
  Case(
    "sde_attn_block",
    *SCORE_SDE,
    module=f"{_SDE}.layers",
    cls="AttnBlock",
    kind="attention block (DDPM channel attention over pixels; norm given as a partial or class)",
    first=Setting(
      dict(normalize=_partial("flax.linen:GroupNorm", num_groups=2)), args=(Arr((2, 3, 3, 4)),)
    ),
    second=Setting(
      dict(normalize=Ref(f"{_SDE}.normalization:InstanceNorm2d")), args=(Arr((1, 2, 4, 6)),)
    ),
  ),
  Case(
    "sde_resnet_ddpm",
    *SCORE_SDE,
    module=f"{_SDE}.layers",
    cls="ResnetBlockDDPM",
    kind="CNN block (DDPM residual: timestep embedding, dropout, NIN or conv shortcut)",
    first=Setting(
      dict(
        act=Ref("flax.linen:swish"),
        normalize=_partial("flax.linen:GroupNorm", num_groups=2),
        out_ch=8,
      ),
      args=(Arr((2, 4, 4, 6)), Arr((2, 5)), False),
    ),
    second=Setting(
      dict(
        act=Ref("flax.linen:relu"),
        normalize=_partial("flax.linen:GroupNorm", num_groups=3),
        out_ch=12,
        conv_shortcut=True,
        dropout=0.2,
      ),
      args=(Arr((1, 5, 3, 9)), Arr((1, 7)), False),
    ),
  ),
  Case(
    "sde_attn_pp",
    *SCORE_SDE,
    module=f"{_SDE}.layerspp",
    cls="AttnBlockpp",
    kind="attention block (DDPM++ channel attention; group count from the input width)",
    first=Setting(dict(), args=(Arr((2, 3, 3, 8)),)),
    second=Setting(dict(skip_rescale=True, init_scale=0.3), args=(Arr((1, 4, 2, 12)),)),
  ),
  Case(
    "sde_resnet_ddpmpp",
    *SCORE_SDE,
    module=f"{_SDE}.layerspp",
    cls="ResnetBlockDDPMpp",
    kind="CNN block (DDPM++ residual: skip rescale, init scale, NIN or conv shortcut)",
    first=Setting(
      dict(act=Ref("flax.linen:swish"), out_ch=16),
      args=(Arr((2, 4, 4, 8)), Arr((2, 6))),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        act=Ref("flax.linen:relu"),
        out_ch=12,
        conv_shortcut=True,
        dropout=0.2,
        skip_rescale=True,
        init_scale=0.5,
      ),
      args=(Arr((1, 3, 5, 20)), Arr((1, 9))),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "sde_resnet_biggan",
    *SCORE_SDE,
    module=f"{_SDE}.layerspp",
    cls="ResnetBlockBigGANpp",
    kind="CNN block (BigGAN++ residual: naive or FIR up/down resampling of both paths)",
    first=Setting(
      dict(act=Ref("flax.linen:swish"), up=True, out_ch=12),
      args=(Arr((2, 3, 3, 8)), Arr((2, 5))),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        act=Ref("flax.linen:elu"),
        up=False,
        down=True,
        out_ch=20,
        dropout=0.3,
        fir=True,
        fir_kernel=(1, 2, 1),
        skip_rescale=False,
        init_scale=0.4,
      ),
      args=(Arr((1, 6, 4, 16)), Arr((1, 7))),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "sde_upsample_pp",
    *SCORE_SDE,
    module=f"{_SDE}.layerspp",
    cls="Upsample",
    kind="upsampling (nearest + conv, or a fused FIR upsampling conv with its own params)",
    first=Setting(dict(out_ch=6, with_conv=True), args=(Arr((2, 3, 3, 4)),)),
    second=Setting(
      dict(out_ch=10, with_conv=True, fir=True, fir_kernel=(1, 2, 1)), args=(Arr((1, 2, 4, 5)),)
    ),
  ),
  Case(
    "sde_downsample_pp",
    *SCORE_SDE,
    module=f"{_SDE}.layerspp",
    cls="Downsample",
    kind="downsampling (a fused FIR downsampling conv, or a strided conv)",
    first=Setting(dict(out_ch=6, with_conv=True, fir=True), args=(Arr((2, 4, 4, 3)),)),
    second=Setting(
      dict(out_ch=10, with_conv=True, fir=False, fir_kernel=(1, 2, 1)), args=(Arr((1, 6, 8, 5)),)
    ),
  ),
  Case(
    "sde_combine",
    *SCORE_SDE,
    module=f"{_SDE}.layerspp",
    cls="Combine",
    kind="skip combine (1x1 conv to the other input's width, then concatenate or add)",
    first=Setting(dict(method="cat"), args=(Arr((2, 4, 4, 3)), Arr((2, 4, 4, 5)))),
    second=Setting(dict(method="sum"), args=(Arr((1, 3, 5, 6)), Arr((1, 3, 5, 2)))),
  ),
  Case(
    "sde_fourier_proj",
    *SCORE_SDE,
    module=f"{_SDE}.layerspp",
    cls="GaussianFourierProjection",
    kind="embedding (random Fourier features of noise levels; a stop-gradient param)",
    first=Setting(dict(embedding_size=4), args=(Arr((2,)),)),
    second=Setting(dict(embedding_size=6, scale=16.0), args=(Arr((5,)),)),
  ),
  Case(
    "sde_cond_instance_norm",
    *SCORE_SDE,
    module=f"{_SDE}.normalization",
    cls="ConditionalInstanceNorm2dPlus",
    kind="norm (class-conditional InstanceNorm++: an Embed with a custom split initializer)",
    first=Setting(dict(num_classes=4), args=(Arr((2, 3, 3, 5)), Ints((2,), 4))),
    second=Setting(dict(num_classes=6, bias=False), args=(Arr((3, 4, 2, 7)), Ints((3,), 6))),
  ),
  Case(
    "sde_fir_conv",
    *SCORE_SDE,
    module=f"{_SDE}.up_or_down_sampling",
    cls="Conv2d",
    kind="conv (StyleGAN2 fused up/down FIR conv; weight name and initializer as fields)",
    first=Setting(
      dict(fmaps=6, kernel=3, up=True, kernel_init=Obj(f"{_SDE}.layers:default_init")),
      args=(Arr((2, 4, 4, 3)),),
    ),
    second=Setting(
      dict(
        fmaps=8,
        kernel=5,
        up=False,
        down=True,
        resample_kernel=(1, 2, 1),
        use_bias=False,
        weight_var="W",
        kernel_init=Obj("flax.linen.initializers:lecun_normal"),
      ),
      args=(Arr((1, 6, 8, 5)),),
    ),
  ),
  # ------------------------------------------------------------ google-research/big_vision
  Case(
    "bv_vit_mlp",
    *BIG_VISION,
    module=f"{_BV}.vit",
    cls="MlpBlock",
    kind="MLP (width defaults to 4x the input's; logical sharding constraint)",
    first=Setting(dict(mlp_dim=12), args=(Arr((2, 5, 6)),)),
    second=Setting(dict(mlp_dim=None, dropout=0.2), args=(Arr((3, 4, 7)),)),
  ),
  Case(
    "bv_vit_block",
    *BIG_VISION,
    module=f"{_BV}.vit",
    cls="Encoder1DBlock",
    kind="transformer block (pre-LN MHSA + MLP; returns the output and a dict of taps)",
    first=Setting(dict(mlp_dim=12, num_heads=2), args=(Arr((2, 5, 8)),)),
    second=Setting(
      dict(mlp_dim=14, num_heads=3, dropout=0.1),
      args=(Arr((3, 7, 9)),),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "bv_vit_encoder",
    *BIG_VISION,
    module=f"{_BV}.vit",
    cls="Encoder",
    kind="encoder (a loop of blocks, or nn.scan over an nn.remat block with a named policy)",
    first=Setting(dict(depth=1, mlp_dim=12, num_heads=2), args=(Arr((2, 5, 8)),)),
    second=Setting(
      dict(
        depth=2,
        mlp_dim=10,
        num_heads=3,
        dropout=0.1,
        scan=True,
        remat_policy="dots_saveable",
      ),
      args=(Arr((3, 4, 6)),),
    ),
  ),
  Case(
    "bv_map_head",
    *BIG_VISION,
    module=f"{_BV}.vit",
    cls="MAPHead",
    kind="head (multihead attention pooling: a learned probe token, MLP)",
    first=Setting(dict(mlp_dim=12, num_heads=2), args=(Arr((2, 5, 8)),)),
    second=Setting(dict(mlp_dim=None, num_heads=3), args=(Arr((3, 6, 9)),)),
  ),
  Case(
    "bv_vit",
    *BIG_VISION,
    module=f"{_BV}.vit",
    cls="_Model",
    kind="whole model (ViT: patch conv, learned or sin-cos posemb, gap/map pooling, head)",
    first=Setting(
      dict(
        num_classes=5,
        patch_size=(2, 2),
        width=8,
        depth=1,
        mlp_dim=12,
        num_heads=2,
      ),
      args=(Arr((2, 8, 8, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        num_classes=7,
        patch_size=(3, 4),
        width=12,
        depth=2,
        mlp_dim=10,
        num_heads=3,
        posemb="sincos2d",
        rep_size=9,
        dropout=0.1,
        pool_type="map",
        head_zeroinit=False,
        scan=True,
        remat_policy="dots_saveable",
      ),
      args=(Arr((1, 9, 8, 4)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "bv_mixer_block",
    *BIG_VISION,
    module=f"{_BV}.mlp_mixer",
    cls="MixerBlock",
    kind="MLP block (Mixer: token mixing over a swapped axis, channel mixing, stochastic depth)",
    first=Setting(
      dict(tokens_mlp_dim=6, channels_mlp_dim=10, drop_p=0.1),
      args=(Arr((2, 4, 8)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(tokens_mlp_dim=7, channels_mlp_dim=12, drop_p=0.2),
      args=(Arr((3, 5, 9)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "bv_mixer",
    *BIG_VISION,
    module=f"{_BV}.mlp_mixer",
    cls="MlpMixer",
    kind="whole model (MLP-Mixer: patch stem, einops tokens, blocks, mean pool, head)",
    first=Setting(
      dict(
        patch_size=(2, 2),
        num_classes=5,
        num_blocks=1,
        hidden_dim=8,
        tokens_mlp_dim=6,
        channels_mlp_dim=12,
      ),
      args=(Arr((2, 8, 8, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        patch_size=(3, 2),
        num_classes=7,
        num_blocks=2,
        hidden_dim=10,
        tokens_mlp_dim=9,
        channels_mlp_dim=14,
        model_name="mixer-test",
        stoch_depth=0.1,
      ),
      args=(Arr((1, 9, 6, 4)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "bv_bit_unit",
    *BIG_VISION,
    module=f"{_BV}.bit",
    cls="ResidualUnit",
    kind="CNN block (BiT bottleneck: weight-standardized conv subclass, GroupNorm, projection)",
    first=Setting(dict(nmid=32), args=(Arr((2, 4, 4, 64)),)),
    second=Setting(dict(nmid=96, strides=(2, 1)), args=(Arr((1, 6, 5, 160)),)),
  ),
  Case(
    "bv_bit",
    *BIG_VISION,
    module=f"{_BV}.bit",
    cls="Model",
    kind="whole model (BiT ResNet: root conv and pool, stages of bottleneck units, head)",
    first=Setting(
      dict(num_classes=5, width=0.5, depth=(1,)),
      args=(Arr((2, 16, 16, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(num_classes=7, width=1.5, depth=(1, 2)),
      args=(Arr((1, 20, 12, 4)),),
      kwargs=dict(train=False),
    ),
  ),
]

_BY_NAME = by_name(HOLDOUT_D)


def names() -> list[str]:
  return [c.name for c in HOLDOUT_D]


def case(name: str) -> Case:
  return _BY_NAME[name]
