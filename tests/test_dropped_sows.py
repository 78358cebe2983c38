"""DroppedSowWarning: a sow Linen silently discards (its lifted transform does not carry the
collection) is reported at lazy_init, and listed by lb.sow_sites. Plain Linen is the reference
that the value really is lost."""

from __future__ import annotations

import json
import re
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

import loopbridge as lb

from models import MLP


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    h = nn.relu(nn.Dense(4)(x))
    self.sow("intermediates", "h", h)
    return h, None


class GemmaLike(nn.Module):
  """The Gemma stack shape: nn.scan(nn.remat(Block)) built in setup, params-only variable_axes,
  plus a top-level sow that is kept."""

  def setup(self):
    self.layers = nn.scan(
      nn.remat(Block), variable_axes={"params": 0}, split_rngs={"params": True}, length=2
    )()

  def __call__(self, x):
    self.sow("intermediates", "embedded", x)
    return self.layers(x, None)[0]


class VmapDrops(nn.Module):
  @nn.compact
  def __call__(self, xs):
    vm = nn.vmap(Block, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=(0, None))
    return vm(name="batched")(xs, None)[0]


def lazy_init_collecting(model, *args, **kwargs):
  """lazy_init, returning the DroppedSowWarnings it raised.

  Not `pytest.warns`: it re-emits every other warning from the test's own line, which defeats
  the suite's filters for jax/flax-internal DeprecationWarnings (raised here by flax 0.10).
  """
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    lb.lazy_init(model, *args, **kwargs)
  return [w for w in record if issubclass(w.category, lb.DroppedSowWarning)]


def linen_intermediates(module, x):
  """What plain Linen returns in 'intermediates' (abstractly: shapes only, no FLOPs)."""

  def init_and_apply():
    variables = module.init(jax.random.key(0), x)
    return module.apply(variables, x, mutable=["intermediates"])[1]

  return jax.eval_shape(init_and_apply).get("intermediates", {})


def test_gemma_like_scan_of_remat_in_setup_warns():
  x = jnp.ones((1, 4))
  # Reference: Linen itself keeps only the top-level sow.
  assert set(linen_intermediates(GemmaLike(), x)) == {"embedded"}
  model = lb.ToNNX(GemmaLike(), rngs=nnx.Rngs(0))
  (warning,) = lazy_init_collecting(model, x, capacity=3)
  message = str(warning.message)
  assert "Block at Linen path 'layers' sows 'h' into collection 'intermediates'" in message
  assert "nn.scan at 'layers' does not carry the 'intermediates' collection" in message
  assert "Fix: add 'intermediates': 0 to that transform's `variable_axes`" in message
  # The kept site still records; the dropped one has no buffer.
  model(x)
  assert set(lb.recorded(model)["intermediates"]) == {"embedded"}


def test_dropped_sows_are_in_the_report():
  x = jnp.ones((1, 4))
  model = lb.ToNNX(GemmaLike(), rngs=nnx.Rngs(0))
  assert len(lazy_init_collecting(model, x, capacity=3)) == 1
  report = lb.sow_sites(model)
  assert [s.name for s in report] == ["embedded"]
  (dropped,) = report.dropped
  assert (dropped.module_path, dropped.name, dropped.collection) == (
    ("layers",),
    "h",
    "intermediates",
  )
  assert dropped.shape == (1, 4) and dropped.dtype == "float32"
  assert dropped.dropped_by is not None
  assert dropped.dropped_by.kind == "scan" and dropped.dropped_by.path == ("layers",)
  assert "1 sow(s) dropped by Linen" in str(report)
  assert (
    "Block at 'layers' sows 'h' into 'intermediates' (1, 4) float32; fix: add "
    "'intermediates': 0 to the variable_axes of the nn.scan at 'layers'"
  ) in str(report)
  data = json.loads(json.dumps(report.to_dict()))
  assert data["dropped"][0]["module_path"] == "layers"
  assert data["dropped"][0]["dropped_by"]["kind"] == "scan"


def test_vmap_without_the_collection_warns():
  xs = jnp.ones((2, 1, 4))
  assert linen_intermediates(VmapDrops(), xs) == {}
  model = lb.ToNNX(VmapDrops(), rngs=nnx.Rngs(0))
  (warning,) = lazy_init_collecting(model, xs, capacity=2)
  assert re.search(
    r"Block at Linen path 'batched' sows 'h'.*nn\.vmap at 'batched'", str(warning.message)
  )
  assert [d.name for d in lb.sow_sites(model).dropped] == ["h"]


def test_no_warning_when_nothing_is_dropped():
  x = jnp.ones((1, 8))
  model = lb.ToNNX(MLP(depth=2, features=8), rngs=nnx.Rngs(0))
  assert lazy_init_collecting(model, x, capacity=2) == []
  assert lb.sow_sites(model).dropped == ()
  assert "dropped" not in str(lb.sow_sites(model))
