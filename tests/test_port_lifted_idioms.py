"""Drafting idioms of published Linen code (state-space layers, VQ autoencoders, T5, ViT), each
on a small model of its own, compared with Linen's apply at two configurations."""

import inspect

import jax
import numpy as np
import pytest

import loopbridge as lb

pytest.importorskip("libcst")

import lifted_idioms as models


def _equal_to_linen(draft, config, linen_module, *args, method=None, **kwargs):
  """The port built at `config` (0: the drafted module), holding the Linen variables of
  `linen_module` (that configuration's Linen module), computes Linen's own apply."""
  variables = linen_module.init(jax.random.key(1), *args, method=method, **kwargs)
  variables = jax.tree.map(
    lambda v: v + 0.05 * jax.random.normal(jax.random.key(2), v.shape, v.dtype), variables
  )
  port = draft.build(config=config)
  lb.checkpoint.linen_to_nnx(
    linen_module, variables, port, *args, method=method, sample_kwargs=kwargs or None
  )
  want = linen_module.apply(variables, *args, method=method, **kwargs)
  got = getattr(port, method or "__call__")(*args, **kwargs)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got, want)


def _x(*shape):
  return jax.random.normal(jax.random.key(0), shape)


def test_a_class_rematerialized_at_module_level_is_ported_as_the_class_inside():
  """`Block = nn.remat(Block)` is taken for flax's own layer no more: the port is the class's."""
  second = models.RematBlock(6)
  draft = lb.port.draft(models.RematBlock(4), _x(2, 4), configs=[second])
  assert draft.ok, draft.report()
  assert "class RematBlock(nnx.Module):" in draft.source
  _equal_to_linen(draft, 0, models.RematBlock(4), _x(2, 4))
  _equal_to_linen(draft, 1, second, _x(3, 4))


def test_a_class_vmapped_at_module_level_is_a_todo_naming_the_line_never_a_raise():
  """`Layer = per_channel(Layer)` (an `nn.vmap` in a helper) changes the variables' shapes:
  the draft ports the class inside and names the wrapping line and the NNX fix."""
  draft = lb.port.draft(models.Channel(3), _x(5, 4))
  assert not draft.ok
  line = next(
    i
    for i, text in enumerate(inspect.getsource(models).splitlines(), 1)
    if text == "Channel = per_channel(Channel)"
  )
  (todo,) = [t for t in draft.todos if t.line == line]
  assert "nn.vmap" in todo.reason and "nnx.vmap" in todo.reason
  assert "class Channel(nnx.Module):" in draft.source
  # The class inside is ported: one member holds one channel's params.
  member = draft.build()
  assert member.scale.shape == (3,)


def test_a_param_field_with_init_false_made_in_setup_and_read_by_a_second_method_t5():
  """`embedding: Array = dataclasses.field(init=False)` is no constructor argument (reading it
  from the unbound module raised AttributeError): setup's param, read by `attend` too."""
  ids = jax.numpy.arange(6).reshape(2, 3) % 7
  second = models.Embed(9, 6)
  draft = lb.port.draft(
    models.Embed(7, 4), ids, calls=[lb.port.Call(_x(2, 4), method="attend")], configs=[second]
  )
  assert draft.ok, draft.report()
  assert "embedding" not in draft.init_kwargs
  _equal_to_linen(draft, 0, models.Embed(7, 4), ids)
  _equal_to_linen(draft, 0, models.Embed(7, 4), _x(2, 4), method="attend")
  _equal_to_linen(draft, 1, second, ids % 9 + 2)
  _equal_to_linen(draft, 1, second, _x(3, 6), method="attend")


def test_a_variable_of_a_collection_of_the_user_s_own_gets_a_variable_type_of_its_own_s4():
  """`self.variable('prime', ...)`: the port declares `PrimeVariable` (paired with 'prime'),
  where the draft left a TODO: no NNX Variable type."""
  second = models.OwnCollection(6)
  draft = lb.port.draft(models.OwnCollection(4), _x(2, 3), configs=[second])
  assert draft.ok, draft.report()
  assert "class PrimeVariable(nnx.Variable):" in draft.source
  port = draft.build()
  assert type(port.table).__name__ == "PrimeVariable"
  _equal_to_linen(draft, 0, models.OwnCollection(4), _x(2, 3))
  _equal_to_linen(draft, 1, second, _x(5, 3))


def test_a_layer_built_through_a_local_naming_its_class_maskgit_vqgan():
  """`dense_fn = nn.Dense`, then `dense_fn(w)(x)`: the local names the class, so the layer is
  built in `__init__` as any construction (it was left as Linen code the port could not run)."""
  second = models.ClassAlias(6)
  draft = lb.port.draft(models.ClassAlias(4), _x(2, 3), configs=[second])
  assert draft.ok, draft.report()
  assert "dense_fn" not in draft.source
  _equal_to_linen(draft, 0, models.ClassAlias(4), _x(2, 3))
  _equal_to_linen(draft, 1, second, _x(5, 3))


def test_layers_a_compact_call_builds_from_what_setup_assigned_maskgit_vqgan():
  """Linen runs setup before the call builds its layers: `__init__` runs setup's body first
  (the layers read `self.width`, which setup assigns)."""
  second = models.SetupThenCompact(3)
  draft = lb.port.draft(models.SetupThenCompact(2), _x(2, 5), configs=[second])
  assert draft.ok, draft.report()
  _equal_to_linen(draft, 0, models.SetupThenCompact(2), _x(2, 5))
  _equal_to_linen(draft, 1, second, _x(4, 5))


def test_a_layer_under_a_branch_no_trace_took_is_a_todo_naming_the_branch():
  """`if self.mode == 3:` at mode 0: the TODO names the branch's test and configs=, not a
  construction "built outside the method"; given such a configuration, the branch is ported."""
  draft = lb.port.draft(models.BuiltAtOneMode(4), _x(2, 3))
  assert not draft.ok
  (todo,) = draft.todos
  assert "`if self.mode == 3`" in todo.reason and "configs=" in todo.reason
  second = models.BuiltAtOneMode(5, mode=3)
  draft = lb.port.draft(models.BuiltAtOneMode(4), _x(2, 3), configs=[second])
  assert draft.ok, draft.report()
  _equal_to_linen(draft, 0, models.BuiltAtOneMode(4), _x(2, 3))
  _equal_to_linen(draft, 1, second, _x(4, 3))


def test_a_layer_built_only_when_an_optional_width_is_set_is_traced_there_maskgit():
  """`if self.hidden:` with `hidden: int | None = None`: a configuration with the width set
  traces the branch, so the draft ports it and checks it there, with no configs= given."""
  draft = lb.port.draft(models.OptionalProjection(4), _x(2, 3))
  assert draft.ok, draft.report()
  assert any("hidden=" in label for label in draft.config_labels), draft.config_labels
  _equal_to_linen(draft, 0, models.OptionalProjection(4), _x(2, 3))
  _equal_to_linen(draft, 0, models.OptionalProjection(4), _x(5, 3))
  k = draft.configs.index(next(c for c in draft.configs if c[0].hidden)) + 1
  _equal_to_linen(draft, k, draft.configs[k - 1][0], _x(4, 3))


def test_a_param_made_through_param_with_axes_is_an_nnx_param_t5x():
  """flax.linen.partitioning's `param_with_axes(name, init, shape, dtype, axes=...)` makes the
  param `self.param` would (its axes are sharding names): drafted as an nnx.Param (it was left
  as the Linen call, which raised in the port)."""
  ids = jax.numpy.arange(6).reshape(2, 3) % 7
  second = models.AxesEmbed(9, 6)
  draft = lb.port.draft(
    models.AxesEmbed(7, 4), ids, calls=[lb.port.Call(_x(2, 4), method="attend")], configs=[second]
  )
  assert draft.ok, draft.report()
  assert "param_with_axes(" not in draft.source
  _equal_to_linen(draft, 0, models.AxesEmbed(7, 4), ids)
  _equal_to_linen(draft, 1, second, _x(3, 6), method="attend")
