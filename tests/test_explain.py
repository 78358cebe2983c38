"""lb.explain: one abstract loop step, reported as readable changes of the loop carry.

Each test builds a carry whose change is known by construction (a sow appended, a Variable
replaced, a shape changed, ...) and checks the report names exactly that change, at that path,
with the right before/after description; the unchanged carry must report ok.
"""

from __future__ import annotations

import json

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx import bridge

import loopbridge as lb
from loopbridge import _compat

from models import MLP

# flax 0.12 deprecates `Module.sow` outside `nnx.capture` (0.10 has no capture); the native sow
# is exactly what users' loops do and what these tests explain, so the warning is expected here.
pytestmark = pytest.mark.filterwarnings(
  r"ignore:Using 'Module\.sow\(\)' outside of 'nnx\.capture\(\)':DeprecationWarning"
)


class Sower(nnx.Module):
  """A native NNX module that sows its output on every call."""

  def __init__(self):
    self.linear = nnx.Linear(3, 3, rngs=nnx.Rngs(0))

  def __call__(self, x):
    y = self.linear(x)
    self.sow(nnx.Intermediate, "y", y)
    return y


class Holder(nnx.Module):
  """Holds a (possibly shared) submodule."""

  def __init__(self, sub):
    self.sub = sub


def model_step(carry):
  model, x = carry
  return model, model(x)


def kinds(report):
  return [(c.kind, c.path) for c in report.changes]


def test_unchanged_carry_is_ok():
  shared = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  carry = {"a": Holder(shared), "b": Holder(shared), "x": jnp.ones((1, 2)), "n": 0}

  def step(c):
    _compat.set_variable_value(c["a"].sub.kernel, _compat.variable_value(c["a"].sub.kernel) * 2)
    return {**c, "x": c["b"].sub(c["x"]), "n": c["n"] + 1}

  report = lb.explain(step, carry)
  assert report.ok
  assert report.changes == []
  assert report.checked == {"modules": 3, "variables": 2, "arrays": 2}
  assert "keeps the loop carry's structure" in str(report)
  assert report.to_dict()["ok"] is True


def test_native_sow_tuple_growing():
  model, x = Sower(), jnp.ones((1, 3))
  model(x)  # one value sown before the loop: the tuple now holds 1
  report = lb.explain(model_step, (model, x))
  assert not report.ok
  assert kinds(report) == [("sow", "carry[0].y")]
  change = report.changes[0]
  assert (change.before, change.after) == (
    "Intermediate holding a tuple of 1",
    "Intermediate holding a tuple of 2",
  )
  assert "sow tuple grew from 1 to 2 values (Intermediate, float32[1,3] each)" in change.message
  text = str(report)
  assert "lb.preallocate(model" in text and "lb.ToNNX(" in text and "capacity=N" in text
  # The caller's model was not touched (the step ran on an abstract copy).
  assert len(_compat.variable_value(model.y)) == 1


def test_native_sow_fixed_by_preallocate():
  """The fix the report names for native sows: after lb.preallocate the step is ok."""
  model, x = Sower(), jnp.ones((1, 3))
  assert not lb.explain(model_step, (model, x)).ok
  lb.preallocate(model, x, capacity=4)
  assert lb.explain(model_step, (model, x)).ok


def test_native_first_sow_is_a_new_tuple():
  report = lb.explain(model_step, (Sower(), jnp.ones((1, 3))))
  assert kinds(report) == [("sow", "carry[0].y")]
  assert "new sow tuple of 1 value (Intermediate, float32[1,3] each)" in report.changes[0].message


def _stock_seed_model():
  x = jnp.ones((1, 4))
  model = bridge.ToNNX(MLP(depth=2, features=4), rngs=nnx.Rngs(0))
  bridge.lazy_init(model, x)
  return model, x


def stock_step(carry):
  model, x = carry
  return model, model(x, mutable=True)


def test_stock_bridge_first_call_adds_sow_tuples():
  # The seed-000 failure: after bridge.lazy_init, each mutable call gains Variables holding
  # the sown tuples (under the Linen 'intermediates' paths).
  model, x = _stock_seed_model()
  report = lb.explain(stock_step, (model, x))
  sows = {c.path: c.message for c in report.changes if c.kind == "sow"}
  assert set(sows) == {"carry[0].ScanBlock_0['carry']", "carry[0].x"}
  assert (
    "new sow tuple of 1 value (Intermediate, float32[2,1,4] each)"
    in (sows["carry[0].ScanBlock_0['carry']"])
  )
  assert "new sow tuple of 1 value (Intermediate, float32[1,4] each)" in sows["carry[0].x"]
  assert not any(c.kind == "added" for c in report.changes)  # reported as sows, not noise
  assert all(c.owner == "flax.nnx.bridge.ToNNX" for c in report.changes)
  # Stock ToNNX also rebuilds the updated collections' Variables (the scan params here).
  replaced = {c.path for c in report.changes if c.kind == "replaced"}
  assert replaced == {
    "carry[0].ScanBlock_0['Dense_0']['bias']",
    "carry[0].ScanBlock_0['Dense_0']['kernel']",
  }
  text = str(report)
  assert "stock flax.nnx.bridge.ToNNX" in text
  assert "lb.ToNNX(linen_module, rngs=...)" in text and "capacity=N" in text


@pytest.mark.skipif(
  not _compat.HAS_GRAPH_SWITCH,
  reason=f"flax {'.'.join(map(str, _compat.FLAX_VERSION))}: stock ToNNX does not grow the sow "
  "tuple on later calls (it rebuilds its Variable with another type); the first call is "
  "covered by test_stock_bridge_first_call_adds_sow_tuples",
)
def test_stock_bridge_sow_tuple_growing():
  model, x = _stock_seed_model()
  model(x, mutable=True)  # as in the seed: the first call creates the tuples
  report = lb.explain(stock_step, (model, x))
  sows = [c for c in report.changes if c.kind == "sow"]
  assert [c.path for c in sows] == ["carry[0].ScanBlock_0['carry']", "carry[0].x"]
  assert "grew from 1 to 2 values (Intermediate, float32[2,1,4] each)" in sows[0].message
  assert "grew from 1 to 2 values (Intermediate, float32[1,4] each)" in sows[1].message
  assert {c.kind for c in report.changes} == {"sow", "replaced"}


def test_lb_to_nnx_seed_model_is_ok():
  x = jnp.ones((1, 4))
  model = lb.ToNNX(MLP(depth=2, features=4), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=3)
  assert lb.explain(stock_step, (model, x)).ok


def test_variable_replaced():
  def step(model):
    model.linear.kernel = nnx.Param(_compat.variable_value(model.linear.kernel) + 1)
    return model

  report = lb.explain(step, Sower())
  assert kinds(report) == [("replaced", "carry.linear.kernel")]
  assert report.changes[0].before == report.changes[0].after == "Param float32[3,3]"
  assert "write into the existing Variable" in str(report)


def test_module_replaced_is_one_change():
  def step(carry):
    model, x = carry
    model.linear = nnx.merge(*nnx.split(model.linear))  # an equal copy, but a new object
    return model, x

  report = lb.explain(step, (Sower(), jnp.ones((1, 3))))
  assert kinds(report) == [("replaced", "carry[0].linear")]
  assert report.changes[0].message == "carry[0].linear: module replaced by a new Linear object"


def test_shape_change():
  def step(carry):
    model, x = carry
    _compat.set_variable_value(model.linear.bias, jnp.zeros((4,)))
    return model, jnp.concatenate([x, x])

  report = lb.explain(step, (Sower(), jnp.ones((1, 3))))
  assert kinds(report) == [("shape", "carry[0].linear.bias"), ("shape", "carry[1]")]
  assert [(c.before, c.after) for c in report.changes] == [
    ("float32[3]", "float32[4]"),
    ("float32[1,3]", "float32[2,3]"),
  ]


def test_dtype_change():
  report = lb.explain(lambda c: (c[0], c[1].astype(jnp.bfloat16)), (Sower(), jnp.ones(3)))
  assert kinds(report) == [("dtype", "carry[1]")]
  assert (report.changes[0].before, report.changes[0].after) == ("float32[3]", "bfloat16[3]")
  assert "astype" in str(report)


def test_added_attribute():
  def step(model):
    model.extra = nnx.BatchStat(jnp.zeros(5))
    return model

  report = lb.explain(step, Sower())
  assert kinds(report) == [("added", "carry.extra")]
  assert report.changes[0].after == "BatchStat float32[5]"
  assert "create every attribute" in str(report)


def test_sharing_broken():
  shared = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  carry = (Holder(shared), Holder(shared))

  def step(carry):
    a, b = carry
    b.sub = nnx.clone(b.sub)  # same structure and values, but no longer the same object
    return a, b

  report = lb.explain(step, carry)
  assert kinds(report) == [("sharing", "carry[0].sub")]
  assert report.changes[0].message == (
    "carry[0].sub and carry[1].sub were one shared Linear before the step and are 2 "
    "different objects after it"
  )
  assert "keep shared submodules" in str(report)


def test_sharing_joined():
  carry = (Holder(nnx.Linear(2, 2, rngs=nnx.Rngs(0))), Holder(nnx.Linear(2, 2, rngs=nnx.Rngs(1))))

  def step(carry):
    a, b = carry
    b.sub = a.sub
    return a, b

  report = lb.explain(step, carry)
  assert kinds(report) == [("sharing", "carry[0].sub")]
  assert "were 2 different objects before the step and are one shared object" in (
    report.changes[0].message
  )


def test_removed_and_static_and_container_changes():
  def step(carry):
    model, x, n = carry
    del model.linear
    model.note = "changed"
    return [model, x, n]

  model = Sower()
  model.note = "original"
  report = lb.explain(step, (model, jnp.ones(2), 0))
  assert kinds(report) == [
    ("removed", "carry[0].linear"),
    ("static", "carry[0].note"),
    ("container", "carry"),
  ]
  assert report.changes[1].before == "'original'"


def test_extra_args_and_report_dict_is_json():
  def step(carry, scale):
    model, x = carry
    return model, model(x * scale)

  report = lb.explain(step, (Sower(), jnp.ones((1, 3))), 2.0)
  data = json.loads(json.dumps(report.to_dict()))
  assert data["ok"] is False and data["body"] == "step"
  assert [c["kind"] for c in data["changes"]] == ["sow"]
  assert data["fixes"] and "sow" in data["fixes"][0]
  assert repr(report) == "StructureReport(ok=False, changes=1)"


def test_raise_on_change():
  with pytest.raises(lb.StructureChangeError, match=r"carry\[0\]\.y: new sow tuple of 1 value"):
    lb.explain(model_step, (Sower(), jnp.ones((1, 3))), raise_on_change=True)
  # No change: returns the report.
  assert lb.explain(lambda c: c, (Sower(), 1), raise_on_change=True).ok


def test_explain_runs_no_flops_and_leaves_caller_untouched():
  model = Sower()
  kernel = np.asarray(_compat.variable_value(model.linear.kernel))
  calls = []

  def step(carry):
    model, x = carry
    calls.append(type(x))
    _compat.set_variable_value(model.linear.kernel, _compat.variable_value(model.linear.kernel) * 0)
    return model, model(x)

  lb.explain(step, (model, jnp.ones((1, 3))))
  assert len(calls) == 1 and issubclass(calls[0], jax.core.Tracer)  # abstract, traced once
  np.testing.assert_array_equal(_compat.variable_value(model.linear.kernel), kernel)
  assert not hasattr(model, "y")
