"""Nothing lost, nothing silently wrong: calls are all-or-nothing, re-declarations keep records,
counts never wrap, reads before a declaration and impossible capacities are clear errors.

References: plain Linen `apply(mutable=['intermediates'])` step by step for recorded values.
"""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge._core import buffers as _buffers
from loopbridge._core import recorder as _recorder

RTOL, ATOL = 1e-5, 1e-6


class TwoSites(nn.Module):
  @nn.compact
  def __call__(self, x, branch=False):
    self.sow("intermediates", "a", x)
    h = nn.Dense(4)(x)
    # The second site sows another shape on the branch: that call must fail as a whole.
    self.sow("intermediates", "b", jnp.concatenate([h, h], -1) if branch else h)
    return h


def _linen_steps(variables, xs):
  """{site: Array[n, ...]} of plain Linen, one apply per input."""
  got = {"a": [], "b": []}
  for x in xs:
    _, upd = TwoSites().apply(variables, x, mutable=["intermediates"])
    for k in got:
      got[k].append(upd["intermediates"][k][0])
  return {k: jnp.stack(v) for k, v in got.items()}


def _model(capacity=4, overflow="error"):
  model = lb.ToNNX(TwoSites(), rngs=nnx.Rngs(0))
  return lb.lazy_init(model, jnp.ones((1, 3)), capacity=capacity, overflow=overflow)


def test_a_call_that_fails_at_its_second_site_writes_no_site():
  model = _model()
  x = jnp.arange(3.0)[None]
  model(x)
  with pytest.raises(lb.NotDeclaredError, match="intermediates/b received a value of shape"):
    model(x + 1, branch=True)
  counts = lb.counts(model)["intermediates"]
  assert {k: int(v) for k, v in counts.items()} == {"a": 1, "b": 1}
  model(x + 2)
  want = _linen_steps(lb.linen_variables(model), [x, x + 2])
  for k in ("a", "b"):
    np.testing.assert_allclose(
      lb.recorded(model)["intermediates"][k], want[k], rtol=RTOL, atol=ATOL
    )


@pytest.mark.parametrize(
  "old_policy,new_policy",
  [("error", "error"), ("error", "wrap"), ("wrap", "drop"), ("drop", "wrap")],
)
def test_preallocate_with_a_larger_capacity_or_another_policy_keeps_the_records(
  old_policy, new_policy
):
  model = _model(capacity=3, overflow=old_policy)
  xs = [jnp.full((1, 3), float(i)) for i in range(5)]
  for x in xs[:2]:
    model(x)
  lb.preallocate(model, xs[0], capacity=4, overflow=new_policy)  # grows: nothing is lost
  for x in xs[2:]:
    model(x)
  want = _linen_steps(lb.linen_variables(model), xs)
  if new_policy == "wrap":  # 5 values into 4 slots: the last 4
    want = {k: v[1:] for k, v in want.items()}
  elif new_policy == "drop":
    want = {k: v[:4] for k, v in want.items()}
  else:
    with pytest.raises(lb.BufferOverflowError):
      lb.recorded(model)
    return
  got = lb.recorded(model)["intermediates"]
  for k in ("a", "b"):
    np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL)


def _discarded(fn, *args, **kwargs) -> list[str]:
  """Messages of the RecordsDiscardedWarnings `fn` raised (other warnings, e.g. deprecations
  inside jax 0.5 under eval_shape, are left to the suite's filters)."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", lb.RecordsDiscardedWarning)
    fn(*args, **kwargs)
  return sorted(
    str(w.message) for w in caught if issubclass(w.category, lb.RecordsDiscardedWarning)
  )


def test_preallocate_after_an_overflow_says_how_many_values_were_already_lost():
  model = _model(capacity=2, overflow="wrap")
  xs = [jnp.full((1, 3), float(i)) for i in range(3)]
  for x in xs:
    model(x)
  texts = _discarded(lb.preallocate, model, xs[0], capacity=8)
  assert len(texts) == 2  # sites a and b
  assert all(
    "sown 3 times into capacity 2, so 1 value(s) were already not stored" in t for t in texts
  )
  want = _linen_steps(lb.linen_variables(model), xs[1:])
  np.testing.assert_allclose(lb.recorded(model)["intermediates"]["a"], want["a"])


def test_preallocate_for_another_signature_keeps_the_first_signatures_records():
  model = _model(capacity=3)
  model(jnp.ones((1, 3)))
  assert not _discarded(lb.preallocate, model, jnp.ones((2, 3)), capacity=3)
  assert lb.recorded(model)["intermediates"]["a"].shape == (1, 1, 3)  # 0.2 discarded it
  model(jnp.ones((2, 3)))
  assert lb.recorded(model, signature="(float32[1,3])")["intermediates"]["a"].shape == (1, 1, 3)
  assert lb.recorded(model, signature="(float32[2,3])")["intermediates"]["a"].shape == (1, 2, 3)


class _NativeTwoSites(nnx.Module):
  def __call__(self, x):
    self.sow(nnx.Intermediate, "a", x)
    self.sow(nnx.Intermediate, "b", 2 * x)
    return x


def test_native_preallocate_for_a_new_value_shape_warns_that_records_are_discarded():
  """Native sows keep one signature per site: a new value shape replaces its buffer."""
  model = lb.preallocate(_NativeTwoSites(), jnp.ones((1, 3)), capacity=3)
  model(jnp.ones((1, 3)))
  texts = _discarded(lb.preallocate, model, jnp.ones((2, 3)), capacity=3)
  assert len(texts) == 2  # one per site that held records
  assert "intermediates/a held 1 recorded value(s)" in texts[0] and "(2, 3) float32" in texts[0]
  assert "intermediates/b held 1 recorded value(s)" in texts[1]
  assert lb.recorded(model)["intermediates"]["a"].shape == (0, 2, 3)


def test_preallocate_of_empty_buffers_for_a_new_shape_is_silent():
  assert not _discarded(lb.preallocate, _model(capacity=3), jnp.ones((2, 3)), capacity=3)


def test_a_count_at_the_int32_limit_stops_there_and_reading_is_an_error():
  model = _model(capacity=2, overflow="wrap")
  model(jnp.ones((1, 3)))
  (site,) = [s for s in _recorder.sites_of(model) or () if s.key == ("intermediates", "a")]
  _buffers.set_site_count(model.loopbridge__counts, site.count_index, _buffers.COUNT_LIMIT - 1)
  model(jnp.ones((1, 3)))
  model(jnp.ones((1, 3)))
  assert int(lb.counts(model)["intermediates"]["a"]) == _buffers.COUNT_LIMIT  # not negative
  assert int(lb.counts(model)["intermediates"]["b"]) == 3  # the other site's entry counts on
  with pytest.raises(lb.BufferOverflowError, match=r"largest count an int32 holds.*lb.reset"):
    lb.recorded(model)
  lb.reset(model)
  assert lb.recorded(model)["intermediates"]["a"].shape == (0, 1, 3)


@pytest.mark.parametrize("read", [lb.recorded, lb.counts, lb.buffers, lb.reset])
def test_reading_a_model_that_declared_nothing_is_not_initialized(read):
  with pytest.raises(lb.NotDeclaredError, match=r"lb\.ToNNX\(TwoSites\) has not declared"):
    read(lb.ToNNX(TwoSites(), rngs=nnx.Rngs(0)))
  with pytest.raises(lb.NotDeclaredError, match="Linear holds no loopbridge buffers"):
    read(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))


def test_a_capacity_that_cannot_fit_is_refused_before_allocating():
  model = lb.ToNNX(TwoSites(), rngs=nnx.Rngs(0))
  with pytest.raises(
    lb.CapacityError,
    match=r"need [\d,]+ bytes per device but only .* Fix: a "
    r"smaller capacity",
  ):
    lb.lazy_init(model, jnp.ones((1, 3)), capacity=10**12)
  assert lb.preallocate(_model(), jnp.ones((1, 3)), capacity=8) is not None


@pytest.mark.parametrize("policy", ["drop", "wrap", "error"])
def test_a_smaller_capacity_than_the_records_held_warns_and_keeps_what_the_policy_says(policy):
  model = _model(capacity=4, overflow=policy)
  xs = [jnp.full((1, 3), float(i)) for i in range(3)]
  for x in xs:
    model(x)
  texts = _discarded(lb.preallocate, model, xs[0], capacity=2)
  assert len(texts) == 2  # sites a and b
  assert all("held 3 recorded value(s) and is re-declared with capacity 2" in t for t in texts)
  assert all("Fix: declare a capacity of at least 3" in t for t in texts)
  want = _linen_steps(lb.linen_variables(model), xs)
  if policy == "error":
    assert "raises BufferOverflowError" in texts[0]
    with pytest.raises(lb.BufferOverflowError):
      lb.recorded(model)
    return
  keep = slice(1, None) if policy == "wrap" else slice(None, 2)
  assert ("oldest 1 are discarded" if policy == "wrap" else "latest 1 are discarded") in texts[0]
  np.testing.assert_allclose(
    lb.recorded(model)["intermediates"]["a"], want["a"][keep], rtol=RTOL, atol=ATOL
  )


@pytest.mark.parametrize("policy", ["drop", "wrap"])
def test_preallocate_with_only_a_capacity_keeps_the_declared_policy(policy):
  model = _model(capacity=2, overflow=policy)
  xs = [jnp.full((1, 3), float(i)) for i in range(4)]
  lb.preallocate(model, xs[0], capacity=3)  # no overflow=: the site stays `policy`
  assert {s.overflow for s in lb.sow_sites(model)} == {policy}
  for x in xs:
    model(x)
  want = _linen_steps(lb.linen_variables(model), xs)["b"]
  got = lb.recorded(model)["intermediates"]["b"]  # 4 calls into 3 slots: no overflow error
  np.testing.assert_allclose(got, want[1:] if policy == "wrap" else want[:3], rtol=RTOL, atol=ATOL)
  lb.reset(model)
  lb.preallocate(model, xs[0], capacity=3, overflow="error")  # an explicit policy still wins
  assert {s.overflow for s in lb.sow_sites(model)} == {"error"}
