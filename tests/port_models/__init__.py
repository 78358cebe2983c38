"""Linen models shaped like real families, for drafting their NNX ports (`lb.port.draft`).

Each module holds plain Linen code (flax, jax and numpy only) written the way code of its family
is written, small enough for fast tests, and exposes:

- `model`: the module instance to port;
- `sample_args()` and `SAMPLE_KWARGS`: its sample call;
- `EXTRA_CALLS`: further calls to check, `(method, args_factory, kwargs)` (method None for
  `__call__`); empty when there are none.

`ZOO` lists them; `todo_map_variables` holds a construct no drafting can translate.
"""

ZOO = (
  "mlp_dropout",
  "setup_style",
  "resnet_cnn",
  "vae",
  "lstm_classifier",
  "transformer_lm",
  "transformer_lm_decode",
  "encoder_decoder",
  "vit",
  "seed_sow_scan",
  "partitioned",
  "conv_autoencoder",
  "t5_block",
  "ensemble_vmap",
  "unet_diffusion",
)
