"""Draft every Flax `...Module` class of HF transformers (4.57.1) and count the equal ports.

Each `nn.Module` subclass named `Flax...Module` in a `transformers.models.*.modeling_flax_*`
module (heads included) is built from its model's config class with small sizes (hidden 32,
2 layers, 4 heads, vocab 99), drafted on a call whose inputs are made from its `__call__`'s
parameter names, and measured by `measure.py` (sample, then a second configuration: hidden
42, 3 heads, 3 layers, other intermediate / vocab / positions). A class whose required inputs
cannot be made from their names, or whose config cannot be made small, is "no sample": it
stays in the denominator and is listed.

    python tools/measure_drafting/enumerate_hf.py --list            # the classes
    nice -n 19 python tools/measure_drafting/enumerate_hf.py --jobs 1 --timeout 900 \\
        --out /tmp/hf [--only bert.FlaxBertForMaskedLMModule] [--limit 20]
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import sys
import typing as tp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cases import Arr, Case, Ints, Obj, Ones, Positions, Setting

VERSION = "4.57.1"
NO_SAMPLE = "no sample"

# Config attributes set when the model's config has them: (first, second). Every width of
# the second differs from the first and from every other width of the second.
SIZES: dict[str, tuple[int, int]] = {}
for _names, _pair in (
  (
    ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "hidden_dim", "word_embed_proj_dim"),
    (32, 42),
  ),
  (
    (
      "num_hidden_layers",
      "num_layers",
      "n_layer",
      "n_layers",
      "encoder_layers",
      "decoder_layers",
      "num_decoder_layers",
    ),
    (2, 3),
  ),
  (
    (
      "num_attention_heads",
      "n_head",
      "n_heads",
      "encoder_attention_heads",
      "decoder_attention_heads",
      "num_heads",
    ),
    (4, 3),
  ),
  (("num_key_value_heads",), (2, 1)),
  (
    (
      "intermediate_size",
      "d_ff",
      "ffn_dim",
      "encoder_ffn_dim",
      "decoder_ffn_dim",
      "n_inner",
      "hidden_dim_ff",
    ),
    (37, 50),
  ),
  (("d_kv", "head_dim"), (8, 14)),
  (("vocab_size",), (99, 103)),
  (
    ("max_position_embeddings", "n_positions", "max_target_positions", "max_source_positions"),
    (64, 72),
  ),
  (("embedding_size",), (16, 20)),
  (("projection_dim",), (24, 28)),
  (("num_labels",), (3, 5)),
  (("image_size",), (32, 30)),
  (("patch_size",), (8, 5)),
  (("num_mel_bins",), (10, 12)),
  (("relative_attention_num_buckets",), (8, 10)),
  (("attention_window",), (4, 6)),
):
  for _name in _names:
    SIZES[_name] = _pair
# Settings that must not stay at a large default (list-valued widths of CNNs).
LISTS: dict[str, tuple[list[int], list[int]]] = {
  "hidden_sizes": ([8, 16], [10, 18]),
  "depths": ([1, 1], [1, 2]),
}
FIXED = {
  "hidden_dropout_prob": 0.0,
  "attention_probs_dropout_prob": 0.0,
  "dropout": 0.0,
  "attention_dropout": 0.0,
  "activation_dropout": 0.0,
  "resid_pdrop": 0.0,
  "embd_pdrop": 0.0,
  "attn_pdrop": 0.0,
  "dropout_rate": 0.0,
  "hidden_dropout": 0.0,
  "classifier_dropout": 0.0,
  "layerdrop": 0.0,
  "encoder_layerdrop": 0.0,
  "decoder_layerdrop": 0.0,
  "summary_first_dropout": 0.0,
  "use_cache": False,
}
SUBCONFIGS = ("text_config", "vision_config", "encoder", "decoder")
BATCH_TOKENS = ((2, 7), (3, 9))
MAIN_INPUTS = (
  "input_ids",
  "pixel_values",
  "input_features",
  "input_values",
  "attention_mask",
  "decoder_input_ids",
  "decoder_attention_mask",
  "token_type_ids",
  "position_ids",
  "decoder_position_ids",
)


def _flax_modules() -> list[str]:
  import transformers.models as models

  found = []
  for info in pkgutil.iter_modules(models.__path__):
    folder = os.path.join(models.__path__[0], info.name)
    for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
      if file.startswith("modeling_flax_") and file.endswith(".py"):
        found.append(f"transformers.models.{info.name}.{file[:-3]}")
  return found


def _module_classes(module: tp.Any) -> list[str]:
  import flax.linen as nn

  return sorted(
    name
    for name, obj in vars(module).items()
    if inspect.isclass(obj)
    and issubclass(obj, nn.Module)
    and name.startswith("Flax")
    and name.endswith("Module")
    and obj.__module__ == module.__name__
  )


def names() -> list[str]:
  """Every `model.ClassModule` (model folder, class name), in a fixed order."""
  out = []
  for module_name in _flax_modules():
    try:
      module = importlib.import_module(module_name)
    except Exception:
      continue
    folder = module_name.split(".")[2]
    out.extend(f"{folder}.{cls}" for cls in _module_classes(module))
  return out


def _config_class(module: tp.Any, cls_name: str) -> tp.Any:
  """The config class of the pretrained model whose `module_class` is this class."""
  from transformers.modeling_flax_utils import FlaxPreTrainedModel

  target = getattr(module, cls_name)
  for obj in vars(module).values():
    if (
      inspect.isclass(obj)
      and issubclass(obj, FlaxPreTrainedModel)
      and getattr(obj, "module_class", None) is target
    ):
      return obj.config_class
  for obj in vars(module).values():  # a module used inside another: its family's config
    if inspect.isclass(obj) and issubclass(obj, FlaxPreTrainedModel) and obj.config_class:
      return obj.config_class
  raise LookupError(f"no FlaxPreTrainedModel of {module.__name__} names a config class")


def _config_kwargs(config_cls: tp.Any, which: int) -> dict[str, tp.Any]:
  default = config_cls().to_dict()
  kwargs: dict[str, tp.Any] = {}
  for key, value in default.items():
    if key in SIZES and isinstance(value, int) and not isinstance(value, bool):
      kwargs[key] = SIZES[key][which]
    elif key in LISTS and isinstance(value, list):
      kwargs[key] = LISTS[key][which]
    elif key in FIXED:
      kwargs[key] = FIXED[key]
    elif key in SUBCONFIGS and isinstance(value, dict):
      sub_cls = getattr(config_cls, "sub_configs", {}).get(key)
      if sub_cls is not None:
        kwargs[key] = _config_kwargs(sub_cls, which)
  return kwargs


def _inputs(fn: tp.Any, config_kwargs: dict[str, tp.Any], which: int) -> tuple[tuple, dict]:
  """Arguments for the call from its parameter names; LookupError when one cannot be made."""
  batch, tokens = BATCH_TOKENS[which]
  vocab = config_kwargs.get("vocab_size", SIZES["vocab_size"][which])
  image = config_kwargs.get("image_size", SIZES["image_size"][which])
  width = next(
    (config_kwargs[k] for k in ("hidden_size", "d_model", "n_embd") if k in config_kwargs), 32
  )
  max_source = config_kwargs.get("max_source_positions", SIZES["max_source_positions"][which])
  made: dict[str, tp.Any] = {
    "input_ids": Ints((batch, tokens), vocab, low=3),
    "decoder_input_ids": Ints((batch, tokens - 2), vocab, low=3),
    "attention_mask": Ones((batch, tokens)),
    "decoder_attention_mask": Ones((batch, tokens - 2)),
    "token_type_ids": Ints((batch, tokens), 1),
    "position_ids": Positions((batch, tokens)),
    "decoder_position_ids": Positions((batch, tokens - 2)),
    "pixel_values": Arr((batch, image, image, 3)),
    "inputs_embeds": Arr((batch, tokens, width)),
    "hidden_states": Arr((batch, tokens, width)),
    "input_features": Arr((batch, config_kwargs.get("num_mel_bins", 10), 2 * max_source)),
    "input_values": Arr((batch, 800 + 160 * which)),
    "head_mask": None,
    "decoder_head_mask": None,
    "cross_attn_head_mask": None,
    "encoder_hidden_states": None,
    "encoder_attention_mask": None,
    "past_key_values": None,
  }
  args: list[tp.Any] = []
  kwargs: dict[str, tp.Any] = {}
  for name, param in list(inspect.signature(fn).parameters.items())[1:]:
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
      continue
    if name == "deterministic":
      kwargs[name] = True
      continue
    if param.default is not param.empty:
      # HF modules default even their main inputs to None: those are passed all the same.
      if name in MAIN_INPUTS and param.default is None:
        kwargs[name] = made[name]
      continue
    if name not in made:
      raise LookupError(f"{NO_SAMPLE}: no input for the required parameter {name!r}")
    args.append(made[name])
  return tuple(args), kwargs


def case(name: str) -> Case:
  """The measured case of `model.ClassModule`; LookupError ('no sample: ...') when none."""
  folder, cls_name = name.split(".", 1)
  module_name = next(m for m in _flax_modules() if m.split(".")[2] == folder)
  module = importlib.import_module(module_name)
  config_cls = _config_class(module, cls_name)
  settings = []
  for which in (0, 1):
    config_kwargs = _config_kwargs(config_cls, which)
    args, kwargs = _inputs(getattr(module, cls_name).__call__, config_kwargs, which)
    config = Obj(f"{config_cls.__module__}:{config_cls.__name__}", config_kwargs)
    settings.append(Setting(dict(config=config), args=args, kwargs=kwargs))
  return Case(
    name,
    "",
    "",
    module=module_name,
    cls=cls_name,
    first=settings[0],
    second=settings[1],
    kind="HF Flax module",
    version=VERSION,
  )


def main() -> int:
  import measure

  argv = sys.argv[1:]
  if "--list" in argv:
    for n in names():
      print(n)
    return 0
  limit = None
  if "--limit" in argv:
    i = argv.index("--limit")
    limit = int(argv[i + 1])
    del argv[i : i + 2]
  if limit is not None and "--only" not in argv:
    argv += ["--only", ",".join(names()[:limit])]
  return measure.main(argv, default_cases="enumerate_hf")


if __name__ == "__main__":
  sys.exit(main())
