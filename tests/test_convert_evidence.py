"""lb.checkpoint.linen_to_nnx / nnx_to_linen never guess: pairing decided by running.

Every reference is independent of the converter: the Linen model's own `apply` and the port's
own call, and the arrays read by hand where a person would put them. Each case of the
'silently wrong' and 'refused' kinds failed before the conversion ran the models.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb
from loopbridge import _compat

X = jax.random.normal(jax.random.key(0), (5, 4))


def _trained_like(variables):
  """Variables that are not an init's (so no test passes by two equal inits)."""
  keys = iter(jax.random.split(jax.random.key(7), 100))
  return jax.tree.map(
    lambda a: (a + jax.random.normal(next(keys), a.shape, a.dtype)).astype(a.dtype), variables
  )


def _same(a, b) -> bool:
  return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
    x.dtype == y.dtype and bool((np.asarray(x) == np.asarray(y)).all())
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


# --- 1. a layer axis the shapes cannot tell: 4 layers of Dense(4) ---------------------------


class Layer(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return jnp.tanh(nn.Dense(4)(x)), None


class Stack(nn.Module):
  axis: int = 1

  @nn.compact
  def __call__(self, x):
    stack = nn.scan(
      Layer, variable_axes={"params": self.axis}, split_rngs={"params": True}, length=4
    )
    return stack(name="stack")(x, None)[0]


class StackPort(nnx.Module):
  def __init__(self, rngs):
    @nnx.split_rngs(splits=4)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return nnx.Linear(4, 4, rngs=rngs)

    self.layers = make(rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, layer):
      return jnp.tanh(layer(x))

    return run(x, self.layers)


@pytest.mark.parametrize("read", [True, False], ids=["variable_axes read", "by running"])
@pytest.mark.parametrize("axis", [0, 1])
def test_a_layer_axis_equal_to_a_width_is_read_or_decided_by_running(axis, read, monkeypatch):
  if not read:  # a flax that keeps `variable_axes` out of reach: the evidence decides
    monkeypatch.setattr(_compat, "linen_variable_axes", lambda module: None)
  linen = Stack(axis=axis)
  variables = _trained_like(linen.init(jax.random.key(1), X))
  port = StackPort(nnx.Rngs(0))

  report = lb.checkpoint.linen_to_nnx(linen, variables, port, X)

  np.testing.assert_allclose(port(X), linen.apply(variables, X), rtol=1e-5, atol=1e-6)
  kernel = np.asarray(variables["params"]["stack"]["Dense_0"]["kernel"])
  np.testing.assert_array_equal(port.layers.kernel[...], np.moveaxis(kernel, axis, 0))
  # Chosen by running only where the declaration could not be read.
  assert report.layer_axes == (() if read else (("stack/params", axis),))
  back = lb.checkpoint.nnx_to_linen(port, linen, X)
  assert _same(back, variables)


# --- 2. leaves of equal shapes under other names --------------------------------------------


class Norm(nnx.Module):
  """A LayerNorm port naming scale/bias alpha/beta, created in the other order."""

  def __init__(self, width):
    self.beta = nnx.Param(jnp.zeros(width))
    self.alpha = nnx.Param(jnp.ones(width))

  def __call__(self, x):
    # Linen's LayerNorm statistics (use_fast_variance): E[x^2] - E[x]^2. Where the variance is
    # tiny, rsqrt amplifies the formula's rounding to ~1e-3, so the port uses the same one.
    mean = x.mean(-1, keepdims=True)
    var = jnp.maximum(0.0, (x * x).mean(-1, keepdims=True) - mean * mean)
    return (x - mean) * jax.lax.rsqrt(var + 1e-6) * self.alpha[...] + self.beta[...]


def test_leaves_of_equal_shapes_are_paired_by_running_not_by_order():
  variables = _trained_like(nn.LayerNorm().init(jax.random.key(1), X))
  port = Norm(4)

  report = lb.checkpoint.linen_to_nnx(nn.LayerNorm(), variables, port, X)

  np.testing.assert_allclose(port(X), nn.LayerNorm().apply(variables, X), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(port.alpha[...], variables["params"]["scale"])
  (placement,) = report.placements
  assert (placement.decided, placement.candidates, placement.checked) == ("module", 2, "module")
  assert _same(lb.checkpoint.nnx_to_linen(port, nn.LayerNorm(), X), variables)


def test_a_leaf_level_mapping_names_the_leaves():
  variables = _trained_like(nn.LayerNorm().init(jax.random.key(1), X))
  port = Norm(4)
  mapping = {"scale": "alpha", "bias": "beta"}
  report = lb.checkpoint.linen_to_nnx(nn.LayerNorm(), variables, port, X, mapping=mapping)
  np.testing.assert_array_equal(port.beta[...], variables["params"]["bias"])
  assert {p.how for p in report.placements} == {"mapping"}


# --- 3. a module-level mapping entry that cannot be honoured ---------------------------------


class AW(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3, name="a")(x) + nn.Dense(3, name="b")(x)


class WidePort(nnx.Module):
  def __init__(self, rngs):
    self.w = nnx.Linear(4, 3, rngs=rngs)
    self.v = nnx.Linear(4, 3, rngs=rngs)
    self.extra = nnx.Linear(4, 5, rngs=rngs)

  def __call__(self, x):
    return self.w(x) + self.v(x) + self.extra(x).sum()


@pytest.mark.parametrize(
  "mapping, match",
  [
    ({"a": "extra"}, r"(?s)mapping entry 'a': 'extra' pairs the modules below it.*Linen `a`"),
    ({"a/kernel": "extra/kernel"}, r"mapping entry 'a/kernel': 'extra/kernel' cannot move"),
  ],
)
def test_a_mapping_entry_that_cannot_be_honoured_is_an_error_naming_it(mapping, match):
  variables = AW().init(jax.random.key(1), X)
  port = WidePort(nnx.Rngs(0))
  with pytest.raises(lb.checkpoint.CheckpointError, match=match):
    lb.checkpoint.linen_to_nnx(AW(), variables, port, X, mapping=mapping)


# --- 4. a bias-less Linear (flax 0.10 keeps `bias = nnx.Param(None)`) ------------------------


def test_value_less_params_are_skipped_both_ways():
  linen = nn.Dense(3, use_bias=False)
  variables = _trained_like(linen.init(jax.random.key(1), X))
  port = nnx.Linear(4, 3, use_bias=False, rngs=nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen, variables, port, X)
  np.testing.assert_allclose(port(X), linen.apply(variables, X), rtol=1e-6)
  assert _same(lb.checkpoint.nnx_to_linen(port, linen, X), variables)

  # With an optimizer too (flax 0.10 keeps optax states of the value-less bias).
  tx = optax.adam(1e-2)
  opt_state = jax.tree.map(lambda a: a + 1, tx.init(variables["params"]))
  port = nnx.Linear(4, 3, use_bias=False, rngs=nnx.Rngs(1))
  optimizer = nnx.Optimizer(port, tx, wrt=nnx.Param)
  lb.checkpoint.linen_to_nnx(linen, variables, port, X, opt_state=opt_state, optimizer=optimizer)
  back, back_opt = lb.checkpoint.nnx_to_linen(port, linen, X, optimizer=optimizer)
  assert _same(back, variables) and _same(back_opt, opt_state)


# --- rules: declared once, inverted for the other direction ---------------------------------


class Fused(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = self.param("wi", nn.initializers.normal(1.0), (2, 4, 6))
    return nn.gelu(x @ w[0]) * (x @ w[1])


class SplitPort(nnx.Module):
  def __init__(self, rngs):
    self.gate = nnx.Linear(4, 6, use_bias=False, rngs=rngs)
    self.up = nnx.Linear(4, 6, use_bias=False, rngs=rngs)

  def __call__(self, x):
    return nnx.gelu(self.gate(x)) * self.up(x)


def test_a_split_is_found_by_running_or_declared_by_a_rule():
  variables = _trained_like(Fused().init(jax.random.key(1), X))
  wi = np.asarray(variables["params"]["wi"])

  port = SplitPort(nnx.Rngs(0))
  report = lb.checkpoint.linen_to_nnx(Fused(), variables, port, X)
  np.testing.assert_allclose(port(X), Fused().apply(variables, X), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(port.gate.kernel[...], wi[0])
  (placement,) = report.placements
  assert placement.transforms == (
    "lb.checkpoint.split('wi', ['gate/kernel', 'up/kernel'], axis=0)",
  )
  assert placement.decided == "module" and placement.candidates == 2

  rule = lb.checkpoint.split("wi", ["gate/kernel", "up/kernel"], axis=0)
  port = SplitPort(nnx.Rngs(1))
  report = lb.checkpoint.linen_to_nnx(Fused(), variables, port, X, rules=[rule])
  np.testing.assert_array_equal(port.up.kernel[...], wi[1])
  assert report.placements[0].how == "rule"
  assert _same(lb.checkpoint.nnx_to_linen(port, Fused(), X, rules=[rule]), variables)


def test_a_wrong_rule_is_refused_with_the_port_unchanged():
  variables = _trained_like(Fused().init(jax.random.key(1), X))
  port = SplitPort(nnx.Rngs(0))
  before = np.asarray(port.gate.kernel[...])
  swapped = lb.checkpoint.split("wi", ["up/kernel", "gate/kernel"], axis=0)
  with pytest.raises(lb.checkpoint.CheckpointError, match=r"does not reproduce the Linen"):
    lb.checkpoint.linen_to_nnx(Fused(), variables, port, X, rules=[swapped])
  np.testing.assert_array_equal(port.gate.kernel[...], before)


class Symmetric(nnx.Module):
  """gelu(a) + gelu(b): the split's two orders compute the same."""

  def __init__(self, rngs):
    self.gate = nnx.Linear(4, 6, use_bias=False, rngs=rngs)
    self.up = nnx.Linear(4, 6, use_bias=False, rngs=rngs)

  def __call__(self, x):
    return nnx.gelu(self.gate(x)) + nnx.gelu(self.up(x))


class SymmetricLinen(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = self.param("wi", nn.initializers.normal(1.0), (2, 4, 6))
    return nn.gelu(x @ w[0]) + nn.gelu(x @ w[1])


def test_two_candidates_that_agree_are_an_error_with_rules_to_paste():
  variables = _trained_like(SymmetricLinen().init(jax.random.key(1), X))
  with pytest.raises(
    lb.checkpoint.CheckpointError,
    match=r"(?s)2 different conversions.*rules=\[lb\.checkpoint\.split\('wi', \['gate/kernel', "
    r"'up/kernel'\], axis=0\)\]",
  ):
    lb.checkpoint.linen_to_nnx(SymmetricLinen(), variables, Symmetric(nnx.Rngs(0)), X)


@pytest.mark.parametrize(
  "rules, match",
  [
    ("split", r"rules= takes a list"),
    ([lambda: 0], r"rules= takes rules made by"),
    ([lb.checkpoint.rename("nope", "gate/kernel")], r"rule .*rename\('nope'.*matches no leaves"),
    ([lb.checkpoint.rename("wi", "gate/kernel")], r"cannot move Linen `wi` float32\[2, 4, 6\]"),
  ],
)
def test_bad_rules_say_what_and_how_to_fix(rules, match):
  variables = Fused().init(jax.random.key(1), X)
  with pytest.raises(lb.checkpoint.CheckpointError, match=match):
    lb.checkpoint.linen_to_nnx(Fused(), variables, SplitPort(nnx.Rngs(0)), X, rules=rules)


@pytest.mark.parametrize(
  "make, match",
  [
    (lambda: lb.checkpoint.split("a", "b"), r"at least two leaf paths"),
    (lambda: lb.checkpoint.fuse(["a", "b"], 3), r"leaf path as a string"),
    (lambda: lb.checkpoint.split("a", ["b", "c"], axis="0"), r"axis= takes an int"),
  ],
)
def test_bad_rule_arguments_say_what(make, match):
  with pytest.raises(lb.checkpoint.CheckpointError, match=match):
    make()


# --- transposed kernels and a fused qkv, found by running -----------------------------------


class TorchStyle(nnx.Module):
  """A Linear stored as PyTorch stores it: `weight` is `(out, in)`."""

  def __init__(self):
    self.weight = nnx.Param(jnp.zeros((3, 4)))
    self.bias = nnx.Param(jnp.zeros(3))

  def __call__(self, x):
    return x @ self.weight[...].T + self.bias[...]


def test_a_transposed_kernel_is_found_by_running():
  variables = _trained_like(nn.Dense(3).init(jax.random.key(1), X))
  port = TorchStyle()
  report = lb.checkpoint.linen_to_nnx(nn.Dense(3), variables, port, X)
  np.testing.assert_array_equal(port.weight[...], variables["params"]["kernel"].T)
  np.testing.assert_allclose(port(X), nn.Dense(3).apply(variables, X), rtol=1e-5, atol=1e-6)
  (placement,) = report.placements
  # (4, 3) -> (3, 4): a transpose or a reshape fit the shapes; only the transpose agrees.
  assert placement.transforms == ("lb.checkpoint.transpose('kernel', 'weight', axes=(1, 0))",)
  assert (placement.decided, placement.candidates) == ("module", 2)
  assert _same(lb.checkpoint.nnx_to_linen(port, nn.Dense(3), X), variables)


class SeparateQKV(nn.Module):
  @nn.compact
  def __call__(self, x):
    q, k, v = (nn.Dense(2, name=n)(x) for n in ("q", "k", "v"))
    return jax.nn.softmax(q @ k.T) @ v


class Attn(nnx.Module):
  def __init__(self, rngs):
    self.qkv = nnx.Linear(4, 6, rngs=rngs)

  def __call__(self, x):
    q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
    return jax.nn.softmax(q @ k.T) @ v


class FusedPort(nnx.Module):
  def __init__(self, rngs):
    self.attn = Attn(rngs)

  def __call__(self, x):
    return self.attn(x)


class SeparateLinen(nn.Module):
  @nn.compact
  def __call__(self, x):
    return SeparateQKV(name="attn")(x)


def test_a_fused_qkv_is_found_by_running_and_split_back():
  variables = _trained_like(SeparateLinen().init(jax.random.key(1), X))
  port = FusedPort(nnx.Rngs(0))
  report = lb.checkpoint.linen_to_nnx(SeparateLinen(), variables, port, X)
  attn = variables["params"]["attn"]
  np.testing.assert_array_equal(
    port.attn.qkv.kernel[...], np.concatenate([attn[n]["kernel"] for n in "qkv"], axis=1)
  )
  np.testing.assert_allclose(port(X), SeparateLinen().apply(variables, X), rtol=1e-5, atol=1e-6)
  (placement,) = report.placements
  assert placement.decided == "module" and placement.candidates == 36  # 3! orders, twice
  assert _same(lb.checkpoint.nnx_to_linen(port, SeparateLinen(), X), variables)


# --- a split inside a scanned stack: decided through the model's output ---------------------


class ScanMlp(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    wi = self.param("wi", nn.initializers.normal(1.0), (2, 4, 6))
    return x + nn.Dense(4, name="wo")(nn.gelu(x @ wi[0]) * (x @ wi[1])), None


class ScannedLinen(nn.Module):
  @nn.compact
  def __call__(self, x):
    stack = nn.scan(ScanMlp, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
    return stack(name="layers")(x, None)[0]


class PortMlp(nnx.Module):
  def __init__(self, rngs):
    self.gate = nnx.Linear(4, 6, use_bias=False, rngs=rngs)
    self.up = nnx.Linear(4, 6, use_bias=False, rngs=rngs)
    self.wo = nnx.Linear(6, 4, rngs=rngs)

  def __call__(self, x):
    return x + self.wo(nnx.gelu(self.gate(x)) * self.up(x))


class ScannedPort(nnx.Module):
  def __init__(self, rngs):
    @nnx.split_rngs(splits=3)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return PortMlp(rngs)

    self.layers = make(rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, layer):
      return layer(x)

    return run(x, self.layers)


@pytest.mark.parametrize("with_rule", [False, True])
def test_a_split_inside_a_scanned_stack(with_rule):
  variables = _trained_like(ScannedLinen().init(jax.random.key(1), X))
  rule = lb.checkpoint.split("layers/wi", ["layers/gate/kernel", "layers/up/kernel"], axis=0)
  rules = [rule] if with_rule else None
  port = ScannedPort(nnx.Rngs(0))
  report = lb.checkpoint.linen_to_nnx(ScannedLinen(), variables, port, X, rules=rules)
  np.testing.assert_allclose(port(X), ScannedLinen().apply(variables, X), rtol=1e-5, atol=1e-5)
  wi = np.asarray(variables["params"]["layers"]["wi"])  # (layers, 2, 4, 6)
  np.testing.assert_array_equal(port.layers.up.kernel[...], wi[:, 1])
  split = next(p for p in report.placements if p.transforms)
  assert split.transforms == (str(rule),)
  if not with_rule:  # inside nn.scan the calls are traced: the whole model decides
    assert (split.decided, split.checked) == ("model", "model")
  back = lb.checkpoint.nnx_to_linen(port, ScannedLinen(), X, rules=rules)
  assert _same(back, variables)


# --- equal-shape modules fed the same input: each assignment through the model, up to 720 ----


def _summed(n: int, weights: tuple[float, ...]):
  class Summed(nn.Module):
    """n Dense(4) fed the same input: their own outputs cannot tell an assignment."""

    @nn.compact
    def __call__(self, x):
      return sum(w * jnp.tanh(nn.Dense(4, name=f"b{i}")(x)) for i, w in enumerate(weights))

  class Port(nnx.Module):
    """Calls its layers in the reverse order, each with Linen's weight of its own layer."""

    def __init__(self, rngs):
      layers = [nnx.Linear(4, 4, rngs=rngs) for _ in range(n)]
      self.layers = nnx.List(layers) if hasattr(nnx, "List") else layers

    def __call__(self, x):
      out = 0.0
      for j in reversed(range(n)):
        out = out + weights[n - 1 - j] * jnp.tanh(self.layers[j](x))
      return out

  return Summed(), Port(nnx.Rngs(0))


@pytest.mark.parametrize("n", [5, pytest.param(6, marks=pytest.mark.slow)])
def test_equal_modules_fed_the_same_input_are_paired_through_the_model(n):
  model, port = _summed(n, tuple(float(i + 1) for i in range(n)))
  variables = _trained_like(model.init(jax.random.key(0), X))
  lb.checkpoint.linen_to_nnx(model, variables, port, X)
  other = jax.random.normal(jax.random.key(5), (3, 4))
  np.testing.assert_allclose(port(other), model.apply(variables, other), rtol=1e-5, atol=1e-5)
  for j in range(n):  # Linen's b{i} went where the port calls it (layers[n - 1 - i])
    np.testing.assert_array_equal(
      port.layers[n - 1 - j].kernel[...], variables["params"][f"b{j}"]["kernel"]
    )


def test_an_assignment_the_model_cannot_tell_is_refused_in_a_few_lines():
  # Equal weights: all 120 assignments agree on every input; the error lists a few to paste.
  model, port = _summed(5, (1.0,) * 5)
  variables = _trained_like(model.init(jax.random.key(0), X))
  with pytest.raises(lb.checkpoint.CheckpointError, match="120 different conversions") as error:
    lb.checkpoint.linen_to_nnx(model, variables, port, X)
  message = str(error.value)
  assert message.count("\n") < 12, message
  assert "(120 candidates; the first 3:)" in message
  assert message.count("candidate ") == 3 and "mapping={" in message
