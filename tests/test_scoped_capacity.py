"""`with lb.capacity(N):` declares buffers for lazy_init calls that pass no capacity.

Precedence (most specific first): the entry's `capacity=`, then `lb.ToNNX(..., capacity=)`, then
the innermost `lb.capacity` block. Records are checked against plain Linen `apply`.
"""

from __future__ import annotations

import threading

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx import bridge

import loopbridge as lb


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(3)(x)
    self.sow("intermediates", "h", h)
    return h


X = jnp.arange(4.0).reshape(1, 4)


def capacity_of(model, name="h"):
  return lb.buffers(model)["intermediates"][name].shape[0]


class ThirdParty(nnx.Module):
  """Stands for code the user cannot edit: its __init__ lazy_inits without a capacity."""

  def __init__(self, rngs: nnx.Rngs):
    self.llm = lb.ToNNX(Net(), rngs=rngs)
    self.llm.lazy_init(X, rngs=rngs)

  def __call__(self, x):
    return self.llm(x)


def test_a_scope_declares_third_party_lazy_init_and_records_like_linen():
  with lb.capacity(3):
    model = ThirdParty(nnx.Rngs(0))
  assert capacity_of(model.llm) == 3
  xs = [X, X + 1.0]
  for x in xs:
    model(x)
  params = lb.linen_variables(model.llm)["params"]
  expected = [
    Net().apply({"params": params}, x, mutable=["intermediates"])[1]["intermediates"]["h"][0]
    for x in xs
  ]
  np.testing.assert_allclose(
    lb.recorded(model)["llm"]["intermediates"]["h"], np.stack(expected), rtol=1e-6, atol=1e-6
  )


def test_without_a_scope_the_error_names_every_way_to_declare():
  with pytest.raises(
    lb.CapacityError,
    match=r"no capacity was declared.*"
    r"lazy_init\(model, \*args, capacity=N\).*"
    r"lb\.ToNNX\(module, rngs=\.\.\., capacity=N\).*"
    r"with lb\.capacity\(N\)",
  ):
    ThirdParty(nnx.Rngs(0))


@pytest.mark.parametrize(
  "entry,constructor,scope,expected",
  [
    (2, 5, 7, 2),  # the entry's capacity= wins
    (None, 5, 7, 5),  # then lb.ToNNX(capacity=)
    (None, None, 7, 7),  # then the block
  ],
)
def test_precedence(entry, constructor, scope, expected):
  with lb.capacity(scope):
    model = lb.ToNNX(Net(), rngs=nnx.Rngs(0), capacity=constructor)
    lb.lazy_init(model, X, capacity=entry)
  assert capacity_of(model) == expected


def test_the_innermost_block_wins_and_none_turns_an_outer_one_off():
  with lb.capacity(4):
    with lb.capacity(2):
      inner = lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), X)
    outer = lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), X)
    with lb.capacity(None), pytest.raises(lb.CapacityError, match="no capacity was declared"):
      lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), X)
  assert (capacity_of(inner), capacity_of(outer)) == (2, 4)


def test_the_block_is_read_when_lazy_init_runs_not_when_the_wrapper_is_built():
  model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
  with lb.capacity(6):
    model.lazy_init(X)
  assert capacity_of(model) == 6


def test_a_mapping_block_may_name_sites_of_other_declarations():
  # One block covers many lazy_init calls: a key for another model's site is not a typo here.
  with lb.capacity({"h": 3, "other_model_site": 9}):
    model = lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), X)
  assert capacity_of(model) == 3


def test_a_mapping_block_that_misses_a_site_still_fails():
  with (
    lb.capacity({"not_h": 3}),
    pytest.raises(lb.CapacityError, match=r"no capacity key covers sow site"),
  ):
    lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), X)


@pytest.mark.parametrize(
  "spec,match", [(0, "positive int"), ("5", "positive int"), ({}, "declares nothing")]
)
def test_a_malformed_block_fails_when_it_opens(spec, match):
  with pytest.raises(lb.CapacityError, match=match), lb.capacity(spec):
    pass  # pragma: no cover


def test_the_block_covers_stock_bridge_lazy_init_and_native_sows():
  class Native(nnx.Module):
    def __init__(self, rngs):
      self.lin = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x):
      y = self.lin(x)
      self.sow(nnx.Intermediate, "y", y)
      return y

  with lb.capacity(5):
    stock = bridge.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), X)
    native = lb.preallocate(Native(nnx.Rngs(0)), X)
  assert capacity_of(stock) == 5
  assert capacity_of(native, "y") == 5


def test_the_block_is_private_to_its_thread():
  seen = {}

  def other():
    try:
      lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), X)
    except lb.CapacityError:
      seen["error"] = True

  with lb.capacity(3):
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
  assert seen == {"error": True}
