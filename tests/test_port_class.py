"""`lb.port.draft` writes a port of the class: widths are field expressions found by tracing
other configurations, input-shaped lines are kept, and the check runs beyond the sample.

The reference is Linen's own `apply` at configurations the draft never traced, with the
drafted source imported as a user would import it.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from test_port_zoo import imported_port as imported

import loopbridge as lb

from conftest import matmul_tolerance
from port_models import class_widths as cw

RTOL, ATOL = matmul_tolerance(1e-5, 1e-5)


def test_widths_are_expressions_of_the_config(tmp_path):
  """Built at a config the draft never traced, the port computes what Linen computes there
  (before: every width was the sample's literal, and the port did not build)."""
  draft = lb.port.draft(cw.model, *cw.sample_args())
  assert draft.ok, draft.report()
  module = imported(draft, tmp_path, "class_widths_nnx")
  config = cw.Config(features=24, hidden=20)
  linen = cw.Net(config)
  x = cw.sample_args()[0]
  variables = linen.init(jax.random.key(1), x)
  port = module.Net(config, rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  got, want = port(x), linen.apply(variables, x)
  assert [g.shape for g in got] == [(2, 24), (2, 5)]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_input_shaped_line_is_kept(tmp_path):
  """lm1b's `actual_out_dim = inputs.shape[-1] if self.out_dim is None else self.out_dim`:
  the drafted Mlp honours `out_dim` (before: the line was dropped and out_dim did nothing)."""
  draft = lb.port.draft(cw.model, *cw.sample_args(), check=False)
  # The report lists the line the method lost (it now runs in __init__).
  removed = [ch for ch in draft.changes if ch.new == "(removed from the method)"]
  assert [ch.old.split(" =")[0] for ch in removed] == ["actual_out_dim"]
  module = imported(draft, tmp_path, "class_widths_mlp_nnx")
  config = cw.Config()
  h = jax.random.normal(jax.random.key(2), (3, 8))
  for out_dim in (None, 7):
    linen = cw.Mlp(config, out_dim=out_dim)
    variables = linen.init(jax.random.key(3), h)
    port = module.Mlp(config, out_dim=out_dim, rngs=nnx.Rngs(0))
    lb.checkpoint.linen_to_nnx(linen, variables, port, h)
    np.testing.assert_allclose(port(h), linen.apply(variables, h), rtol=RTOL, atol=ATOL)


@pytest.mark.slow  # a draft and its check at two configurations: ~5-10 s
def test_width_no_field_matches_is_read_from_the_symbolic_trace():
  """`3 * features + 1` matches no field expression by value; the symbolic trace writes it, so
  no width is left to check where every setting is distinct."""
  draft = lb.port.draft(cw.Odd(), *cw.sample_args())
  assert draft.ok, draft.report()
  assert "3 * self.features + 1" in draft.source
  assert not draft.literals


@pytest.mark.slow  # a draft and its check at two configurations: ~5-10 s
def test_user_configs_are_traced_and_checked():
  draft = lb.port.draft(cw.model, *cw.sample_args(), configs=(cw.Net(cw.Config(16, 40)),))
  assert draft.ok, draft.report()
  assert draft.configs[0][1]["config"] == cw.Config(16, 40)
  # and the configurations where every setting is distinct (of the user's and of that one)
  assert all(label.startswith("every setting distinct") for label in draft.config_labels[1:])


def test_bad_configs_entry():
  with pytest.raises(lb.port.PortError, match="configs= must hold other instances of Net"):
    lb.port.draft(cw.model, *cw.sample_args(), configs=(cw.Odd(),), check=False)


@pytest.mark.slow  # a draft and its check at two configurations: ~5-10 s
def test_layers_frozen_by_a_literal_stay_frozen_after_train():
  """`nn.BatchNorm(use_running_average=True)`, `nn.Dropout(0.5, deterministic=True)`: after
  NNX's `port.train()` the port still computes what Linen does (before: the flags were
  constructor fields that `train()` flips, so the port used batch statistics and dropped)."""
  model = cw.Frozen()
  x = cw.sample_args()[0]
  variables = model.init(jax.random.key(0), x)
  stats = jax.tree.map(lambda v: v + 0.5, variables["batch_stats"])  # not what x gives
  variables = {**variables, "batch_stats": stats}
  draft = lb.port.draft(model, x, variables=variables)
  assert draft.ok, draft.report()
  port, _ = draft.port_and_variables()
  port.train()
  np.testing.assert_allclose(port(x), model.apply(variables, x), rtol=RTOL, atol=ATOL)


@pytest.mark.slow  # a draft and its check at two configurations: ~5-10 s
def test_default_factory_field_stays_a_factory(tmp_path):
  """The drafted class builds with its defaults and gives each instance its own list (before:
  the default was the `dataclasses.Field` object)."""
  model = cw.Widths()
  x = cw.sample_args()[0]
  draft = lb.port.draft(model, x)
  assert draft.ok, draft.report()
  module = imported(draft, tmp_path, "widths_nnx")
  port = module.Widths(rngs=nnx.Rngs(0))
  assert port.widths == [6, 4] and port.widths is not module.Widths(rngs=nnx.Rngs(1)).widths
  variables = model.init(jax.random.key(0), x)
  lb.checkpoint.linen_to_nnx(model, variables, port, x)
  np.testing.assert_allclose(port(x), model.apply(variables, x), rtol=RTOL, atol=ATOL)


@pytest.mark.slow  # a draft and its check at two configurations: ~5-10 s
def test_field_named_train_does_not_hide_nnx_train():
  """`port.train()` / `port.eval()` stay NNX's methods (before: `self.train` was the bool)."""
  model = cw.Trainable()
  x = cw.sample_args()[0]
  draft = lb.port.draft(model, x)
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  port.train()
  port.eval()
  np.testing.assert_allclose(port(x), model.apply(variables, x), rtol=RTOL, atol=ATOL)


def test_a_length_read_by_the_call_alone_is_no_constructor_argument(tmp_path):
  """lm1b's `length = inputs.shape[1]` stays in the call: the port takes no argument for it
  (before: an unread `inputs_dim1` the parent passed the sample's length 8 for), and the port
  runs what Linen runs at another length."""
  draft = lb.port.draft(cw.Embedder(cw.Config()), *cw.token_args())
  assert draft.ok, draft.report()
  assert "_dim1" not in draft.source, draft.source
  module = imported(draft, tmp_path, "class_widths_positions_nnx")
  linen = cw.Embedder(cw.Config())
  tokens = cw.token_args(length=5)[0]
  variables = linen.init(jax.random.key(5), tokens)
  port = module.Embedder(cw.Config(), rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen, variables, port, tokens)
  np.testing.assert_allclose(port(tokens), linen.apply(variables, tokens), rtol=RTOL, atol=ATOL)


def test_a_param_the_sample_never_makes_is_built_from_the_users_own_expression(tmp_path):
  """lm1b's learned position table under a config flag the sample leaves off: drafted from
  `pos_emb_shape = (1, max_len, inputs.shape[-1])` with the input width the traces show
  (before: a TODO, "arguments that depend on the call"). Built with the flag on, the port
  computes what Linen computes there."""
  draft = lb.port.draft(cw.OptionalEmbedder(cw.Config()), *cw.token_args())
  assert draft.ok, draft.report()
  module = imported(draft, tmp_path, "class_widths_optional_positions_nnx")
  config = cw.Config(features=12)  # another width than the sample's too
  linen = cw.OptionalEmbedder(config, learned=True)
  tokens = cw.token_args(length=5)[0]
  variables = linen.init(jax.random.key(6), tokens)
  port = module.OptionalEmbedder(config, learned=True, rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen, variables, port, tokens)
  np.testing.assert_allclose(port(tokens), linen.apply(variables, tokens), rtol=RTOL, atol=ATOL)
