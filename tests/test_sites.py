"""lb.sow_sites: one record per sow site, checked against what plain Linen returns.

Reference for shapes and sows-per-call: `module.apply(..., mutable=["intermediates"])` (the
tuple Linen builds per site). Reference for the lifted axis/length: the model definitions.
"""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util

import loopbridge as lb
from loopbridge._core import site as _site
from loopbridge._diagnostics import sow_sites as _sites

from models import MLP

W = 4  # feature width of every test model


class Dense(nn.Module):
  """Dense + a sow of its output (the body of most test transforms)."""

  @nn.compact
  def __call__(self, x, _=None):
    h = nn.Dense(W)(x)
    self.sow("intermediates", "h", h)
    return h, None


class TopLevel(nn.Module):
  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    self.sow("intermediates", "twice", x.sum())
    self.sow("intermediates", "twice", x.sum() * 2)
    return x


class SetupDefined(nn.Module):
  def setup(self):
    self.first = Dense()
    self.second = Dense()

  def __call__(self, x):
    return self.second(self.first(x)[0])[0]


class ScanAxis(nn.Module):
  axis: int = 0
  reverse: bool = False
  length: int = 3

  @nn.compact
  def __call__(self, x):
    scan = nn.scan(
      Dense,
      variable_axes={"params": 0, "intermediates": self.axis},
      split_rngs={"params": True},
      length=self.length,
      reverse=self.reverse,
    )
    return scan(name="layers")(x, None)[0]


class Nested(nn.Module):
  """Outer scan (axis 0, length 3) of an inner scan (axis 1, length 2)."""

  @nn.compact
  def __call__(self, x):
    inner = nn.scan(
      Dense, variable_axes={"params": 0, "intermediates": 1}, split_rngs={"params": True}, length=2
    )

    class Outer(nn.Module):
      @nn.compact
      def __call__(self, c, _):
        return inner(name="inner")(c, None)[0], None

    outer = nn.scan(
      Outer, variable_axes={"params": 0, "intermediates": 0}, split_rngs={"params": True}, length=3
    )
    return outer(name="outer")(x, None)[0]


class Remat(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.remat(Dense)(name="block")(x)[0]


class ScanRemat(nn.Module):
  """The Gemma shape (scan of remat, built in setup) with the collection carried."""

  def setup(self):
    self.layers = nn.scan(
      nn.remat(Dense),
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      length=2,
    )()

  def __call__(self, x):
    return self.layers(x, None)[0]


class Vmap(nn.Module):
  @nn.compact
  def __call__(self, xs):
    vm = nn.vmap(
      Dense,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      in_axes=(0, None),
    )
    return vm(name="batched")(xs, None)[0]


def linen_reference(module, x):
  """{path: (entry shape, entries per call, dtype)} from plain Linen (abstractly: shapes only)."""

  def init_and_apply():
    variables = module.init(jax.random.key(0), x)
    return module.apply(variables, x, mutable=["intermediates"])[1]

  state = jax.eval_shape(init_and_apply)
  return {
    path: (tuple(v[0].shape), len(v), str(v[0].dtype))
    for path, v in traverse_util.flatten_dict(dict(state["intermediates"])).items()
  }


def report_for(module, x, capacity=5):
  model = lb.ToNNX(module, rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity=capacity)
  return lb.sow_sites(model)


def check_against_linen(report, module, x, capacity):
  ref = linen_reference(module, x)
  assert {s.path for s in report} == set(ref)
  for site in report:
    shape, per_call, dtype = ref[site.path]
    assert (site.shape, site.per_call, site.dtype) == (shape, per_call, dtype)
    assert site.capacity == capacity
    assert site.buffer_bytes == capacity * int(np.prod(shape)) * np.dtype(dtype).itemsize
  assert report.buffer_bytes == sum(s.buffer_bytes for s in report)


def stacked(site):
  return [(t.kind, t.axis, t.length, t.reverse) for t in site.transforms]


def test_top_level_sows():
  x = jnp.ones((1, W))
  report = report_for(TopLevel(), x, capacity=4)
  check_against_linen(report, TopLevel(), x, 4)
  assert report["x"].transforms == () and not report["x"].lifted
  assert report["twice"].per_call == 2
  assert report["twice"].calls_to_fill == 2
  assert report["x"].sown_shape == (1, W)


def test_setup_defined_submodules():
  x = jnp.ones((2, W))
  report = report_for(SetupDefined(), x)
  check_against_linen(report, SetupDefined(), x, 5)
  assert [s.name for s in report] == ["first/h", "second/h"]


@pytest.mark.parametrize("axis,length", [(0, 3), (1, 3), (1, 2)])
def test_scan_axis_and_length(axis, length):
  # (1, 3): the batch size equals the scan length, so the axis is not recoverable from
  # shapes alone.
  x = jnp.ones((3, W))
  module = ScanAxis(axis=axis, length=length)
  report = report_for(module, x)
  check_against_linen(report, module, x, 5)
  site = report["layers/h"]
  assert site.lifted and site.sown_shape == (3, W)
  assert stacked(site) == [("scan", axis, length, False)]
  assert site.transforms[0].path == ("layers",)


def test_scan_reverse():
  x = jnp.ones((1, W))
  module = ScanAxis(reverse=True, length=2)
  report = report_for(module, x)
  check_against_linen(report, module, x, 5)
  assert stacked(report["layers/h"]) == [("scan", 0, 2, True)]
  assert "scan(axis=0, len=2, reverse)" in str(report)


def test_nested_scans():
  x = jnp.ones((1, W))
  report = report_for(Nested(), x)
  check_against_linen(report, Nested(), x, 5)
  site = report["outer/inner/h"]
  assert site.shape == (3, 1, 2, W)
  assert stacked(site) == [("scan", 0, 3, False), ("scan", 1, 2, False)]
  assert [t.path for t in site.transforms] == [("outer",), ("outer", "inner")]


def test_remat_adds_no_axis():
  x = jnp.ones((1, W))
  report = report_for(Remat(), x)
  check_against_linen(report, Remat(), x, 5)
  site = report["block/h"]
  assert stacked(site) == [("remat", None, None, False)]
  assert not site.lifted


def test_scan_of_remat_in_setup():
  x = jnp.ones((1, W))
  report = report_for(ScanRemat(), x)
  check_against_linen(report, ScanRemat(), x, 5)
  assert stacked(report["layers/h"]) == [("scan", 0, 2, False), ("remat", None, None, False)]


def test_vmap():
  xs = jnp.ones((2, 1, W))
  report = report_for(Vmap(), xs)
  check_against_linen(report, Vmap(), xs, 5)
  site = report["batched/h"]
  assert stacked(site) == [("vmap", 0, 2, False)]
  assert site.to_dict()["in_vmap"] and not site.to_dict()["in_scan"]


def test_seed_model_table_and_json():
  x = jnp.ones((1, 8))
  report = report_for(MLP(depth=3, features=8), x, capacity=5)
  table = str(report)
  assert report.table() == table
  lines = table.splitlines()
  assert lines[0] == "MLP: 2 sow site(s), buffers 640 B"
  assert lines[1].split() == [
    "collection",
    "path",
    "value",
    "shape",
    "dtype",
    "per",
    "call",
    "inside",
    "capacity",
    "overflow",
    "buffer",
  ]
  assert lines[3].split() == [
    "intermediates",
    "ScanBlock_0/carry",
    "(3,",
    "1,",
    "8)",
    "float32",
    "1",
    "scan(axis=0,",
    "len=3)",
    "5",
    "error",
    "480",
    "B",
  ]
  assert lines[4].split() == [
    "intermediates",
    "x",
    "(1,",
    "8)",
    "float32",
    "1",
    "-",
    "5",
    "error",
    "160",
    "B",
  ]
  data = json.loads(json.dumps(report.to_dict()))
  assert data["model"] == "MLP" and data["buffer_bytes"] == 640 and data["dropped"] == []
  carry = data["sites"][0]
  assert carry["path"] == "ScanBlock_0/carry" and carry["shape"] == [3, 1, 8]
  assert carry["sown_shape"] == [1, 8] and carry["in_scan"] and carry["lifted"]
  assert carry["transforms"] == [
    {"kind": "scan", "path": "ScanBlock_0", "axis": 0, "length": 3, "reverse": False}
  ]


def test_capacity_mapping_and_preallocate_update_the_report():
  x = jnp.ones((1, 8))
  model = lb.ToNNX(MLP(depth=3, features=8), rngs=nnx.Rngs(0))
  lb.lazy_init(model, x, capacity={"x": 2, "ScanBlock_0/*": 7})
  report = lb.sow_sites(model)
  assert (report["x"].capacity, report["ScanBlock_0/carry"].capacity) == (2, 7)
  lb.preallocate(model, jnp.ones((4, 8)), capacity=3)  # another signature, beside the first
  report = lb.sow_sites(model)
  assert report.signatures == ("(float32[1,8])", "(float32[4,8])")
  with pytest.raises(KeyError, match=r"declared for 2 call signatures.*for_signature"):
    report["x"]
  batch_4 = report.for_signature("(float32[4,8])")
  assert batch_4["x"].shape == (4, 8) and batch_4["x"].capacity == 3
  assert batch_4["ScanBlock_0/carry"].shape == (3, 4, 8)
  assert report.for_signature("(float32[1,8])")["x"].capacity == 2
  with pytest.raises(KeyError, match=r"no call signature '\(\)'"):
    report.for_signature("()")


def test_missing_site_name_raises():
  report = report_for(TopLevel(), jnp.ones((1, W)))
  with pytest.raises(KeyError, match="no sow site 'nope'"):
    report["nope"]


def test_not_a_loopbridge_model_raises():
  with pytest.raises(TypeError, match=r"lb.sow_sites needs an lb.ToNNX, got Linear.*lb.ToNNX"):
    lb.sow_sites(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))


def test_not_initialized_raises():
  with pytest.raises(lb.NotDeclaredError, match=r"not initialized.*lb.lazy_init"):
    lb.sow_sites(lb.ToNNX(TopLevel(), rngs=nnx.Rngs(0)))


def _Lift(kind, axis, carries=True):
  return _site.Transform(kind, ("t",), axis, carries=carries)


@pytest.mark.parametrize(
  "shape,sown,axis,length",
  [
    ((1, 3, 4), (1, 4), 1, 3),  # unique position
    ((3, 3, 4), (3, 4), None, 3),  # adjacent equal sizes: position ambiguous, length known
  ],
)
def test_axis_from_shapes_when_discovery_did_not_see_it(shape, sown, axis, length):
  (t,) = _site.with_lengths([_Lift("scan", None)], shape, sown)
  assert (t.axis, t.length) == (axis, length)


def test_inconsistent_shapes_leave_length_unknown():
  (t,) = _site.with_lengths([_Lift("vmap", 0)], (2, 5), (7,))
  assert (t.axis, t.length) == (0, None)
  assert t.label() == "vmap(axis=0, len=?)"


def test_format_bytes():
  assert [_sites.format_bytes(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**30)] == [
    "0 B",
    "1023 B",
    "1.5 KiB",
    "5.0 MiB",
    "3.0 GiB",
  ]
