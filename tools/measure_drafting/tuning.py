"""The TUNING set: classes of the sources the drafter is built on, in the holdout's format.

flax's examples and HF transformers' Flax classes (transformers==4.57.1 installed, no
checkout). The drafter may be run on these at any time; their count is reported beside the
holdout's. Run it with this file (the same options as `measure.py`):

    python tools/measure_drafting/tuning.py --checkouts DIR --out /tmp/tuning
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cases import Arr, Case, Ints, Obj, Ones, Ref, Setting, by_name

FLAX = ("google/flax", "18f8f311c275d57f46d95e41b15aa97b454754c0")
TRANSFORMERS = "4.57.1"


def _partial(target: str, **kw: object) -> Obj:
  return Obj("functools:partial", kw, args=(Ref(target),))


def _lm1b_config(**kw: object) -> Obj:
  base = dict(
    vocab_size=11,
    output_vocab_size=11,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    deterministic=True,
  )
  return Obj("models:TransformerConfig", {**base, **kw})


def _hf(model: str, config_cls: str, **kw: object) -> Obj:
  return Obj(f"transformers.models.{model}:{config_cls}", kw)


TUNING: list[Case] = [
  Case(
    "fx_resnet_block",
    *FLAX,
    module="models",
    cls="ResNetBlock",
    path="examples/imagenet",
    kind="CNN block (partial conv / norm fields)",
    first=Setting(
      dict(
        filters=6,
        conv=_partial("flax.linen:Conv", use_bias=False),
        norm=_partial("flax.linen:BatchNorm", use_running_average=True),
        act=Ref("flax.linen:relu"),
      ),
      args=(Arr((2, 8, 8, 4)),),
    ),
    second=Setting(
      dict(
        filters=9,
        strides=(2, 2),
        conv=_partial("flax.linen:Conv", use_bias=False),
        norm=_partial("flax.linen:BatchNorm", use_running_average=True),
        act=Ref("flax.linen:relu"),
      ),
      args=(Arr((3, 10, 10, 5)),),
    ),
  ),
  Case(
    "fx_bottleneck",
    *FLAX,
    module="models",
    cls="BottleneckResNetBlock",
    path="examples/imagenet",
    kind="CNN bottleneck block",
    first=Setting(
      dict(
        filters=4,
        conv=_partial("flax.linen:Conv", use_bias=False),
        norm=_partial("flax.linen:BatchNorm", use_running_average=True),
        act=Ref("flax.linen:relu"),
      ),
      args=(Arr((2, 8, 8, 6)),),
    ),
    second=Setting(
      dict(
        filters=5,
        strides=(2, 2),
        conv=_partial("flax.linen:Conv", use_bias=False),
        norm=_partial("flax.linen:BatchNorm", use_running_average=True),
        act=Ref("flax.linen:relu"),
      ),
      args=(Arr((3, 6, 6, 7)),),
    ),
  ),
  Case(
    "fx_lm1b_mlp",
    *FLAX,
    module="models",
    cls="MlpBlock",
    path="examples/lm1b",
    kind="MLP (flax.struct config)",
    first=Setting(dict(config=_lm1b_config(emb_dim=8, mlp_dim=12)), args=(Arr((2, 5, 8)),)),
    second=Setting(
      dict(config=_lm1b_config(emb_dim=10, mlp_dim=14), out_dim=6), args=(Arr((3, 7, 10)),)
    ),
  ),
  Case(
    "fx_lm1b_block",
    *FLAX,
    module="models",
    cls="EncoderDecoder1DBlock",
    path="examples/lm1b",
    kind="transformer block (flax.struct config)",
    first=Setting(
      dict(config=_lm1b_config(emb_dim=8, qkv_dim=8, num_heads=2, mlp_dim=12)),
      args=(Arr((2, 5, 8)),),
    ),
    second=Setting(
      dict(config=_lm1b_config(emb_dim=12, qkv_dim=15, num_heads=3, mlp_dim=14)),
      args=(Arr((3, 7, 12)),),
    ),
  ),
  Case(
    "fx_sst2_classifier",
    *FLAX,
    module="models",
    cls="TextClassifier",
    path="examples/sst2",
    kind="whole model (embedding, bi-LSTM, attention, MLP)",
    first=Setting(
      dict(
        embedding_size=6,
        hidden_size=6,
        vocab_size=13,
        output_size=3,
        dropout_rate=0.0,
        word_dropout_rate=0.0,
        deterministic=True,
      ),
      args=(Ints((2, 5), high=13), Obj("jax.numpy:array", args=([5, 3],))),
    ),
    second=Setting(
      dict(
        embedding_size=8,
        hidden_size=10,
        vocab_size=17,
        output_size=4,
        dropout_rate=0.0,
        word_dropout_rate=0.0,
        deterministic=True,
      ),
      args=(Ints((3, 7), high=17), Obj("jax.numpy:array", args=([7, 2, 5],))),
    ),
  ),
  Case(
    "hf_bert_layer",
    "",
    "",
    module="transformers.models.bert.modeling_flax_bert",
    cls="FlaxBertLayer",
    version=TRANSFORMERS,
    kind="HF transformer layer",
    first=Setting(
      dict(
        config=_hf(
          "bert",
          "BertConfig",
          hidden_size=12,
          num_attention_heads=3,
          intermediate_size=20,
          hidden_dropout_prob=0.0,
          attention_probs_dropout_prob=0.0,
        )
      ),
      args=(Arr((2, 5, 12)), Ones((2, 5)), None),
    ),
    second=Setting(
      dict(
        config=_hf(
          "bert",
          "BertConfig",
          hidden_size=14,
          num_attention_heads=2,
          intermediate_size=26,
          hidden_dropout_prob=0.0,
          attention_probs_dropout_prob=0.0,
          hidden_act="relu",
        )
      ),
      args=(Arr((3, 7, 14)), Ones((3, 7)), None),
    ),
  ),
  Case(
    "hf_gpt2_block",
    "",
    "",
    module="transformers.models.gpt2.modeling_flax_gpt2",
    cls="FlaxGPT2Block",
    version=TRANSFORMERS,
    kind="HF transformer block (Conv1D-style kernels, causal mask)",
    first=Setting(
      dict(
        config=_hf(
          "gpt2",
          "GPT2Config",
          n_embd=12,
          n_head=3,
          n_positions=16,
          n_inner=20,
          resid_pdrop=0.0,
          attn_pdrop=0.0,
          embd_pdrop=0.0,
        )
      ),
      args=(Arr((2, 5, 12)),),
    ),
    second=Setting(
      dict(
        config=_hf(
          "gpt2",
          "GPT2Config",
          n_embd=14,
          n_head=2,
          n_positions=24,
          n_inner=26,
          resid_pdrop=0.0,
          attn_pdrop=0.0,
          embd_pdrop=0.0,
        )
      ),
      args=(Arr((3, 7, 14)),),
    ),
  ),
  Case(
    "hf_roberta_cls",
    "",
    "",
    module="transformers.models.roberta.modeling_flax_roberta",
    cls="FlaxRobertaForSequenceClassificationModule",
    version=TRANSFORMERS,
    kind="HF whole model with head",
    first=Setting(
      dict(
        config=_hf(
          "roberta",
          "RobertaConfig",
          vocab_size=40,
          hidden_size=12,
          num_hidden_layers=2,
          num_attention_heads=3,
          intermediate_size=20,
          max_position_embeddings=20,
          num_labels=3,
          hidden_dropout_prob=0.0,
          attention_probs_dropout_prob=0.0,
        )
      ),
      args=(Ints((2, 5), 40, low=3), Ones((2, 5)), Ones((2, 5)), Ints((2, 5), 4, low=2), None),
    ),
    second=Setting(
      dict(
        config=_hf(
          "roberta",
          "RobertaConfig",
          vocab_size=50,
          hidden_size=16,
          num_hidden_layers=3,
          num_attention_heads=4,
          intermediate_size=26,
          max_position_embeddings=24,
          num_labels=5,
          hidden_dropout_prob=0.0,
          attention_probs_dropout_prob=0.0,
        )
      ),
      args=(Ints((3, 7), 50, low=3), Ones((3, 7)), Ones((3, 7)), Ints((3, 7), 9, low=2), None),
    ),
  ),
]

_BY_NAME = by_name(TUNING)


def names() -> list[str]:
  return [c.name for c in TUNING]


def case(name: str) -> Case:
  return _BY_NAME[name]


if __name__ == "__main__":
  import measure

  sys.exit(measure.main(default_cases="tuning"))
