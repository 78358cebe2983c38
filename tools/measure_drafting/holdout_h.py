"""HOLDOUT_H: an eighth holdout of real Linen classes, from repositories no other set uses.

Chosen after HOLDOUT and HOLDOUT_B to HOLDOUT_G had been looked at, from repositories that
none of them, the TUNING set or the HF enumeration draws on: mlcommons/algorithmic-efficiency
(the AlgoPerf benchmark's JAX workloads, at the last commit whose package `__init__` sets its
version itself rather than importing a `_version` module that only an install writes: the
Conformer's layer norm with a `1 + scale` param made in `setup`, strided subsampling convs
from a `setup` kernel that subsample the paddings too, the subsampling front end, the
feed-forward module, self-attention with a learned query scale and a temperature, a
padding-aware batch norm that reads batch or running statistics, the gated depthwise conv
block, the Conformer block and the whole Conformer from raw audio through its mel front end,
all configured by a `flax.struct` dataclass; DeepSpeech's batch norm, subsampling front end,
feed-forward module and recurrent block, whose norm a config switch chooses, its LSTM built
on `jax.experimental.rnn` from one packed weight param, and the whole DeepSpeech; the WMT
translation model's MLP block with an optional GLU branch, its encoder block with pre- or
post-layer-norm, its encoder (embedding, positions, a loop of blocks) and decoder (shifted
targets, self and cross attention, logits tied to the embedding); fastMRI's conv block,
transposed-conv block and UNet; criteo's DLRM ResNet and DLRM-small, whose tuples of widths
and one embedding table are fields; and the ogbg graph network over a `jraph.GraphsTuple`),
google/init2winit (its modules that import neither TensorFlow nor its `utils`: a learned
scalar, the virtual batch norm, binarized Dense and DenseGeneral layers whose binarization
is given as `ml_collections.ConfigDict` hyperparameters, binarized multi-head attention
whose quantization flags are a dataclass field, and a stacked LSTM) and google/brax (its
training MLP, at the last commit whose package imports no mujoco). Each entry pins the
commit its source is read at; its `second` setting changes every width, every tuple item and
every config field the class reads, with inputs of other sizes where the class allows; where
a class takes a tuple of widths, its `second` tuple is one item longer (the DLRMs' bottom and
top MLPs, the GNN's hidden widths, the LSTM's hidden sizes, brax's layer sizes); the UNet's
and the models' depths (pool layers, encoder, LSTM, MLP and message-passing counts) grow. No
class here has a compute dtype other than float32; dropout is off at both settings (every
rate 0, `train=False`, `deterministic=True`), since the comparison runs without a dropout
key.

Where a switch changes which params exist, the second setting flips it: the Conformer block
and model drop their post layer norm, DeepSpeech's feed-forward module, recurrent block and
model swap batch norm for layer norm (`layernorm_everywhere`), the recurrent block turns
unidirectional and the model drops its residual connections and decoder layer norm, the WMT
MLP block takes a GLU branch and an explicit output width, its encoder block a GLU branch
and post-layer-norms, its encoder and
decoder learn their position embedding and the encoder is given a shared `nn.Embed`
instance, fastMRI's blocks and UNet use layer norm instead of instance norm, DLRM-small
adds layer norms, the DeepSpeech LSTM gets two bidirectional layers, init2winit's
virtual batch norm and binarized layers drop their biases, BiDense binarizes its
inputs too, the binarized attention quantizes its activations as well as its weights, the
init2winit LSTM turns bidirectional with residual connections, and brax's MLP drops its
biases. Paddings are random 0/1 masks for the layers and all zeros for the whole audio
models (whose inputs are raw waveforms of 2000 and 2640 samples).

Left unchanged: the Conformer's and DeepSpeech's subsampling convs' `SAME` padding (the
paddings they subsample must keep their length), `Conv2dSubsampling`'s stride stays equal
across its two axes (the paddings follow its first item), the DLRMs' 26 categorical features and
the DLRM ResNet's equal widths inside each MLP (it adds each layer to its input) and last
top width 1, DLRM-small's last bottom width a multiple of `embed_dim`, the WMT attention's
qkv width a multiple of its heads, the binarized attention's output width equal to its qkv
width (it adds the reshaped attention output), DeepSpeech's `bidirectional` in the whole
model (a unidirectional LSTM halves the width its residual and next norm expect), the
virtual batch norm's `use_running_average` (batch statistics are only written, in a mutable
`batch_stats`) and the batch norms' update switches (off: applying reads, never writes,
statistics). The DLRMs' inputs are integer-valued float arrays (the dense features and the
categorical ids share one array); the GNN's graphs are built from fixed-key arrays.

Left out: borisdayma/dalle-mini (its modeling module imports `wandb` through its utils, and
its DalleBart layers extend HF transformers' Flax BART, which the drafter is built on),
init2winit's model zoo (transformer LM and translation, wide ResNet, autoencoder, conformer,
UNet, GNN, ViT, MLP: every model module imports `base_model`, hence `init2winit.utils`, which
imports TensorFlow, pandas and clu) and its attention module (a copy of flax's attention
module), algorithmic-efficiency's ImageNet ResNet and ViT and CIFAR
ResNet (their modules import `spec`, which imports torch), its WMT `Transformer` and
`EncoderDecoder1DBlock` with masks (their attention calls pass the mask positionally where
the newest flax takes `inputs_v`; the encoder and decoder are measured without masks), its
newest commits (`algoperf/__init__` imports a generated `_version`), the SpecAugment layer
(no params; it draws masks at apply time) and the mel front end alone (no params), brax's
newest networks (its package `__init__` imports mujoco, a compiled dependency) and, at the
pinned commit, its spectral-norm `SNDense` and `SNMLP` (they draw from a `sing_vec` key at
apply time). The ogbg GNN needs `jraph` in the measure venv.

Do not draft these classes while the drafter is being worked on, and do not read their
drafts: `measure.py --cases holdout_h` runs them once, at the end (README.md).
"""

from __future__ import annotations

from cases import Arr, Case, Ints, Obj, Ref, Setting, by_name

ALGOPERF = ("mlcommons/algorithmic-efficiency", "616a0f499967b95db1ff2f47b36effcee975fc5c")
INIT2WINIT = ("google/init2winit", "afd5a84dbb865f41bf8d6b75181d5b421d73806b")
BRAX = ("google/brax", "16304037a36b1d9c8c0b3084f57d1159627b636b")

_W = "algorithmic_efficiency.workloads"
_CONFORMER = f"{_W}.librispeech_conformer.librispeech_jax.models"
_DEEPSPEECH = f"{_W}.librispeech_deepspeech.librispeech_jax.models"
_WMT = f"{_W}.wmt.wmt_jax.models"
_FASTMRI = f"{_W}.fastmri.fastmri_jax.models"
_CRITEO = f"{_W}.criteo1tb.criteo1tb_jax.models"
_OGBG = f"{_W}.ogbg.ogbg_jax.models"
_BINARIZE = "init2winit.model_lib.binarize_layers"


def _init(name: str, *args: object, **kw: object) -> Obj:
  """A `jax.nn.initializers` initializer, built (some classes take them as fields)."""
  return Obj(f"jax.nn.initializers:{name}", kw, args=args)


def _pads(*shape: int) -> Ints:
  """A float32 0/1 padding array (1 marks a padded step)."""
  return Ints(shape, high=2, dtype="float32")


def _no_pads(*shape: int) -> Ints:
  """A float32 padding array of zeros (no step padded)."""
  return Ints(shape, high=1, dtype="float32")


def _conformer(**kw: object) -> Obj:
  """A `ConformerConfig` (a flax.struct dataclass) with every dropout rate 0."""
  rates = dict(
    attention_dropout_rate=0.0,
    attention_residual_dropout_rate=0.0,
    conv_residual_dropout_rate=0.0,
    feed_forward_dropout_rate=0.0,
    feed_forward_residual_dropout_rate=0.0,
    input_dropout_rate=0.0,
  )
  return Obj(f"{_CONFORMER}:ConformerConfig", {**rates, **kw})


def _deepspeech(**kw: object) -> Obj:
  """A `DeepspeechConfig` (a flax.struct dataclass) with every dropout rate 0."""
  rates = dict(input_dropout_rate=0.0, feed_forward_dropout_rate=0.0)
  return Obj(f"{_DEEPSPEECH}:DeepspeechConfig", {**rates, **kw})


def _wmt(**kw: object) -> Obj:
  """A WMT `TransformerConfig` (a flax.struct dataclass), dropout off, deterministic."""
  rates = dict(dropout_rate=0.0, attention_dropout_rate=0.0, deterministic=True)
  return Obj(f"{_WMT}:TransformerConfig", {**rates, **kw})


def _bin(bound: float | None, epsilon: float, scale_axis: object = None) -> Obj:
  """init2winit binarization hyperparameters (an ml_collections ConfigDict)."""
  return Obj(
    "ml_collections:ConfigDict",
    args=(dict(bound=bound, epsilon=epsilon, scale_axis=scale_axis),),
  )


def _normal(shape: tuple[int, ...], seed: int) -> Obj:
  """A float32 normal jax array drawn from a fixed key (an array inside a jraph graph)."""
  return Obj("jax.random:normal", args=(Obj("jax.random:key", args=(seed,)), shape))


def _ints(values: list[int]) -> Obj:
  return Obj("jax.numpy:array", dict(dtype="int32"), args=(values,))


def _graph(
  n_node: list[int], senders: list[int], receivers: list[int], node_dim: int, edge_dim: int
) -> Obj:
  """A `jraph.GraphsTuple` of len(n_node) graphs without globals (the ogbg GNN's input)."""
  return Obj(
    "jraph:GraphsTuple",
    dict(
      nodes=_normal((sum(n_node), node_dim), 3),
      edges=_normal((len(senders), edge_dim), 4),
      senders=_ints(senders),
      receivers=_ints(receivers),
      globals=None,
      n_node=_ints(n_node),
      n_edge=_ints(_edges_per_graph(n_node, senders)),
    ),
  )


def _edges_per_graph(n_node: list[int], senders: list[int]) -> list[int]:
  bounds, start = [], 0
  for n in n_node:
    bounds.append((start, start + n))
    start += n
  return [sum(1 for s in senders if lo <= s < hi) for lo, hi in bounds]


HOLDOUT_H: list[Case] = [
  # ------------------------------------------- mlcommons/algorithmic-efficiency: conformer
  Case(
    "algoperf_conformer_layer_norm",
    *ALGOPERF,
    module=_CONFORMER,
    cls="LayerNorm",
    kind="norm (layer norm scaled by 1 + a zero-initialized scale; params made in setup)",
    first=Setting(dict(dim=6), args=(Arr((2, 5, 6)),)),
    second=Setting(dict(dim=10, epsilon=1e-3), args=(Arr((1, 7, 10)),)),
  ),
  Case(
    "algoperf_conformer_conv2d_subsampling",
    *ALGOPERF,
    module=_CONFORMER,
    cls="Conv2dSubsampling",
    kind="resampler (strided lax conv from a setup kernel; paddings subsampled alongside)",
    first=Setting(
      dict(input_channels=1, output_channels=6),
      args=(Arr((2, 8, 12, 1)), _pads(2, 8)),
    ),
    second=Setting(
      dict(input_channels=3, output_channels=9, filter_stride=(3, 3)),
      args=(Arr((1, 9, 7, 3)), _pads(1, 9)),
    ),
  ),
  Case(
    "algoperf_conformer_subsample",
    *ALGOPERF,
    module=_CONFORMER,
    cls="Subsample",
    kind="front end (two conv subsamplings, flatten, Dense, sinusoidal positions)",
    first=Setting(
      dict(encoder_dim=4, input_dropout_rate=0.0),
      args=(Arr((2, 12, 8)), _pads(2, 12)),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(encoder_dim=6, input_dropout_rate=0.0),
      args=(Arr((1, 16, 12)), _pads(1, 16)),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "algoperf_conformer_feed_forward",
    *ALGOPERF,
    module=_CONFORMER,
    cls="FeedForwardModule",
    kind="MLP (norm, expansion Dense, activation named in a struct config, padding mask)",
    first=Setting(
      dict(config=_conformer(encoder_dim=8, feed_forward_expansion_factor=2)),
      args=(Arr((2, 5, 8)), _pads(2, 5, 1)),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        config=_conformer(
          encoder_dim=12, feed_forward_expansion_factor=3, activation_function_name="gelu"
        )
      ),
      args=(Arr((1, 7, 12)), _pads(1, 7, 1)),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "algoperf_conformer_self_attention",
    *ALGOPERF,
    module=_CONFORMER,
    cls="MultiHeadedSelfAttention",
    kind="attention (nn.SelfAttention with a learned per-dim query scale and temperature)",
    first=Setting(
      dict(config=_conformer(encoder_dim=8, num_attention_heads=2)),
      args=(Arr((2, 5, 8)), _pads(2, 5)),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(config=_conformer(encoder_dim=12, num_attention_heads=3, attention_temperature=0.7)),
      args=(Arr((1, 7, 12)), _pads(1, 7)),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "algoperf_conformer_batch_norm",
    *ALGOPERF,
    module=_CONFORMER,
    cls="BatchNorm",
    kind="norm (padding-aware batch norm: variables in setup, batch or running statistics)",
    first=Setting(
      dict(config=_conformer(encoder_dim=6)),
      args=(Arr((2, 5, 6)), _pads(2, 5), False, False),
    ),
    second=Setting(
      dict(config=_conformer(encoder_dim=10, batch_norm_momentum=0.9, batch_norm_epsilon=1e-4)),
      args=(Arr((1, 7, 10)), _pads(1, 7), False, True),
    ),
  ),
  Case(
    "algoperf_conformer_conv_block",
    *ALGOPERF,
    module=_CONFORMER,
    cls="ConvolutionBlock",
    kind="conv block (gated Dense pair, depthwise 1D conv, padding-aware batch norm)",
    first=Setting(
      dict(config=_conformer(encoder_dim=8, convolution_kernel_size=3)),
      args=(Arr((2, 6, 8)), _pads(2, 6), False, False, True),
    ),
    second=Setting(
      dict(
        config=_conformer(
          encoder_dim=12,
          convolution_kernel_size=5,
          activation_function_name="gelu",
          batch_norm_epsilon=1e-4,
        )
      ),
      args=(Arr((1, 9, 12)), _pads(1, 9), False, False, False),
    ),
  ),
  Case(
    "algoperf_conformer_block",
    *ALGOPERF,
    module=_CONFORMER,
    cls="ConformerBlock",
    kind="transformer block (half-step MLPs around attention and conv; optional post norm)",
    first=Setting(
      dict(
        config=_conformer(
          encoder_dim=8,
          num_attention_heads=2,
          convolution_kernel_size=3,
          feed_forward_expansion_factor=2,
          use_post_layer_norm=True,
        )
      ),
      args=(Arr((2, 6, 8)), _pads(2, 6), False, False, True),
    ),
    second=Setting(
      dict(
        config=_conformer(
          encoder_dim=12,
          num_attention_heads=4,
          convolution_kernel_size=5,
          feed_forward_expansion_factor=3,
          attention_temperature=0.8,
          activation_function_name="gelu",
          use_post_layer_norm=False,
        )
      ),
      args=(Arr((1, 9, 12)), _pads(1, 9), False, False, True),
    ),
  ),
  Case(
    "algoperf_conformer",
    *ALGOPERF,
    module=_CONFORMER,
    cls="Conformer",
    kind="whole model (Conformer: mel front end, subsampling, a loop of blocks; struct config)",
    first=Setting(
      dict(
        config=_conformer(
          vocab_size=11,
          encoder_dim=8,
          num_attention_heads=2,
          num_encoder_layers=1,
          convolution_kernel_size=3,
          feed_forward_expansion_factor=2,
        )
      ),
      args=(Arr((2, 2000)), _no_pads(2, 2000)),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        config=_conformer(
          vocab_size=13,
          encoder_dim=12,
          num_attention_heads=3,
          num_encoder_layers=2,
          convolution_kernel_size=5,
          feed_forward_expansion_factor=3,
          attention_temperature=0.9,
          activation_function_name="gelu",
          use_post_layer_norm=False,
          batch_norm_epsilon=1e-4,
        )
      ),
      args=(Arr((1, 2640)), _no_pads(1, 2640)),
      kwargs=dict(train=False),
    ),
  ),
  # ------------------------------------------ mlcommons/algorithmic-efficiency: deepspeech
  Case(
    "algoperf_deepspeech_batch_norm",
    *ALGOPERF,
    module=_DEEPSPEECH,
    cls="BatchNorm",
    kind="norm (padding-aware batch norm read from running statistics; sizes as fields)",
    first=Setting(
      dict(encoder_dim=6), args=(Arr((2, 5, 6)), _pads(2, 5)), kwargs=dict(train=False)
    ),
    second=Setting(
      dict(encoder_dim=10, batch_norm_momentum=0.9, batch_norm_epsilon=1e-4),
      args=(Arr((1, 7, 10)), _pads(1, 7)),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "algoperf_deepspeech_subsample",
    *ALGOPERF,
    module=_DEEPSPEECH,
    cls="Subsample",
    kind="front end (two conv subsamplings with relu or tanh, flatten, Dense; struct config)",
    first=Setting(
      dict(config=_deepspeech(encoder_dim=4)),
      args=(Arr((2, 12, 8)), _pads(2, 12)),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(config=_deepspeech(encoder_dim=6, use_tanh=True)),
      args=(Arr((1, 16, 12)), _pads(1, 16)),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "algoperf_deepspeech_feed_forward",
    *ALGOPERF,
    module=_DEEPSPEECH,
    cls="FeedForwardModule",
    kind="MLP (batch norm or layer norm by a config switch, Dense, relu or tanh, mask)",
    first=Setting(
      dict(config=_deepspeech(encoder_dim=8)),
      args=(Arr((2, 5, 8)), _pads(2, 5)),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(config=_deepspeech(encoder_dim=12, layernorm_everywhere=True, use_tanh=True)),
      args=(Arr((1, 7, 12)), _pads(1, 7)),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "algoperf_deepspeech_lstm",
    *ALGOPERF,
    module=_DEEPSPEECH,
    cls="CudnnLSTM",
    kind="recurrent (jax.experimental.rnn LSTM from one packed weight param; lengths mask)",
    first=Setting(
      dict(features=6),
      args=(Arr((2, 5, 4)), _pads(2, 5)),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(features=5, num_layers=2, bidirectional=True),
      args=(Arr((1, 7, 3)), _pads(1, 7)),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "algoperf_deepspeech_batch_rnn",
    *ALGOPERF,
    module=_DEEPSPEECH,
    cls="BatchRNN",
    kind="recurrent block (norm chosen by a config switch, then an LSTM of half the width)",
    first=Setting(
      dict(config=_deepspeech(encoder_dim=8, bidirectional=True)),
      args=(Arr((2, 5, 8)), _pads(2, 5)),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(config=_deepspeech(encoder_dim=12, bidirectional=False, layernorm_everywhere=True)),
      args=(Arr((1, 7, 12)), _pads(1, 7)),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "algoperf_deepspeech",
    *ALGOPERF,
    module=_DEEPSPEECH,
    cls="Deepspeech",
    kind="whole model (DeepSpeech: mel front end, subsampling, LSTM and MLP loops; config)",
    first=Setting(
      dict(config=_deepspeech(vocab_size=11, encoder_dim=8, num_lstm_layers=1, num_ffn_layers=1)),
      args=(Arr((2, 2000)), _no_pads(2, 2000)),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        config=_deepspeech(
          vocab_size=13,
          encoder_dim=12,
          num_lstm_layers=2,
          num_ffn_layers=2,
          enable_residual_connections=False,
          enable_decoder_layer_norm=False,
          use_tanh=True,
          layernorm_everywhere=True,
          batch_norm_epsilon=1e-4,
        )
      ),
      args=(Arr((1, 2640)), _no_pads(1, 2640)),
      kwargs=dict(train=False),
    ),
  ),
  # ------------------------------------------------- mlcommons/algorithmic-efficiency: wmt
  Case(
    "algoperf_wmt_mlp_block",
    *ALGOPERF,
    module=_WMT,
    cls="MlpBlock",
    kind="MLP (optional GLU branch, activation and initializers in a struct config)",
    first=Setting(dict(config=_wmt(mlp_dim=12)), args=(Arr((2, 5, 6)),)),
    second=Setting(
      dict(
        config=_wmt(
          mlp_dim=16,
          glu=True,
          activation=Ref("flax.linen:gelu"),
          kernel_init=_init("lecun_normal"),
          bias_init=_init("normal", 0.02),
        ),
        out_dim=7,
      ),
      args=(Arr((1, 4, 10)),),
    ),
  ),
  Case(
    "algoperf_wmt_encoder_block",
    *ALGOPERF,
    module=_WMT,
    cls="Encoder1DBlock",
    kind="transformer block (pre- or post-layer-norm by a config switch; attention temp)",
    first=Setting(
      dict(config=_wmt(num_heads=2, qkv_dim=8, mlp_dim=12)),
      args=(Arr((2, 5, 8)),),
    ),
    second=Setting(
      dict(
        config=_wmt(num_heads=3, qkv_dim=12, mlp_dim=20, pre_ln=False, attention_temp=0.8, glu=True)
      ),
      args=(Arr((1, 7, 10)),),
    ),
  ),
  Case(
    "algoperf_wmt_encoder",
    *ALGOPERF,
    module=_WMT,
    cls="Encoder",
    kind="transformer encoder (embedding or a shared Embed instance, positions, block loop)",
    first=Setting(
      dict(
        config=_wmt(
          vocab_size=13, emb_dim=8, num_heads=2, num_layers=1, qkv_dim=8, mlp_dim=12, max_len=16
        )
      ),
      args=(Ints((2, 6), high=13),),
    ),
    second=Setting(
      dict(
        config=_wmt(
          vocab_size=17,
          emb_dim=12,
          num_heads=3,
          num_layers=2,
          qkv_dim=6,
          mlp_dim=20,
          max_len=24,
          activation=Ref("flax.linen:gelu"),
          glu=True,
          attention_temp=0.9,
          pre_ln=False,
          posemb_init=_init("normal", 0.02),
        ),
        shared_embedding=Obj("flax.linen:Embed", dict(num_embeddings=17, features=12)),
      ),
      args=(Ints((1, 7), high=17),),
    ),
  ),
  Case(
    "algoperf_wmt_decoder",
    *ALGOPERF,
    module=_WMT,
    cls="Decoder",
    kind="transformer decoder (shifted targets, self and cross attention blocks, tied logits)",
    first=Setting(
      dict(
        config=_wmt(
          vocab_size=13, emb_dim=8, num_heads=2, num_layers=1, qkv_dim=8, mlp_dim=12, max_len=16
        )
      ),
      args=(Arr((2, 6, 8)), Ints((2, 5), high=13)),
    ),
    second=Setting(
      dict(
        config=_wmt(
          vocab_size=17,
          emb_dim=12,
          num_heads=4,
          num_layers=2,
          qkv_dim=16,
          mlp_dim=20,
          max_len=24,
          activation=Ref("flax.linen:gelu"),
          glu=True,
          attention_temp=0.9,
          pre_ln=False,
          posemb_init=_init("normal", 0.02),
          kernel_init=_init("lecun_normal"),
        )
      ),
      args=(Arr((1, 7, 10)), Ints((1, 4), high=17)),
    ),
  ),
  # ---------------------------------------------- mlcommons/algorithmic-efficiency: fastmri
  Case(
    "algoperf_fastmri_conv_block",
    *ALGOPERF,
    module=_FASTMRI,
    cls="ConvBlock",
    kind="CNN block (two 3x3 convs, instance norm or layer norm by a switch, leaky relu)",
    first=Setting(
      dict(out_channels=6, dropout_rate=0.0, use_tanh=False, use_layer_norm=False),
      args=(Arr((2, 8, 8, 3)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(out_channels=10, dropout_rate=0.0, use_tanh=True, use_layer_norm=True),
      args=(Arr((1, 6, 10, 4)),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "algoperf_fastmri_transpose_conv_block",
    *ALGOPERF,
    module=_FASTMRI,
    cls="TransposeConvBlock",
    kind="resampler (2x transposed conv, instance norm, leaky relu or tanh)",
    first=Setting(
      dict(out_channels=6, use_tanh=False, use_layer_norm=False), args=(Arr((2, 4, 4, 8)),)
    ),
    second=Setting(
      dict(out_channels=10, use_tanh=True, use_layer_norm=True), args=(Arr((1, 3, 5, 12)),)
    ),
  ),
  Case(
    "algoperf_fastmri_unet",
    *ALGOPERF,
    module=_FASTMRI,
    cls="UNet",
    kind="UNet (widths doubled per level from partials, skip concatenations, reflect pads)",
    first=Setting(
      dict(num_channels=4, num_pool_layers=2, dropout_rate=0.0),
      args=(Arr((2, 16, 16)),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(num_channels=6, num_pool_layers=3, dropout_rate=0.0, use_tanh=True, use_layer_norm=True),
      args=(Arr((1, 12, 20)),),
      kwargs=dict(train=False),
    ),
  ),
  # ----------------------------------------------- mlcommons/algorithmic-efficiency: criteo
  Case(
    "algoperf_dlrm_resnet",
    *ALGOPERF,
    module=_CRITEO,
    cls="DLRMResNet",
    kind="recommender (residual bottom and top MLPs from tuple widths, one embedding table)",
    first=Setting(
      dict(
        vocab_size=50,
        num_dense_features=5,
        mlp_bottom_dims=(8, 8),
        mlp_top_dims=(12, 12, 1),
        embed_dim=4,
      ),
      args=(Ints((2, 31), high=50, dtype="float32"),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        vocab_size=70,
        num_dense_features=7,
        mlp_bottom_dims=(10, 10, 10),
        mlp_top_dims=(14, 14, 14, 1),
        embed_dim=6,
      ),
      args=(Ints((3, 33), high=70, dtype="float32"),),
      kwargs=dict(train=False),
    ),
  ),
  Case(
    "algoperf_dlrm_small",
    *ALGOPERF,
    module=_CRITEO,
    cls="DlrmSmall",
    kind="recommender (DLRM: bottom MLP, embedding table, dot interactions, top MLP)",
    first=Setting(
      dict(
        vocab_size=50,
        num_dense_features=5,
        mlp_bottom_dims=(8, 4),
        mlp_top_dims=(12, 6, 1),
        embed_dim=4,
      ),
      args=(Ints((2, 31), high=50, dtype="float32"),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        vocab_size=70,
        num_dense_features=7,
        mlp_bottom_dims=(10, 8, 12),
        mlp_top_dims=(16, 10, 6, 2),
        embed_dim=6,
        use_layer_norm=True,
        embedding_init_multiplier=0.5,
      ),
      args=(Ints((3, 33), high=70, dtype="float32"),),
      kwargs=dict(train=False),
    ),
  ),
  # ------------------------------------------------- mlcommons/algorithmic-efficiency: ogbg
  Case(
    "algoperf_ogbg_gnn",
    *ALGOPERF,
    module=_OGBG,
    cls="GNN",
    kind="GNN (jraph graph network: embedders, message-passing MLPs, a global decoder)",
    first=Setting(
      dict(
        num_outputs=3, latent_dim=8, hidden_dims=(6,), dropout_rate=0.0, num_message_passing_steps=1
      ),
      args=(_graph([3, 2], [0, 1, 2, 3, 4], [1, 2, 0, 4, 3], 5, 4),),
      kwargs=dict(train=False),
    ),
    second=Setting(
      dict(
        num_outputs=4,
        latent_dim=10,
        hidden_dims=(12, 7),
        dropout_rate=0.0,
        num_message_passing_steps=2,
        activation_fn_name="gelu",
      ),
      args=(_graph([2, 3, 2], [0, 1, 2, 3, 4, 5, 6], [1, 0, 3, 4, 2, 6, 5], 6, 3),),
      kwargs=dict(train=False),
    ),
  ),
  # ---------------------------------------------------------------- google/init2winit
  Case(
    "init2winit_scalar_multiply",
    *INIT2WINIT,
    module="init2winit.model_lib.model_utils",
    cls="ScalarMultiply",
    kind="layer (one learned scalar; its initializer a field)",
    first=Setting(dict(), args=(Arr((2, 5)),)),
    second=Setting(dict(scale_init=_init("constant", 0.5)), args=(Arr((1, 3, 7)),)),
  ),
  Case(
    "init2winit_virtual_batch_norm",
    *INIT2WINIT,
    module="init2winit.model_lib.normalization",
    cls="VirtualBatchNorm",
    kind="norm (batch norm over virtual sub-batches, read from running statistics)",
    first=Setting(dict(use_running_average=True), args=(Arr((4, 3, 5)),)),
    second=Setting(
      dict(
        use_running_average=True,
        epsilon=1e-3,
        use_bias=False,
        scale_init=_init("constant", 1.5),
        batch_size=6,
        virtual_batch_size=3,
      ),
      args=(Arr((6, 7)),),
    ),
  ),
  Case(
    "init2winit_bi_dense",
    *INIT2WINIT,
    module=_BINARIZE,
    cls="BiDense",
    kind="projection (Dense whose kernel and inputs are binarized by ConfigDict hparams)",
    first=Setting(
      dict(features=6, weight_bin_hparams=_bin(None, 2**-7)),
      args=(Arr((2, 5, 4)),),
    ),
    second=Setting(
      dict(
        features=9,
        use_bias=False,
        weight_bin_hparams=_bin(None, 2**-6, "auto"),
        inputs_bin_hparams=_bin(None, 2**-5, "auto"),
      ),
      args=(Arr((1, 3, 7)),),
    ),
  ),
  Case(
    "init2winit_bi_dense_general",
    *INIT2WINIT,
    module=_BINARIZE,
    cls="BiDenseGeneral",
    kind="projection (DenseGeneral over several axes, kernel binarized by hparams)",
    first=Setting(
      dict(features=(2, 3), weight_bin_hparams=_bin(None, 2**-7)),
      args=(Arr((2, 5, 4)),),
    ),
    second=Setting(
      dict(
        features=(3, 5),
        axis=(-2, -1),
        use_bias=False,
        weight_bin_hparams=_bin(None, 2**-6),
      ),
      args=(Arr((1, 4, 2, 6)),),
    ),
  ),
  Case(
    "init2winit_bi_attention",
    *INIT2WINIT,
    module=_BINARIZE,
    cls="MultiHeadDotProductAttention",
    kind="attention (binarized projections chosen by a context dataclass of flags)",
    first=Setting(
      dict(
        num_heads=2,
        qkv_features=8,
        out_features=8,
        binarize_hparams=Obj(
          "ml_collections:ConfigDict", args=(dict(w_hparams=_bin(None, 2**-7), a_hparams=None),)
        ),
        dynamic_context=Obj(f"{_BINARIZE}:DynamicContext", dict(quant_att_weights=True)),
      ),
      args=(Arr((2, 5, 6)), Arr((2, 4, 7))),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(
        num_heads=3,
        qkv_features=12,
        out_features=12,
        use_bias=False,
        binarize_hparams=Obj(
          "ml_collections:ConfigDict",
          args=(dict(w_hparams=_bin(None, 2**-6), a_hparams=_bin(None, 2**-5)),),
        ),
        dynamic_context=Obj(
          f"{_BINARIZE}:DynamicContext",
          dict(quant_att_weights=True, quant_att_out_acts=True, quant_att_kqv_acts=True),
        ),
      ),
      args=(Arr((1, 3, 9)), Arr((1, 6, 9))),
      kwargs=dict(deterministic=True),
    ),
  ),
  Case(
    "init2winit_lstm",
    *INIT2WINIT,
    module="init2winit.model_lib.lstm",
    cls="LSTM",
    kind="recurrent (stacked LSTM cells from tuple widths; bidirectional, residual switches)",
    first=Setting(
      dict(hidden_sizes=(6, 8)),
      args=(Arr((2, 5, 4)), Ints((2,), high=6, low=1)),
      kwargs=dict(deterministic=True),
    ),
    second=Setting(
      dict(hidden_sizes=(5, 5, 5), bidirectional=True, residual_connections=True),
      args=(Arr((1, 7, 10)), Ints((1,), high=8, low=1)),
      kwargs=dict(deterministic=True),
    ),
  ),
  # ------------------------------------------------------------------------ google/brax
  Case(
    "brax_mlp",
    *BRAX,
    module="brax.training.networks",
    cls="MLP",
    kind="MLP (named Dense layers from tuple widths; activation and initializer as fields)",
    first=Setting(dict(layer_sizes=(8, 6, 3)), args=(Arr((2, 5)),)),
    second=Setting(
      dict(
        layer_sizes=(10, 12, 7, 4),
        activation=Ref("flax.linen:tanh"),
        kernel_init=_init("orthogonal"),
        activate_final=True,
        bias=False,
      ),
      args=(Arr((3, 9)),),
    ),
  ),
]

_BY_NAME = by_name(HOLDOUT_H)


def names() -> list[str]:
  return [c.name for c in HOLDOUT_H]


def case(name: str) -> Case:
  return _BY_NAME[name]
