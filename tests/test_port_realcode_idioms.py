"""Drafting the idioms of published Linen code (HF transformers, diffusers, flax's examples),
each on a small model written the way the real code writes it, checked against Linen's apply."""

import importlib.util
import inspect
import re
import typing as tp

import jax
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

pytest.importorskip("libcst")

import realcode_idioms as models

from conftest import full_precision_tolerance


def _equal_to_linen(draft, *args, **kwargs):
  """The drafted port, holding the Linen variables, computes Linen's own apply."""
  port, variables = draft.port_and_variables()
  want = draft.linen_module.apply(variables, *args, **kwargs)
  got = port(*args, **kwargs)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got, want)


def test_partial_dense_layers_assigned_in_setup_hf_attention():
  x = jax.random.normal(jax.random.key(0), (2, 3, 8))
  draft = lb.port.draft(models.PartialDenseAttention(), x)
  assert draft.ok, draft.report()
  assert "self.q_proj, self.k_proj, self.v_proj = " in draft.source
  assert draft.source.count("nnx.Linear(") == 5
  _equal_to_linen(draft, x)


def test_a_subclass_of_nn_embed_with_its_own_setup_hf_opt():
  """Its port subclasses nnx.Embed: `super().__call__` is nnx.Embed's, reading the inherited
  fields the port's `__init__` takes (their defaults written out) and the variable its setup
  makes."""
  positions = jax.numpy.arange(6).reshape(2, 3)
  draft = lb.port.draft(models.UsesOffsetEmbed(), positions)
  assert draft.ok, draft.report()
  assert "class OffsetEmbed(nnx.Embed):" in draft.source
  assert "param_dtype=jnp.float32," in draft.source
  _equal_to_linen(draft, positions)


def test_other_subclasses_of_flax_layers_are_one_todo_naming_the_class():
  ids = jax.numpy.arange(6).reshape(2, 3)
  draft = lb.port.draft(models.UsesUndraftedSubclasses(), ids)  # no raw exception
  assert not draft.ok
  reasons = {t.line: t.reason for t in draft.todos}
  assert set(reasons) == {
    inspect.getsourcelines(models.ShiftedEmbed)[1],
    inspect.getsourcelines(models.ScaledDense)[1],
  }
  embed = reasons[inspect.getsourcelines(models.ShiftedEmbed)[1]]
  assert "ShiftedEmbed subclasses flax's own layer flax.linen.linear.Embed" in embed
  assert "without a setup of its own" in embed
  dense = reasons[inspect.getsourcelines(models.ScaledDense)[1]]
  assert "ScaledDense subclasses flax's own layer flax.linen.linear.Dense" in dense
  assert "nnx.Linear" in dense
  compile(draft.source, "port.py", "exec")  # the drafted file parses


def test_a_class_whose_drafting_fails_is_one_todo_not_a_raw_exception(monkeypatch):
  """Any defect while drafting one class leaves the rest drafted and that class a TODO."""
  from loopbridge._port import draft as draft_module

  real = draft_module.port_class

  def failing_for_one_class(src, ctx):
    if src.cls is models.PartialDenseAttention:
      raise RuntimeError("a defect")
    return real(src, ctx)

  monkeypatch.setattr(draft_module, "port_class", failing_for_one_class)
  x = jax.random.normal(jax.random.key(0), (2, 3, 8))
  draft = lb.port.draft(models.PartialDenseAttention(), x)
  (todo,) = draft.todos
  assert todo.line == inspect.getsourcelines(models.PartialDenseAttention)[1]
  assert "drafting the class PartialDenseAttention failed (RuntimeError: a defect)" in todo.reason
  assert "class PartialDenseAttention(nn.Module):" in todo.original
  assert draft.check is not None and not draft.check.equal
  with pytest.raises(NotImplementedError, match="TODO"):
    draft.build()


# The setup-list tests check the idiom's translation at the user's configuration
# (`configs=()`): the input widths of a setup list's layers are still one literal per element
# (`(3, 4)[i]`), not expressions of the fields, so another configuration fails; the test below
# holds that gap until it is closed.
def test_a_literal_list_of_layers_named_0_1_in_setup_hf_resnet():
  x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
  draft = lb.port.draft(models.NamedLayerList(), x, configs=())
  assert draft.ok, draft.report()
  assert "ConvLayer(self.features" in draft.source
  _equal_to_linen(draft, x)


def test_layers_collected_in_a_local_list_then_assigned_hf_resnet_stage_and_diffusers():
  x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
  draft = lb.port.draft(models.AppendedStage(), x, configs=())
  assert draft.ok, draft.report()
  # The setup code stays as written, each construction drafted in place; each appended layer's
  # input width is the layer before it's `features` (the loop's count is a setting).
  code = re.sub(r"\s+", "", draft.source)
  assert "layers.append(ConvLayer(" in code and "blocks.append(block)" in code
  assert "Conv_0_in_features=(x_featuresifnotlayerselselayers[-1].features)" in code
  _equal_to_linen(draft, x)


def test_a_setup_list_is_a_port_of_the_class_at_another_configuration():
  """HF's `name=str(i)` layers are found in the derived configurations' traces too, so each
  layer's input width is the class's (it was the sample's literal, wrong elsewhere)."""
  x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
  draft = lb.port.draft(models.NamedLayerList(), x)
  assert draft.ok, draft.report()
  assert draft.configs, "the check ran at another configuration"
  _equal_to_linen(draft, x)


def test_setup_locals_run_in_their_order_hf_clip():
  x = jax.random.normal(jax.random.key(0), (2, 3))
  draft = lb.port.draft(models.SetupLocalsInOrder(), x)
  assert draft.ok, draft.report()
  assert draft.source.count("num_positions = self.num_patches + 1") == 1
  _equal_to_linen(draft, x)


def test_a_conditional_construction_in_setup_when_its_branch_is_taken_hf_vit():
  x = jax.random.normal(jax.random.key(0), (2, 3, 4))
  draft = lb.port.draft(models.OptionalPooler(), x)
  assert draft.ok, draft.report()
  assert "if self.add_pooling_layer else None" in draft.source
  _equal_to_linen(draft, x)


def test_linen_machinery_is_left_out_of_the_port_and_reported_diffusers():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.WithInitWeights(), x)
  assert draft.ok, draft.report()
  assert "def init_weights" not in draft.source and "LoadingMixin" not in draft.source
  assert "@register_fields" not in draft.source
  removed = {ch.old: ch.why for ch in draft.changes if ch.new == "removed"}
  assert set(removed) == {"def init_weights(...)", "@register_fields", "LoadingMixin"}
  assert "self.init" in removed["def init_weights(...)"]
  _equal_to_linen(draft, x)


def test_bad_method_calls_and_variables_arguments_raise_port_errors():
  x = jax.numpy.ones((2, 4))
  model = models.WithInitWeights()
  with pytest.raises(lb.port.PortError, match=r"method=3 is not a method of WithInitWeights"):
    lb.port.draft(model, x, method=3)
  with pytest.raises(lb.port.PortError, match=r"calls= must be a sequence of lb\.port\.Call"):
    lb.port.draft(model, x, calls=None)
  with pytest.raises(lb.port.PortError, match=r"calls= must be a sequence of lb\.port\.Call"):
    lb.port.draft(model, x, calls=lb.port.Call(x))
  with pytest.raises(lb.port.PortError, match=r"variables= must be the Linen variables mapping"):
    lb.port.draft(model, x, variables=3)


def test_a_mesh_argument_does_not_break_the_trace_maxtext():
  from jax.sharding import Mesh

  x = jax.numpy.ones((2, 4))
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  draft = lb.port.draft(models.MeshAtTheCall(), x, mesh)
  assert draft.ok, draft.report()
  _equal_to_linen(draft, x, mesh)


def test_a_failure_of_the_trace_bookkeeping_is_reported_as_the_drafter_s(monkeypatch):
  """Not as the user's arguments (the model ran): the error says so and how to work around."""
  from loopbridge._port.trace import trace as trace_module

  def broken(tree):
    raise AttributeError("no dtype")

  monkeypatch.setattr(trace_module, "_abstract", broken)
  with pytest.raises(lb.port.PortError, match=r"failed inside the drafter .*defect of lb\.port"):
    lb.port.draft(models.MeshAtTheCall(), jax.numpy.ones((2, 4)), None)


def test_a_loop_construction_nothing_was_paired_with_says_so_not_named_empty():
  todo = lb.port.draft(models.LoopOfUntracedDense(), jax.numpy.ones((2, 4))).todos[0]
  assert "[()]" not in todo.reason
  assert todo.reason.startswith("no submodule the trace saw matches this construction")


def test_a_param_initialized_by_a_lambda_hf_rmsnorm():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.LambdaParamNorm(), x)
  assert draft.ok, draft.report()
  assert "nnx.Param((lambda _, shape: jnp.ones(shape))(rngs.params(), " in draft.source
  _equal_to_linen(draft, x)


def test_a_setup_list_of_layers_of_several_classes_hf_regnet():
  x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
  draft = lb.port.draft(models.MixedNamedList(), x)
  assert draft.ok, draft.report()
  _equal_to_linen(draft, x)


@pytest.mark.parametrize("layer_type", ["bottleneck", "basic"])
def test_layers_built_through_a_local_choosing_their_class_hf_resnet(layer_type: str):
  """`layer = Bottleneck if c else Basic`, then `layer(...)`: the port keeps the local, bound
  to the port of the class the sample configuration builds."""
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.ChosenLayerStage(layer_type=layer_type), x, configs=())
  assert draft.ok, draft.report()
  _equal_to_linen(draft, x)


def test_the_class_a_chosen_local_does_not_build_is_refused_by_name_not_built_wrong():
  """The sample builds BottleneckLayer only: the port of a configuration choosing BasicLayer
  raises, naming it, rather than building the bottleneck's port with the basic layer's
  arguments (or the Linen class)."""
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.ChosenLayerStage(), x, configs=())
  assert draft.ok, draft.report()
  namespace: dict[str, object] = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  port_class = tp.cast(tp.Any, namespace["ChosenLayerStage"])
  from flax import nnx

  with pytest.raises(NotImplementedError, match="BasicLayer"):
    port_class(layer_type="basic", rngs=nnx.Rngs(0))
  chosen = [ch for ch in draft.changes if "BasicLayer" in ch.why]
  assert len(chosen) == 1, draft.report()


def _decoder_inputs():
  model = models.CachedDecoder()
  max_length = models.CachedSelfAttention.max_length
  ids = jax.random.randint(jax.random.key(3), (2, max_length), 0, model.vocab_size)
  return model, ids, jax.numpy.ones((2, max_length), jax.numpy.int32)


def test_hf_decode_cache_sized_by_the_call_is_made_on_first_use():
  """`self.variable('cache', ..., key.shape, ...)` in `_concatenate_to_cache` was a TODO: now
  an attribute the method makes when absent, `has_variable` its presence, and
  `self.variables['cache'][...]` its value; each change is in the report."""
  model, ids, mask = _decoder_inputs()
  draft = lb.port.draft(model, ids, mask)
  assert draft.ok, draft.report()
  source = draft.source
  assert 'is_initialized = hasattr(self, "cached_key")' in source
  for name in ("cached_key", "cached_value", "cache_index"):
    assert f'if not hasattr(self, "{name}"):\n      self.{name} = nnx.Cache(' in source
  assert "self.variables[" not in source and "self.has_variable(" not in source
  assert "self.cached_key = nnx.Cache(jnp.zeros(key.shape, key.dtype))" in source
  olds = {ch.old for ch in draft.changes}
  assert 'self.variables["cache"]["cache_index"]' in olds
  assert 'self.has_variable("cache", "cached_key")' in olds
  new = {ch.old: ch.new for ch in draft.changes}
  made = new['self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)']
  assert made == (
    'if not hasattr(self, "cached_key"): '
    "self.cached_key = nnx.Cache(jnp.zeros(key.shape, key.dtype))"
  )
  _equal_to_linen(draft, ids, mask)


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "nnx.jit"])
def test_hf_decode_cache_port_decodes_token_by_token_like_linen(jitted: bool):
  """Linen: the cache from `init(..., init_cache=True)` on the full length (HF's `init_cache`),
  then `apply(..., mutable=['cache'])` per token. The port: one call with `init_cache=True` on
  the same input makes its caches, then the same tokens one by one (under `nnx.jit` too, which
  keeps the attributes the first call made)."""
  from flax import nnx

  model, ids, mask = _decoder_inputs()
  draft = lb.port.draft(model, ids, mask)
  assert draft.ok, draft.report()
  module, variables = draft.port_and_variables()
  assert "cache" not in variables  # the sample call makes no cache, in Linen or in the port

  def port(*args, **kwargs):
    if not jitted:
      return module(*args, **kwargs)
    return nnx.jit(lambda m, *a: m(*a, **kwargs))(module, *args)

  # Full precision on every backend, as loopbridge's checks run: the last step is compared with
  # the full-sequence call, another computation of the same values, which a TPU's default
  # float32 matmul (one bfloat16 pass) puts ~2e-3 apart.
  tol = dict(zip(("rtol", "atol"), full_precision_tolerance(1e-5, 1e-5)))
  with jax.default_matmul_precision("highest"):
    cache = model.init(jax.random.key(0), ids, mask, init_cache=True)["cache"]
    port(ids, mask, init_cache=True)
    linen_vars = {"params": variables["params"], "cache": cache}
    got = None
    for i in range(ids.shape[1]):
      step = ids[:, i : i + 1]
      want, updates = model.apply(linen_vars, step, mask, mutable=["cache"])
      linen_vars = {**linen_vars, "cache": updates["cache"]}
      got = port(step, mask)
      np.testing.assert_allclose(got, want, err_msg=f"decode step {i}", **tol)
    # The decode really used the cache: the last step attends to every earlier token.
    full = model.apply({"params": variables["params"]}, ids, mask)
  assert got is not None  # the loop ran
  np.testing.assert_allclose(got[:, 0], full[:, -1], **tol)


def test_has_variable_of_a_variable_the_class_does_not_declare_stays_a_todo():
  x = jax.numpy.ones((2, 4))
  draft = lb.port.draft(models.UndeclaredVariableTest(), x)
  assert not draft.ok
  (todo,) = draft.todos
  assert "self.has_variable of a variable this class does not declare" in todo.reason


def test_widths_from_a_config_object_that_is_no_dataclass_hf_config(tmp_path):
  """HF's configs are no dataclasses: other configurations are rebuilt from `to_dict()`, so the
  input widths are the config's (before: the sample's literals, `kernel_shape=(16, 8)`), and
  the port built at a configuration the draft never traced computes what Linen computes."""
  ids = jax.random.randint(jax.random.key(3), (2, 5), 0, 20)
  draft = lb.port.draft(models.ConfiguredMLP(models.SmallConfig()), ids)
  assert draft.ok, draft.report()
  assert "kernel_shape=(self.config.n_inner, self.config.n_embd)" in draft.source, draft.source
  assert [c[0].config.to_dict() for c in draft.configs]  # other configurations were traced
  path = tmp_path / "configured_mlp_nnx.py"
  draft.write(path)
  spec = importlib.util.spec_from_file_location("configured_mlp_nnx", path)
  module = importlib.util.module_from_spec(tp.cast(tp.Any, spec))
  tp.cast(tp.Any, spec).loader.exec_module(module)
  config = models.SmallConfig(n_embd=12, n_inner=40)
  linen = models.ConfiguredMLP(config)
  variables = linen.init(jax.random.key(4), ids)
  port = module.ConfiguredMLP(config, rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen, variables, port, ids)
  np.testing.assert_allclose(port(ids), linen.apply(variables, ids), rtol=1e-5, atol=1e-5)


def test_a_config_refusing_the_derived_values_is_no_evidence_not_an_error():
  """Each setting is scaled by its own pattern, which a validating config may refuse: that
  configuration is left out (before, the config's own error came out of `draft()`)."""
  ids = jax.random.randint(jax.random.key(3), (2, 5), 0, 20)
  draft = lb.port.draft(models.ConfiguredMLP(models.StrictConfig()), ids)
  assert draft.ok, draft.report()
  assert all(c[0].config.n_inner == 2 * c[0].config.n_embd for c in draft.configs)
  _equal_to_linen(draft, ids)


def test_blocks_of_two_classes_chosen_in_a_loop_diffusers_unet():
  """A setting only one of the classes has (`heads`, read from a setup local) is read from the
  traced blocks of that class alone."""
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.BranchedBlockList(), x)
  # Equal on the sample; the first block's input width is the sample's number (no symbol
  # reaches it through the branch), so the check at an input of another width fails.
  assert draft.check is not None and not draft.ok, draft.report()
  assert (draft.check.error or "").startswith("an input of another size (argument 0.shape[1]=")
  assert "heads=heads[i]" in draft.source  # setup's own local, read in its loop
  _equal_to_linen(draft, x)


def test_fields_read_through_a_config_mixin_and_a_dropout_called_by_position_diffusers_vae():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.ReadsItsConfig(), x)
  assert draft.ok, draft.report()
  assert "self.config" not in draft.source.split("class ReadsItsConfig")[1]
  assert "self.dropout_layer(self.dense(x), deterministic=deterministic)" in draft.source
  _equal_to_linen(draft, x)


def test_an_attribute_set_to_none_then_to_a_layer_in_setup_diffusers_resnet():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.ShortcutWhenWidened(features=8), x)
  assert draft.ok, draft.report()
  assert "self.conv_shortcut = nnx.data(None)" in draft.source or not hasattr(nnx, "data")
  _equal_to_linen(draft, x)


def test_a_layer_only_another_configuration_builds_is_sized_and_checked_there():
  """At features=4 the sample never builds the shortcut; the derived configuration does: its
  input width comes from that trace, and the check runs the port there. Built at features=8
  from the source alone, the port computes Linen's apply."""
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.ShortcutWhenWidened(features=4), x)
  assert draft.ok, draft.report()
  assert "self.conv_shortcut = nnx.Linear(x_features, self.features" in draft.source
  linen = models.ShortcutWhenWidened(features=8)
  variables = linen.init(jax.random.key(1), x)
  namespace: dict[str, tp.Any] = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  port = namespace["ShortcutWhenWidened"](features=8, rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  np.testing.assert_allclose(port(x), linen.apply(variables, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_a_tuple_of_layers_grown_by_plus_equals_in_setup_hf_t5(causal: bool):
  """Each `+=` construction is paired as setup's one construction of its class (its name
  comes from a counter the trace cannot read); the tuple is an nnx.List where flax has one
  (flax 0.12 refuses a tuple of modules as static data). Before: two TODOs and a port that
  did not build. At causal=False, T5CrossPart is built only where causal=True: its input
  width, which the residual ties to `features`, is read from the symbolic trace made at that
  branch (before, the sample's 8, and the draft was not ok)."""
  x = jax.random.normal(jax.random.key(0), (2, 8))
  draft = lb.port.draft(models.TupleGrownInSetup(causal=causal), x)
  assert draft.ok, draft.report()
  assert "self.layer += (T5FeedForward(self.features, rngs=rngs),)" in draft.source
  if hasattr(nnx, "List"):
    assert "self.layer = nnx.List([T5SelfPart(self.features, rngs=rngs)])" in draft.source
  _equal_to_linen(draft, x)


def test_the_same_block_named_apart_in_two_stacks_is_one_construction_hf_t5():
  """The feed-forward layer is "1" in the non-causal block and "2" in the causal one: one
  construction in place in setup's line, not a TODO asking for a name."""
  x = jax.random.normal(jax.random.key(0), (2, 8))
  draft = lb.port.draft(models.EncoderDecoderBlocks(), x)
  assert draft.ok, draft.report()
  _equal_to_linen(draft, x)
