"""Pytree sows and captures: one buffer per array leaf, read back as the sown structure.

Reference: plain Linen `apply(..., mutable=['intermediates'])` (with `capture_intermediates`
where the model is captured) step by step, feeding each output back; each recorded leaf must
equal the stack of that leaf over the steps. Compiled loops vs eager steps: RTOL/ATOL below.
"""

from __future__ import annotations

import warnings

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb

from conftest import graph_kw
from models import linen_feedback_steps, stack_reference

RTOL, ATOL = 1e-5, 1e-6


@flax.struct.dataclass
class Stats:
  mean: jax.Array
  top: jax.Array
  tag: str = flax.struct.field(pytree_node=False, default="stats")


class Attention(nn.Module):
  """Returns `(out, weights)`, as attention layers that expose their weights do."""

  @nn.compact
  def __call__(self, x):
    q = nn.Dense(4)(x)
    weights = jax.nn.softmax(q @ q.swapaxes(-1, -2) / 2.0, axis=-1)
    return weights @ q, weights


class Net(nn.Module):
  """Sows a dict holding a tuple with None, and a struct dataclass; its attention returns a
  tuple."""

  @nn.compact
  def __call__(self, x):
    h, w = Attention()(x)
    self.sow("intermediates", "pair", {"h": h, "rest": (w, None)})
    self.sow("intermediates", "stats", Stats(h.mean(-1), h.max(-1)))
    return jnp.tanh(nn.Dense(3)(h))


class Body(nn.Module):
  """An nn.scan body sowing a tuple: each leaf comes back stacked along the layer axis."""

  @nn.compact
  def __call__(self, carry, _):
    y = nn.relu(nn.Dense(3)(carry))
    self.sow("intermediates", "both", (y, y.sum(-1)))
    return y, None


class Scanned(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.scan(
      Body, variable_axes={"params": 0, "intermediates": 0}, split_rngs={"params": True}, length=2
    )(name="layers")(x, None)[0]


X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


def assert_tree_close(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def run_loop(kind, model, x, steps, graph=True):
  kw = graph_kw(graph)

  @nnx.jit
  def run(model, x):
    if kind == "fori":
      return nnx.fori_loop(0, steps, lambda i, c: (c[0], c[0](c[1])), (model, x), **kw)[0]
    if kind == "while":

      def body(c):
        m, y, i = c
        return m, m(y), i + 1

      return nnx.while_loop(lambda c: c[2] < steps, body, (model, x, jnp.asarray(0)), **kw)[0]

    def scan_body(c, _):
      m, y = c
      return (m, m(y)), None

    return nnx.scan(scan_body, length=steps, **kw)((model, x), None)[0][0]

  run(model, x)
  return model


@pytest.mark.parametrize("kind", ["fori", "while", "scan"])
def test_pytree_sows_and_tuple_capture_match_linen_in_jitted_loops(kind, graph):
  steps = 3
  model = lb.ToNNX(Net(), rngs=nnx.Rngs(0), capture_intermediates=True)
  lb.lazy_init(model, X, capacity=steps)
  run_loop(kind, model, X, steps, graph)
  ref = linen_feedback_steps(Net(), lb.linen_variables(model), X, steps, capture=True)
  rec = lb.recorded(model)["intermediates"]
  assert_tree_close(rec["pair"], stack_reference(ref, ("pair",)))
  assert_tree_close(rec["stats"], stack_reference(ref, ("stats",)))
  assert rec["stats"].tag == "stats" and rec["pair"]["rest"][1] is None
  assert_tree_close(
    rec["Attention_0"]["__call__"], stack_reference(ref, ("Attention_0", "__call__"))
  )
  assert rec["Attention_0"]["__call__"][1].shape == (steps, 2, 2)
  assert_tree_close(rec["__call__"], stack_reference(ref, ("__call__",)))
  # counts are shaped like the records: one per leaf, all equal
  counts = lb.counts(model)["intermediates"]["Attention_0"]["__call__"]
  assert [int(c) for c in counts] == [steps, steps]


def test_pytree_sow_inside_nn_scan_stacks_every_leaf(graph):
  steps = 2
  model = lb.ToNNX(Scanned(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, X, capacity=steps)
  run_loop("fori", model, X, steps, graph)
  ref = linen_feedback_steps(Scanned(), lb.linen_variables(model), X, steps)
  got = lb.recorded(model)["intermediates"]["layers"]["both"]
  want = stack_reference(ref, ("layers", "both"))
  assert want[0].shape == (steps, 2, 2, 3) and want[1].shape == (steps, 2, 2)
  assert_tree_close(got, want)
  sites = lb.sow_sites(model)
  assert [s.label for s in sites] == ["layers/both[0]", "layers/both[1]"]
  assert all(s.transforms[0].length == 2 for s in sites)


@pytest.mark.parametrize("overflow", ["error", "drop", "wrap"])
def test_overflow_policies_apply_to_every_leaf(overflow):
  capacity, steps = 2, 3
  model = lb.ToNNX(Net(), rngs=nnx.Rngs(0), overflow=overflow)
  lb.lazy_init(model, X, capacity=capacity)
  y = X
  for _ in range(steps):
    y = model(y)
  ref = stack_reference(linen_feedback_steps(Net(), lb.linen_variables(model), X, steps), ("pair",))
  if overflow == "error":
    with pytest.raises(lb.BufferOverflowError, match=r"pair/h recorded 3 values"):
      lb.recorded(model)
    return
  keep = slice(0, capacity) if overflow == "drop" else slice(steps - capacity, steps)
  assert_tree_close(
    lb.recorded(model)["intermediates"]["pair"], jax.tree.map(lambda a: a[keep], ref)
  )


def test_reset_inside_a_jitted_loop_clears_every_leaf():
  model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, X, capacity=4)

  @nnx.jit
  def run(model, x):
    def body(i, c):
      m, y = c
      lb.reset(m)  # only the last step stays recorded
      return m, m(y)

    return nnx.fori_loop(0, 3, body, (model, x))

  run(model, X)
  ref = linen_feedback_steps(Net(), lb.linen_variables(model), X, 3)
  assert_tree_close(
    lb.recorded(model)["intermediates"]["stats"], stack_reference(ref[2:], ("stats",))
  )


def test_capacity_keys_name_the_sow_and_cover_all_its_leaves():
  model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, X, capacity={"pair": 2, "st*": 5})
  shapes = jax.tree.map(lambda b: b.shape, lb.buffers(model))["intermediates"]
  assert shapes["pair"] == {"h": (2, 2, 4), "rest": ((2, 2, 2), None)}
  assert shapes["stats"].mean == (5, 2) and shapes["stats"].top == (5, 2)
  with pytest.raises(
    lb.CapacityError,
    match=r"no capacity key covers sow site\(s\) "
    r"intermediates/stats",
  ):
    lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), X, capacity={"pair": 2})


def test_sow_sites_has_one_row_per_leaf():
  model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, X, capacity=3)
  sites = lb.sow_sites(model)
  assert [s.label for s in sites] == ["pair[h]", "pair[rest][0]", "stats[mean]", "stats[top]"]
  assert sites["pair[rest][0]"].shape == (2, 2)
  assert {s.name for s in sites} == {"pair", "stats"}  # the capacity key of every leaf
  assert "pair[rest][0]" in str(sites)
  assert sites.to_dict()["sites"][1]["leaf"] == ["rest", "0"]


class Switch(nn.Module):
  @nn.compact
  def __call__(self, x, as_dict=False):
    self.sow("intermediates", "v", {"a": x} if as_dict else (x, x))
    return x


def test_a_changed_pytree_structure_is_a_clear_error_and_writes_nothing():
  model = lb.ToNNX(Switch(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, X, capacity=3)
  model(X)
  with pytest.raises(
    lb.NotDeclaredError,
    match=r"declared for a pytree of structure .* "
    r"Fix: declare this call signature",
  ):
    model(X, as_dict=True)
  assert [int(c) for c in lb.counts(model)["intermediates"]["v"]] == [1, 1]


def test_preallocate_a_new_leaf_shape_keeps_the_structure():
  model = lb.ToNNX(Switch(), rngs=nnx.Rngs(0))
  lb.lazy_init(model, X, capacity=3)
  wider = jnp.ones((2, 5))
  lb.preallocate(model, wider, capacity=3)
  model(wider)
  got = lb.recorded(model)["intermediates"]["v"]
  assert_tree_close(got, (wider[None], wider[None]))


def test_compile_step_and_explain_see_pytree_buffers():
  model = lb.ToNNX(Net(), rngs=nnx.Rngs(0), capture_intermediates=True)
  lb.lazy_init(model, X, capacity=3)
  step = lb.compile_step(lambda m, x: m(x), model)
  y = X
  for _ in range(3):
    y = step(y)
  ref = linen_feedback_steps(Net(), lb.linen_variables(model), X, 3, capture=True)
  assert_tree_close(
    lb.recorded(model)["intermediates"]["Attention_0"]["__call__"],
    stack_reference(ref, ("Attention_0", "__call__")),
  )
  report = lb.explain(lambda m: (m(X), m)[1], model)
  assert report.ok, str(report)


def test_checkpoint_round_trip_keeps_pytree_records(tmp_path):
  def fresh():
    return lb.lazy_init(
      lb.ToNNX(Net(), rngs=nnx.Rngs(0), capture_intermediates=True, overflow="wrap"), X, capacity=2
    )

  whole, first = fresh(), fresh()
  y = X
  for _ in range(3):
    y = whole(y)
  y = first(first(X))
  resumed = lb.checkpoint.restore(lb.checkpoint.save(tmp_path / "c", first), fresh())
  resumed(y)
  assert_tree_close(lb.recorded(resumed), lb.recorded(whole))
  assert jax.tree.structure(lb.counts(resumed)) == jax.tree.structure(lb.counts(whole))


def test_native_pytree_sow_is_a_clear_error_naming_the_fix():
  class Native(nnx.Module):
    def __init__(self, rngs):
      self.lin = nnx.Linear(2, 3, rngs=rngs)

    def __call__(self, x):
      h = self.lin(x)
      self.sow(nnx.Intermediate, "h", (h, h.sum()))
      return h

  with pytest.raises(
    lb.NotDeclaredError,
    match=r"native sows of a pytree .* not recorded leaf "
    r"by leaf yet.*one `sow` per leaf",
  ):
    lb.preallocate(Native(nnx.Rngs(0)), jnp.ones((1, 2)), capacity=4)


class _PickedPair(nn.Module):
  @nn.compact
  def __call__(self, x, pick=slice(None)):
    h = nn.Dense(3)(x)[pick]
    self.sow("intermediates", "pair", (h, h.sum()))
    return h


def test_pytree_sow_redeclared_with_a_new_leaf_shape_starts_every_leaf_empty():
  """A re-declaration of one signature (a `slice` argument is not part of its label) where
  one leaf's shape changes: keeping the scalar leaf's record while the array leaf starts
  empty would pair values of different calls (issue 24, defect 3). Every leaf starts empty,
  with a warning."""
  model = lb.ToNNX(_PickedPair(), rngs=nnx.Rngs(0))
  x = jnp.arange(6.0).reshape(2, 3)
  lb.lazy_init(model, x, capacity=4, pick=slice(0, 1))
  model(x, pick=slice(0, 1))
  assert {s.slot for s in lb.sow_sites(model)} == {0}
  # Recorded rather than pytest.warns: that re-attributes jax 0.5's own deprecation warnings
  # raised inside the block to this file, where they are errors.
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", lb.RecordsDiscardedWarning)
    lb.preallocate(model, x, capacity=4, pick=slice(0, 2))
  discarded = [str(w.message) for w in caught if w.category is lb.RecordsDiscardedWarning]
  assert len(discarded) == 2 and all("pair" in text for text in discarded), discarded
  assert {s.slot for s in lb.sow_sites(model)} == {0}
  model(x, pick=slice(0, 2))
  out, total = lb.recorded(model)["intermediates"]["pair"]
  _, want = _PickedPair().apply(
    lb.linen_variables(model), x, pick=slice(0, 2), mutable=["intermediates"]
  )
  want_out, want_total = want["intermediates"]["pair"][0]
  assert out.shape == (1, 2, 3) and total.shape == (1,)
  np.testing.assert_allclose(out[0], want_out, rtol=1e-6)
  np.testing.assert_allclose(total[0], want_total, rtol=1e-6)


def test_bridged_pytree_sow_declared_for_a_new_batch_size_keeps_both_signatures():
  class Pair(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.Dense(3)(x)
      self.sow("intermediates", "pair", (h, h.sum()))
      return h

  model = lb.ToNNX(Pair(), rngs=nnx.Rngs(0))
  x1, x2 = jnp.ones((1, 3)), jnp.arange(6.0).reshape(2, 3)
  lb.lazy_init(model, x1, capacity=4)
  model(x1)
  lb.preallocate(model, x2, capacity=4)
  model(x2)
  model(x2)
  variables = lb.linen_variables(model)
  for x, label, n in ((x1, "(float32[1,3])", 1), (x2, "(float32[2,3])", 2)):
    out, total = lb.recorded(model, signature=label)["intermediates"]["pair"]
    _, want = Pair().apply(variables, x, mutable=["intermediates"])
    want_out, want_total = want["intermediates"]["pair"][0]
    assert out.shape == (n, *x.shape) and total.shape == (n,)
    np.testing.assert_allclose(out[-1], want_out, rtol=1e-6)
    np.testing.assert_allclose(total[-1], want_total, rtol=1e-6)
