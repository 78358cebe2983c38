"""Drafting defects, each on a small Linen model written as real code writes it
(`item_fix_models.py`), checked against Linen's own apply on both flax ends."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

pytest.importorskip("libcst")

import item_fix_models as models


def _normal(seed, *shape):
  return jax.random.normal(jax.random.key(seed), shape)


def _close(got, want, tol=1e-5):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=tol, atol=tol), got, want)


# --- silently wrong before: the port must follow what Linen follows -------------------------


def test_a_module_setting_rebound_after_import_is_followed_by_the_port(monkeypatch):
  x = _normal(0, 2, 4)
  draft = lb.port.draft(models.ScaledByGlobal(), x)
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  monkeypatch.setattr(models, "SCALE", 5.0)  # a config applied at startup
  _close(port(x), models.ScaledByGlobal().apply(variables, x))
  assert "item_fix_models.SCALE" in draft.source


@pytest.mark.parametrize("split", [False, True])
def test_a_scanned_stack_starts_from_the_draws_linen_gives_its_layers(split):
  """split_rngs={'params': False}: Linen's fresh layers are identical; so are the port's.
  Split: both give each layer its own."""
  x = jnp.ones((2, 8))
  model = models.ScanSplitInit() if split else models.ScanSameInit()
  kernel = model.init(jax.random.key(0), x)["params"]["s"]["Dense_0"]["kernel"]
  draft = lb.port.draft(model, x)
  assert draft.ok, draft.report()
  fresh = np.asarray(draft.build(rngs=nnx.Rngs(0)).s.Dense_0.kernel[...])
  linen_same = bool(np.all(kernel[0] == kernel[1]))
  assert linen_same is (not split)
  assert bool(np.all(fresh[0] == fresh[1])) is linen_same
  assert bool(np.all(fresh[1] == fresh[2])) is linen_same


def test_a_layer_setting_read_from_a_call_argument_follows_every_call():
  x = _normal(0, 2, 4) * 0.01
  draft = lb.port.draft(models.EpsFromCall(), x)
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  x2 = _normal(1, 3, 4) * 0.01
  for eps in (1e-2, 1e-6, 0.5):
    _close(port(x2, eps=eps), models.EpsFromCall().apply(variables, x2, eps=eps))


@pytest.mark.parametrize("width", [3, 6])
def test_a_dtype_read_from_the_input_follows_the_input(width):
  model = models.DtypeFromInput(width=width)
  draft = lb.port.draft(model, _normal(0, 2, 4))
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  x16 = _normal(1, 2, 4).astype(jnp.bfloat16)
  got, want = port(x16), model.apply(variables, x16)
  assert got.dtype == want.dtype == jnp.bfloat16
  _close(got.astype(jnp.float32), want.astype(jnp.float32), tol=1e-2)


def test_reduction_axes_read_from_the_input_rank_follow_the_rank():
  draft = lb.port.draft(models.ReductionFromRank(), _normal(0, 2, 3, 4))
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  x4 = _normal(1, 2, 5, 3, 4)
  _close(port(x4), models.ReductionFromRank().apply(variables, x4))


@pytest.mark.parametrize("width", [4, 8])
def test_padding_chosen_by_a_call_flag_follows_the_flag(width):
  model = models.PaddingFromFlag(width=width)
  x = _normal(0, 2, 7, 3)
  draft = lb.port.draft(model, x)
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  for same in (False, True):
    got, want = port(x, same=same), model.apply(variables, x, same=same)
    assert got.shape == want.shape
    _close(got, want)


def test_batch_norm_momentum_read_from_the_call_updates_the_statistics_as_linen():
  x = _normal(0, 4, 3)
  draft = lb.port.draft(models.MomentumFromCall(), x)
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  x2 = _normal(1, 4, 3) + 2.0
  out, updates = models.MomentumFromCall().apply(
    variables, x2, train=True, momentum=0.5, mutable=["batch_stats"]
  )
  _close(port(x2, train=True, momentum=0.5), out)
  _close(port.BatchNorm_0.mean[...], updates["batch_stats"]["BatchNorm_0"]["mean"])


# --- ports that failed with no TODO: drafted equal now, or one TODO saying what to do -------


@pytest.mark.parametrize("width", [3, 5])
def test_self_name_read_in_the_computation_keeps_linens_name(width):
  model = models.ChoosesByName(width=width)
  x = _normal(0, 2, 4)
  draft = lb.port.draft(model, x)
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  _close(port(x), model.apply(variables, x))
  assert port.encoder.name == "encoder" and port.decoder.name == "decoder"


def test_with_partitioning_becomes_nnx_with_partitioning_with_the_same_axes():
  x = _normal(0, 2, 4)
  draft = lb.port.draft(models.PartitionedDense(), x)
  assert draft.ok, draft.report()
  assert "nnx.with_partitioning(" in draft.source
  port, variables = draft.port_and_variables()
  _close(port(x), models.PartitionedDense().apply(variables, x))
  spec = nnx.get_partition_spec(nnx.state(port))
  is_spec = lambda v: isinstance(v, jax.sharding.PartitionSpec)  # noqa: E731
  (kernel,) = jax.tree.leaves(spec["Dense_0"]["kernel"], is_leaf=is_spec)
  assert tuple(kernel) == (None, "model")


def test_a_subclass_of_a_user_linen_class_is_one_todo_naming_the_base():
  draft = lb.port.draft(models.ScaledChild(), jnp.ones((2, 3)))  # no raw exception
  assert not draft.ok
  (todo,) = draft.todos
  assert "subclasses the Linen class DenseBase" in todo.reason
  assert "Write the port by hand" in todo.reason
  compile(draft.source, "port.py", "exec")


@pytest.mark.parametrize("width", [5, 7])
def test_a_gru_cell_steps_and_runs_under_nnx_rnn(width):
  x = _normal(0, 2, 3, 4)
  for model, args in ((models.GruStep(width=width), (x[:, 0],)), (models.GruSequence(width), (x,))):
    draft = lb.port.draft(model, *args)
    assert draft.ok, draft.report()
    port, variables = draft.port_and_variables()
    _close(port(*args), model.apply(variables, *args))


@pytest.mark.parametrize("width", [6, 3])
def test_a_cells_initialize_carry_through_a_local_takes_nnx_argument_order(width):
  model = models.LstmByHand(width=width)
  x = _normal(0, 2, 3, 4)
  draft = lb.port.draft(model, x)
  assert draft.ok, draft.report()
  port, variables = draft.port_and_variables()
  _close(port(x), model.apply(variables, x))


@pytest.mark.parametrize("shape", [(2, 3, 4), (4, 5, 2)])
def test_normalization_over_two_feature_axes_holds_the_whole_feature_shape(shape):
  x = _normal(0, *shape)
  for model in (models.NormOverTwoAxes(), models.FrozenBatchNormOverTwoAxes()):
    draft = lb.port.draft(model, x)
    assert draft.ok, draft.report()
    port, variables = draft.port_and_variables()
    _close(port(x), model.apply(variables, x))


def test_batch_norm_over_two_axes_that_may_train_is_a_todo():
  """NNX's BatchNorm cannot update flat statistics with (3, 4)-shaped batch ones."""
  draft = lb.port.draft(models.BatchNormOverTwoAxes(), _normal(0, 4, 3, 2))
  assert not draft.ok
  (todo,) = draft.todos
  assert "nn.BatchNorm over several axes" in todo.reason


def test_a_layer_loop_over_a_list_the_call_fills_is_a_todo_naming_the_loop():
  """A UNet's up path loops over the skips its down path appended: no layer is built from
  the empty list `__init__` would see."""
  import inspect

  draft = lb.port.draft(models.UNetish(), _normal(0, 2, 3))
  assert not draft.ok
  (todo,) = draft.todos
  lines, first = inspect.getsourcelines(models.UNetish)
  loop = first + next(i for i, ln in enumerate(lines) if "for s in reversed(skips)" in ln)
  assert todo.line == loop + 1  # the construction inside the loop
  assert "a list the call fills" in todo.reason
  assert "skips = []" not in draft.source.split("def __init__")[1].split("def __call__")[0]


def _port_at(draft, model, args, **sizes):
  """The drafted port built with `sizes` (its input-width arguments), holding Linen's own init
  at `args`; compared with Linen's `apply` there, an input width the draft never saw."""
  import types

  module = types.ModuleType("drafted_port")
  exec(compile(draft.source, "drafted_port.py", "exec"), module.__dict__)
  port = getattr(module, draft.root)(**{**draft.init_kwargs, **sizes}, rngs=nnx.Rngs(0))
  variables = model.init(jax.random.key(3), *args)
  lb.checkpoint.linen_to_nnx(model, variables, port, *args)
  _close(port(*args), model.apply(variables, *args))


@pytest.mark.parametrize(("heads", "width"), [(2, 4), (4, 8)])
def test_self_attention_with_a_positional_mask_is_built_at_the_inputs_width(heads, width):
  """The attention's input width is the root's `x_features` argument (a symbol in the trace,
  as a multiple of its size, which the heads divide), not the sample's number."""
  model = models.SelfAttentionMasked(heads=heads)
  x = _normal(0, 2, 3, width)
  mask = jnp.tril(jnp.ones((2, 1, 3, 3), bool))
  draft = lb.port.draft(model, x, mask)
  assert draft.ok, draft.report()
  assert draft.init_kwargs == {"heads": heads, "x_features": width}
  assert "in_kv_features" not in draft.source
  assert "an input of another size" in draft.report()
  port, variables = draft.port_and_variables()
  _close(port(x, mask), model.apply(variables, x, mask))
  other = 3 * width  # a width the heads divide, that the sample did not have
  _port_at(draft, model, (_normal(4, 2, 5, other), jnp.ones((2, 1, 5, 5), bool)), x_features=other)


def test_cross_attention_from_a_wider_key_value_input():
  """Built with in_kv_features where NNX has it; a TODO naming the width where it has not."""
  q, kv = _normal(1, 2, 3, 4), _normal(2, 2, 5, 6)
  draft = lb.port.draft(models.CrossAttention(), q, kv)
  import inspect

  if "in_kv_features" in inspect.signature(nnx.MultiHeadAttention.__init__).parameters:
    assert draft.ok, draft.report()
    assert draft.init_kwargs == {"q_features": 4, "kv_features": 6}
    port, variables = draft.port_and_variables()
    _close(port(q, kv), models.CrossAttention().apply(variables, q, kv))
    args = (_normal(5, 2, 3, 7), _normal(6, 2, 4, 9))
    _port_at(draft, models.CrossAttention(), args, q_features=7, kv_features=9)
  else:
    assert not draft.ok
    (todo,) = draft.todos
    assert "in_kv_features=6" in todo.reason


@pytest.mark.parametrize("width", [6, 10])
def test_make_rng_handed_to_a_function_draws_from_the_ports_rngs_big_vision(width):
  """`_drop_path_mask(x, p, not train, self.make_rng)`: the port hands on a function drawing
  the named stream from its nnx.Rngs. Deterministic, it is Linen's output; training, each
  example is either dropped (the input) or kept (the deterministic output), as in Linen."""
  model = models.StochasticDepthBlock(width=width)
  x = _normal(0, 8, 3, 4)
  draft = lb.port.draft(model, x)
  assert draft.ok, draft.report()
  assert "(lambda name: self.rngs[name]())" in draft.source
  port, variables = draft.port_and_variables()
  kept = model.apply(variables, x)
  _close(port(x), kept)
  trained = np.asarray(port(x, train=True))
  dropped = np.isclose(trained, np.asarray(x), atol=1e-6).all(axis=(1, 2))
  as_kept = np.isclose(trained, np.asarray(kept), atol=1e-5).all(axis=(1, 2))
  assert (dropped | as_kept).all() and dropped.any() and as_kept.any()
