"""A setup layer no traced call reached is sized from a value a trace did see, when the source
proves it is the value the layer would be given (`_port/plan/passed_values.py`): the block's own
input (diffusers' VAE shortcut), or what a later layer was given with nothing rebinding it
but the unreached branch (HF GPT-2's cross-attention norm). Each port is then built at a
configuration (or called with an argument) that does reach the layer, from the source alone,
and compared with Linen's own apply there."""

import textwrap
import typing as tp

import jax
import numpy as np
import pytest

import loopbridge as lb

pytest.importorskip("libcst")

import branch_models as models
from flax import nnx

from loopbridge._port.plan import passed_values
from loopbridge._port.plan.passed_values import FromParameter, FromSibling


def _build(draft, name: str, **settings) -> tp.Any:
  namespace: dict[str, tp.Any] = {}
  exec(compile(draft.source, "port.py", "exec"), namespace)
  return namespace[name](**settings, rngs=nnx.Rngs(0))


def test_a_shortcut_the_sample_never_builds_takes_the_blocks_input_width_diffusers_vae():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  draft = lb.port.draft(models.ShortcutOnTheInput(in_channels=4), x)
  assert draft.check is not None  # was a TODO: "nnx.Linear needs in_features ..."
  # Not `ok`: the dense layer's input width is the sample's 4 (Linen refuses another input
  # width at in_channels=4 without the shortcut), which the check at another input width where
  # the shortcut is built shows.
  assert not draft.ok and "an input of another size" in (draft.check.error or "")
  # Where the block changes its width, the shortcut is built and called: the port is Linen's
  # apply there.
  linen = models.ShortcutOnTheInput(in_channels=4, out_channels=8)
  variables = linen.init(jax.random.key(2), x)
  port = _build(draft, "ShortcutOnTheInput", in_channels=4, out_channels=8)
  lb.checkpoint.linen_to_nnx(linen, variables, port, x)
  np.testing.assert_allclose(port(x), linen.apply(variables, x), rtol=1e-5, atol=1e-5)


def test_a_norm_only_a_context_reaches_takes_the_width_of_the_next_norms_input_hf_gpt2():
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  draft = lb.port.draft(models.NormOnlyAContextReaches(features=6), x)
  assert draft.ok, draft.report()
  assert "self.norm_cross = nnx.LayerNorm(self.features" in draft.source, draft.source
  assert "translated, not checked (no traced call reached the layer)" in draft.report()
  # Built with the norm and called with the context the sample left off: it runs as Linen's.
  context = jax.random.normal(jax.random.key(1), (2, 5, 6))
  linen = models.NormOnlyAContextReaches(features=6, cross=True)
  variables = linen.init(jax.random.key(2), x, context)
  port = _build(draft, "NormOnlyAContextReaches", features=6, cross=True)
  lb.checkpoint.linen_to_nnx(linen, variables, port, x, context)
  np.testing.assert_allclose(
    port(x, context), linen.apply(variables, x, context), rtol=1e-5, atol=1e-5
  )


def _origin(body: str) -> object:
  source = "class M:\n" + textwrap.indent(textwrap.dedent(body), "  ")
  return passed_values.origin(source, "layer")


def test_the_value_is_read_through_an_alias_of_a_parameter():
  found = _origin("""
    def __call__(self, a, h):
      r = h
      h = self.other(h)
      if self.layer is not None:
        r = self.layer(r)
      return h + r
  """)
  assert found == FromParameter("__call__", "h", 1)


def test_the_value_a_later_layer_takes_is_the_branchs_when_nothing_rebinds_it():
  found = _origin("""
    def __call__(self, x, c=None):
      x = self.first(x) + 1
      if c is not None:
        if c.ndim != 3:
          raise ValueError("c")
        x = self.layer(x)
        x = x + c
      y = x
      return self.last(x)
  """)
  assert found == FromSibling("__call__", "last")


@pytest.mark.parametrize(
  "body, why",
  [
    (
      """
      def __call__(self, x, c=None):
        x = self.first(x)
        if c is not None:
          x = self.layer(x)
        else:
          x = x * 2
        return self.last(x)
      """,
      "the other branch rebinds the value the later layer takes",
    ),
    (
      """
      def __call__(self, x, c=None):
        x = self.first(x)
        if c is not None:
          x = self.layer(x)
        x = x * 3
        return self.last(x)
      """,
      "something between rebinds it (the later layer takes another value)",
    ),
    (
      """
      def __call__(self, x):
        for _ in range(2):
          x = self.layer(x)
        return x
      """,
      "a loop: the value differs from turn to turn",
    ),
    (
      """
      def __call__(self, x, c=None):
        if c is not None:
          x = self.layer(x * 2)
        return self.last(x)
      """,
      "the argument is an expression, not a value a layer was given",
    ),
    (
      """
      def __call__(self, x, c=None):
        if c is not None:
          x = self.layer(x)
        return self.layer(x + 1)
      """,
      "called in two places",
    ),
    (
      """
      def __call__(self, x, c=None):
        x, y = self.first(x)
        if c is not None:
          x = self.layer(x)
        return self.last(x)
      """,
      "unpacked: not a plain assignment",
    ),
    (
      """
      def __call__(self, x, c=None):
        x = self.first(x)
        if c is not None:
          x = self.layer(x) if c.ndim else x
        return self.last(x)
      """,
      "the call is itself conditional within its line",
    ),
    (
      """
      def __call__(self, c=None):
        if c is not None:
          return self.layer(self.x)
        return c
      """,
      "an attribute, not a local or a parameter",
    ),
  ],
)
def test_no_proof_no_width(body: str, why: str):
  assert _origin(body) is None, why


def test_a_layer_whose_value_no_trace_saw_is_built_when_its_width_is_given():
  """The Wav2Vec2 case (tests/test_port_branch_configs.py) is a layer whose settings are read;
  here it is only called, on an expression no trace saw: no width is proven, so the port takes
  it as an argument and builds the layer only where it is given (`unreached_layers.py`)."""

  x = jax.numpy.ones((2, 3))
  draft = lb.port.draft(models.NormOnAnExpression(), x)
  assert draft.ok, draft.report()
  assert "layer_num_features: int | None = None" in draft.source
  c = jax.random.normal(jax.random.key(1), (2, 5))
  module = models.NormOnAnExpression()
  variables = module.init(jax.random.key(0), x, c)
  port = _build(draft, "NormOnAnExpression", x_features=3, layer_num_features=9)
  lb.checkpoint.linen_to_nnx(module, variables, port, x, c)
  np.testing.assert_allclose(port(x, c), module.apply(variables, x, c), rtol=1e-5, atol=1e-5)
