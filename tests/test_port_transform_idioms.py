"""Drafting idioms of published Linen code that `_port/transforms/` translates, each on a small
model written the way the real code writes it (`realcode_idioms_more.py`), checked against
Linen's own `apply` at the sample's configuration and at another one."""

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

pytest.importorskip("libcst")

import realcode_idioms_more as models


def _close(got, want):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got, want)


def _equal_to_linen(draft, *args, **kwargs):
  """The drafted port, holding the Linen variables, computes Linen's own apply."""
  port, variables = draft.port_and_variables()
  _close(port(*args, **kwargs), draft.linen_module.apply(variables, *args, **kwargs))


def _equal_at(draft, linen: object, fields: dict[str, object], *args):
  """The drafted root class built at other field values, holding the variables of Linen's own
  `init` at those values (moved by `lb.checkpoint.linen_to_nnx`), computes Linen's `apply`."""
  home = types.ModuleType("drafted_port_under_test")
  sys.modules[home.__name__] = home
  try:
    exec(compile(draft.source, "<draft>", "exec"), home.__dict__)
    port = getattr(home, draft.root)(**fields, rngs=nnx.Rngs(0))
  finally:
    del sys.modules[home.__name__]
  variables = linen.init(jax.random.key(1), *args)  # pyright: ignore[reportAttributeAccessIssue]
  lb.checkpoint.linen_to_nnx(linen, variables, port, *args)  # pyright: ignore[reportArgumentType]
  _close(port(*args), linen.apply(variables, *args))  # pyright: ignore[reportAttributeAccessIssue]


def _ids(vocab: int) -> jax.Array:
  return jnp.asarray(np.random.RandomState(0).randint(0, vocab, size=(2, 5)), jnp.int32)


def test_a_head_tied_to_the_embedding_reads_it_as_an_attribute_hf_bart():
  """HF's tied heads: `self.model.variables["params"]["shared"]["embedding"]` is the NNX
  attribute's value, and `self.lm_head.apply({"params": {"kernel": E.T}}, h)` the product;
  the output layer is built only where the class calls it itself (Linen makes no kernel)."""
  draft = lb.port.draft(models.TiedLMHead(), _ids(11))
  assert draft.ok, draft.report()
  value = "[...]" if hasattr(nnx, "List") else ".value"
  assert f"shared_embedding = self.model.shared.embedding{value}" in draft.source
  assert "lm_logits = jnp.dot(hidden_states, shared_embedding.T)" in draft.source
  assert "if not (self.tie_word_embeddings)" in draft.source
  assert not draft.todos
  _equal_to_linen(draft, _ids(11))
  wide = dict(vocab=17, width=10)
  _equal_at(draft, models.TiedLMHead(**wide), wide, _ids(17))
  untied = dict(vocab=13, width=4, tie_word_embeddings=False)
  _equal_at(draft, models.TiedLMHead(**untied), untied, _ids(13))


def test_a_field_default_naming_another_field_is_the_value_it_had_resnext():
  """`cardinality: int = groups` is 2 in Linen (the class body read `groups`'s default): the
  port's default is that value, not the name (a NameError in `__init__`)."""
  x = jax.random.normal(jax.random.key(0), (2, 5))
  draft = lb.port.draft(models.GroupedBlock(), x)
  assert draft.ok, draft.report()
  assert "cardinality: int = 2," in draft.source
  _equal_to_linen(draft, x)
  _equal_at(draft, models.GroupedBlock(features=3, groups=5), dict(features=3, groups=5), x)


@pytest.mark.parametrize("cls", [models.WideGroupedBlock, models.NarrowGroupedBlock])
def test_a_subclass_that_only_changes_fields_is_the_base_with_its_defaults(cls):
  """The port of a field-only subclass is a whole NNX class (no Linen base left in it) with
  the subclass's defaults; with or without a docstring of its own."""
  x = jax.random.normal(jax.random.key(0), (2, 5))
  draft = lb.port.draft(cls(), x)
  assert draft.ok, draft.report()
  assert f"class {cls.__name__}(nnx.Module):" in draft.source
  assert "GroupedBlock" not in draft.source.replace(cls.__name__, "")
  _equal_to_linen(draft, x)
  _equal_at(draft, cls(cardinality=3), dict(cardinality=3), x)


def test_field_only_subclasses_inside_a_model_each_take_their_own_widths():
  x = jax.random.normal(jax.random.key(0), (2, 5))
  draft = lb.port.draft(models.UsesFieldOnlySubclass(), x)
  assert draft.ok, draft.report()
  assert draft.source.index("class WideGroupedBlock(nnx.Module)") < draft.source.index(
    "class UsesFieldOnlySubclass"
  )
  _equal_to_linen(draft, x)
  _equal_at(draft, models.UsesFieldOnlySubclass(depth=3), dict(depth=3), x)


def test_a_port_that_raises_when_run_ends_in_a_todo_naming_the_line():
  """No TODO was written for the line (the draft did not see the Linen machinery), but the
  port raises there: the draft ends in a TODO naming that Linen line, not only a failed check."""
  import inspect

  x = jax.random.normal(jax.random.key(0), (2, 5))
  draft = lb.port.draft(models.ReadsAllItsLayersVariables(), x)
  assert not draft.ok
  lines, first = inspect.getsourcelines(models.ReadsAllItsLayersVariables)
  at = first + next(k for k, ln in enumerate(lines) if "self.dense.variables" in ln)
  assert [(t.line, t.original) for t in draft.todos] == [
    (at, "sizes = jax.tree.map(jnp.size, self.dense.variables)")
  ]
  assert "AttributeError" in draft.todos[0].reason
  assert "TODO" in draft.report()


def test_a_relative_import_in_a_method_is_written_absolute_hf_encoder_decoder():
  from port_models.relative_import import ImportsRelativeInSetup

  x = jax.random.normal(jax.random.key(0), (2, 5))
  draft = lb.port.draft(ImportsRelativeInSetup(), x)
  assert draft.ok, draft.report()
  assert "from port_models.relative_helpers import squash" in draft.source
  assert "from ." not in draft.source
  _equal_to_linen(draft, x)
  _equal_at(draft, ImportsRelativeInSetup(features=7), dict(features=7), x)


def test_dotted_layer_names_become_attribute_names():
  """`name=f"down.block_{i}"`: the port's attribute is `down_block` (a list), `head.proj` is
  `head_proj` (a dotted attribute assignment would be a NameError in `__init__`)."""
  x = jax.random.normal(jax.random.key(0), (2, 3))
  draft = lb.port.draft(models.DottedNames(), x)
  assert draft.ok, draft.report()
  assert "self.down_block[i](x)" in draft.source and "self.head_proj(x)" in draft.source
  _equal_to_linen(draft, x)
  _equal_at(draft, models.DottedNames(depth=3), dict(depth=3), x)


def test_a_head_handed_the_tied_embedding_builds_its_decoder_by_the_setting_hf_albert():
  """The head's `if` tests its argument, which `__init__` cannot read: whether the decoder is
  built is the setting that says so in every traced configuration (here the parent's field,
  a field of the head's own in HF, `config.tie_word_embeddings`)."""
  draft = lb.port.draft(models.TiedThroughAnArgument(), _ids(11))
  assert draft.ok, draft.report()
  assert not draft.todos
  _equal_to_linen(draft, _ids(11))
  untied = dict(vocab=13, width=4, tie_word_embeddings=False)
  _equal_at(draft, models.TiedThroughAnArgument(**untied), untied, _ids(13))
  wide = dict(vocab=17, width=10)
  _equal_at(draft, models.TiedThroughAnArgument(**wide), wide, _ids(17))
