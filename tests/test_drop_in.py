"""Drop-in contract: everything stock `flax.nnx.bridge.ToNNX` does, `lb.ToNNX` does too.

Every test runs twice through the `impl` fixture: once with the stock wrapper
(`bridge.ToNNX` + `bridge.lazy_init`) and once with ours (`lb.ToNNX` + `lb.lazy_init`, with
`capacity=8` added only where the model sows). Each asserts a behaviour against an independent
reference -- plain Linen `init`/`apply` with the same variables, or the stock wrapper built the
same way -- never ours against itself. The stock run shows the test states real stock behaviour
(a test that fails for stock is a wrong test); the `ours` run is the contract.

A behaviour ours does not have yet is marked `xfail(strict=True)` for the `ours` run only (see
`ours_xfail`), with the error a user gets; remove the mark when the behaviour lands.
Behaviours are those of flax's own bridge tests (tests/nnx/bridge/wrappers_test.py and
module_test.py in google/flax) plus the ones issue 15 lists.
"""

from __future__ import annotations

import dataclasses
import functools
import typing as tp

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util
from flax.nnx import bridge

import loopbridge as lb
from loopbridge import _compat

from conftest import graph_kw

RTOL, ATOL = 1e-5, 1e-6  # float32 round-off between compiled/transformed and eager Linen
CAPACITY = 8  # what "swap the import" adds for a model that sows

# flax >= 0.10.7: `ToNNX.__getattr__` turns `model.<linen method>` into a bound partial.
HAS_LINEN_METHOD_ATTRS = "__getattr__" in vars(bridge.ToNNX)
# flax >= 0.10.4: Linen-style NNX modules (`nnx.bridge.Module`).
HAS_BRIDGE_MODULE = hasattr(bridge, "Module")
FLAX = ".".join(map(str, _compat.FLAX_VERSION))


# ------------------------------------------------------------------------------ the two wrappers
@dataclasses.dataclass(frozen=True)
class Impl:
  """One wrapper under test: its class, its lazy_init, and whether it records sows."""

  name: str
  ToNNX: type
  _lazy_init: tp.Callable[..., tp.Any]
  records: bool

  def lazy_init(self, fn, *args, sows: bool = False, **kwargs):
    """`lazy_init` as a user writes it: ours gets `capacity=` only where the model sows."""
    if self.records and sows:
      kwargs["capacity"] = CAPACITY
    return self._lazy_init(fn, *args, **kwargs)


STOCK = Impl("stock", bridge.ToNNX, bridge.lazy_init, records=False)
OURS = Impl("ours", lb.ToNNX, lb.lazy_init, records=True)
IMPLS = {"stock": STOCK, "ours": OURS}


@pytest.fixture(params=["stock", "ours"])
def impl(request) -> Impl:
  return IMPLS[request.param]


def ours_xfail(reason: str, when: bool = True):
  """Run a test on both wrappers, expecting the `ours` run to fail (strict) while `when`."""
  return pytest.mark.parametrize(
    "impl",
    [
      "stock",
      pytest.param("ours", marks=pytest.mark.xfail(when, reason=reason, strict=True)),
    ],
    indirect=True,
  )


# ------------------------------------------------------------------- reading state, version-free
def value_of(v):
  """A Variable's (or flax 0.10 VariableState's) value without deprecated accessors."""
  return v.get_value() if hasattr(v, "get_value") else v.value


def leaf_type(leaf) -> type:
  return leaf.type if type(leaf).__name__ == "VariableState" else type(leaf)


def flat_state(model) -> list[tuple[tuple, tp.Any]]:
  state = nnx.state(model)
  if hasattr(nnx, "to_flat_state"):
    return [(tuple(p), v) for p, v in nnx.to_flat_state(state)]
  return [(tuple(p), v) for p, v in state.flat_state().items()]


def collection_of(var_type: type) -> str:
  if hasattr(nnx.variablelib, "variable_name_from_type"):
    return nnx.variablelib.variable_name_from_type(var_type, allow_register=True)
  return bridge.variables.variable_type_name(var_type)


RNG_ATTRS = ("to_nnx__rngs", "rngs")  # the wrapper's own Rngs: 0.12 / 0.10 attribute names


def is_wrapper_own(path) -> bool:
  head = str(path[0])
  return head in RNG_ATTRS or head.startswith("loopbridge__")


def state_signature(model) -> list[tuple]:
  """Every `nnx.state` leaf: (path, Variable type, shape, dtype), sorted by path."""
  return sorted(
    (
      tuple(map(str, p)),
      leaf_type(v).__name__,
      jnp.shape(value_of(v)),
      str(jnp.result_type(value_of(v))),
    )
    for p, v in flat_state(model)
  )


def linen_variables(model, skip=("intermediates",)) -> dict:
  """The Linen variables a bridged model holds, rebuilt from its NNX state alone.

  Groups state leaves by the collection their Variable type names; the wrapper's own Rngs
  (and our recorder attributes) are not Linen variables. Works for a bridged child too.
  """
  flat = {}
  for path, leaf in flat_state(model):
    if any(is_wrapper_own(path[i:]) for i in range(len(path))):
      continue
    collection = collection_of(leaf_type(leaf))
    if collection in skip:
      continue
    flat[(collection, *map(str, path))] = value_of(leaf)
  return traverse_util.unflatten_dict(flat)


def linen_module_of(model) -> nn.Module:
  own = vars(model)
  return own["to_nnx__module"] if "to_nnx__module" in own else own["module"]


def assert_close(actual, desired):
  np.testing.assert_allclose(np.asarray(actual), np.asarray(desired), rtol=RTOL, atol=ATOL)


def latest_sown(model, name: str):
  """The value the latest call sowed at top-level `name` of a bridged model's 'intermediates'.

  Stock keeps sows as a Variable holding Linen's tuple (0.12 appends a call's entries) or as a
  tuple of Variables (0.10 replaces them on each call); ours keeps them in buffers read by
  `lb.recorded`.
  """
  if isinstance(model, lb.ToNNX):
    return lb.recorded(model)["intermediates"][name][-1]
  sown = vars(model)[name]
  if isinstance(sown, tuple):  # flax 0.10: a tuple of Variables, one per entry
    return value_of(sown[-1])
  return value_of(sown)[-1]


def use_mesh(mesh):
  """Enter `mesh` as the current mesh (the name moved across the supported jax versions)."""
  for owner, name in ((jax.sharding, "use_mesh"), (jax, "set_mesh")):
    if hasattr(owner, name):
      return getattr(owner, name)(mesh)
  return mesh


# --------------------------------------------------------------------------------- Linen models
class Foo(nn.Module):
  """`__call__` and a second compact method with its own parameter (flax's own test model)."""

  @nn.compact
  def __call__(self, x):
    b = self.param("b", nn.zeros_init(), (1, 3))
    return self.dot(x) + b

  @nn.compact
  def dot(self, x):
    w = self.param("w", nn.initializers.lecun_normal(), (x.shape[-1], 3))
    return x @ w


class Counter(nn.Module):
  """A non-param collection updated on every non-init call."""

  def setup(self):
    self.count = self.variable("counter", "count", lambda: jnp.zeros((), jnp.int32))

  def __call__(self, x):
    if not self.is_initializing():
      self.count.value += 1
    return x


class CacheWriter(nn.Module):
  """Writes a cache entry only when 'cache' is mutable; reads it back otherwise."""

  @nn.compact
  def __call__(self):
    if not self.is_initializing() and self.is_mutable_collection("cache"):
      self.put_variable("cache", "x", 0)
    return self.get_variable("cache", "x")


class BNNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.BatchNorm(use_running_average=False, momentum=0.5)(nn.Dense(3)(x))


class DropNet(nn.Module):
  rate: float = 0.5

  @nn.compact
  def __call__(self, x):
    return nn.Dropout(self.rate, deterministic=False)(nn.Dense(3)(x))


class Sower(nn.Module):
  """Dense + a top-level sow: the smallest model that records."""

  features: int = 4

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.features)(x)
    self.sow("intermediates", "h", h)
    return jnp.tanh(h)


X = jax.random.normal(jax.random.key(42), (2, 4))


# =================================================================== wrapping and lazy_init
def test_wrap_lazy_init_call_matches_linen_apply(impl):
  model = impl.ToNNX(nn.Dense(3), rngs=nnx.Rngs(0)).lazy_init(X)  # the method form
  assert isinstance(model, impl.ToNNX)
  assert isinstance(model.kernel, nnx.Param) and isinstance(model.bias, nnx.Param)
  variables = {"params": {"kernel": value_of(model.kernel), "bias": value_of(model.bias)}}
  assert_close(model(X), nn.Dense(3).apply(variables, X))


def test_lazy_init_function_returns_its_argument(impl):
  model = impl.ToNNX(nn.Dense(3), rngs=nnx.Rngs(0))
  assert impl.lazy_init(model, X) is model
  assert value_of(model.kernel).shape == (4, 3)


def test_same_seed_gives_stock_params_and_outputs(impl):
  """Swapping the import keeps every initial parameter bit for bit."""
  theirs = STOCK.lazy_init(STOCK.ToNNX(Foo(), rngs=nnx.Rngs(0)), X)
  mine = impl.lazy_init(impl.ToNNX(Foo(), rngs=nnx.Rngs(0)), X)
  jax.tree.map(np.testing.assert_array_equal, linen_variables(mine), linen_variables(theirs))
  np.testing.assert_array_equal(mine(X), theirs(X))


def test_params_and_output_match_linen_init_apply(impl):
  model = impl.lazy_init(impl.ToNNX(Foo(), rngs=nnx.Rngs(0)), X)
  variables = linen_variables(model)
  reference = Foo().init(jax.random.key(7), X)  # another seed: same tree, shapes, dtypes
  assert jax.tree.structure(variables) == jax.tree.structure(reference)
  assert jax.tree.map(jnp.shape, variables) == jax.tree.map(jnp.shape, reference)
  assert_close(model(X), Foo().apply(variables, X))


# ============================================================= state structure: paths and types
@pytest.mark.parametrize(
  "make",
  [
    lambda: nn.Dense(3),
    lambda: Foo(),
    lambda: BNNet(),
    lambda: Counter(),
    lambda: DropNet(),
  ],
  ids=["Dense", "Foo", "BatchNorm", "counter", "Dropout"],
)
def test_state_paths_and_variable_types_match_stock(impl, make):
  """For a model that does not sow, `nnx.state` is exactly the stock wrapper's."""
  x = X if make().__class__ is not Counter else jnp.zeros(())
  theirs = STOCK.lazy_init(STOCK.ToNNX(make(), rngs=nnx.Rngs(0, dropout=1)), x)
  mine = impl.lazy_init(impl.ToNNX(make(), rngs=nnx.Rngs(0, dropout=1)), x)
  assert state_signature(mine) == state_signature(theirs)


def test_state_paths_and_types_are_linen_variables(impl):
  """The stock layout, spelled out: Linen's variables minus the collection level."""
  model = impl.lazy_init(impl.ToNNX(BNNet(), rngs=nnx.Rngs(0)), X)
  want = {
    ("BatchNorm_0", "bias"): "Param",
    ("BatchNorm_0", "scale"): "Param",
    ("BatchNorm_0", "mean"): "BatchStat",
    ("BatchNorm_0", "var"): "BatchStat",
    ("Dense_0", "bias"): "Param",
    ("Dense_0", "kernel"): "Param",
  }
  got = {p: t for p, t, _, _ in state_signature(model) if p[0] not in RNG_ATTRS}
  assert got == want


def test_graphdef_stable_across_calls(impl):
  """After lazy_init the static structure no longer changes (a mutable call included)."""
  model = impl.lazy_init(impl.ToNNX(BNNet(), rngs=nnx.Rngs(0)), X)
  before = nnx.graphdef(model)
  model(X, mutable=["batch_stats"])
  model(X, mutable=["batch_stats"])
  assert nnx.graphdef(model) == before


# ===================================================================== inside an NNX module
class NNXOuter(nnx.Module):
  def __init__(self, impl: Impl, dout: int, *, rngs: nnx.Rngs):
    self.nn_dense1 = impl.ToNNX(nn.Dense(dout, use_bias=False), rngs=rngs)
    self.b = nnx.Param(jax.random.uniform(rngs.params(), (1, dout)))
    self.batchnorm = impl.ToNNX(nn.BatchNorm(use_running_average=True), rngs=rngs)
    self.rngs = rngs

  def __call__(self, x):
    return self.batchnorm(self.nn_dense1(x) + self.b)


def test_submodule_of_nnx_module(impl):
  model = NNXOuter(impl, 3, rngs=nnx.Rngs(0))
  gdef_before, _ = nnx.split(model)
  impl.lazy_init(model, X)
  gdef_after, state = nnx.split(model)
  stock = STOCK.lazy_init(NNXOuter(STOCK, 3, rngs=nnx.Rngs(0)), X)
  assert state_signature(model) == state_signature(stock)
  assert gdef_before != gdef_after
  assert "kernel" in state["nn_dense1"]
  assert {"mean", "var", "scale", "bias"} <= set(state["batchnorm"])
  k, b = value_of(state["nn_dense1"]["kernel"]), value_of(state["b"])
  bn = linen_variables(model.batchnorm)
  want = nn.BatchNorm(use_running_average=True).apply(bn, X @ k + b)
  assert_close(model(X), want)
  assert nnx.graphdef(model) == gdef_after  # static data is stable now


# =============================================================== methods other than __call__
@pytest.mark.skipif(
  not HAS_LINEN_METHOD_ATTRS,
  reason=(f"flax {FLAX}: ToNNX has no __getattr__ forwarding Linen methods (added in flax 0.10.7)"),
)
def test_lazy_init_through_bound_linen_method(impl):
  model = impl.ToNNX(Foo(), rngs=nnx.Rngs(0))
  impl.lazy_init(model.dot, X)
  w = value_of(nnx.state(model)["w"])
  assert_close(model.dot(X), X @ w)
  assert "b" not in nnx.state(model)  # only dot's parameter was created
  with pytest.raises(flax.errors.ScopeParamNotFoundError):
    model(X)


@pytest.mark.parametrize("form", ["name", "function", "linen_bound"])
def test_method_keyword_forms(impl, form):
  model = impl.ToNNX(Foo(), rngs=nnx.Rngs(0))
  method = {"name": "dot", "function": Foo.dot, "linen_bound": linen_module_of(model).dot}[form]
  impl.lazy_init(model, X, method=method)
  w = value_of(nnx.state(model)["w"])
  assert_close(model(X, method=method), X @ w)
  assert_close(model(X, method=method), Foo().apply({"params": {"w": w}}, X, method=Foo.dot))
  with pytest.raises(flax.errors.ScopeParamNotFoundError):
    model(X)


# ===================================================================== mutable collections
def test_mutable_counter_updates_only_when_mutable(impl):
  model = impl.ToNNX(Counter(), rngs=nnx.Rngs(0)).lazy_init(jnp.zeros(()))
  assert value_of(nnx.state(model)["count"]) == 0
  model(jnp.zeros(()), mutable=True)
  model(jnp.zeros(()), mutable=["counter"])
  assert value_of(nnx.state(model)["count"]) == 2
  with pytest.raises(flax.errors.ModifyScopeVariableError):  # as Linen: 'counter' immutable
    model(jnp.zeros(()))
  assert value_of(nnx.state(model)["count"]) == 2


def test_mutable_call_may_add_a_variable(impl):
  """flax's own test: a cache entry created by a later mutable call is kept and read back."""

  class NNXModule(nnx.Module):
    def __init__(self):
      self.module = impl.ToNNX(CacheWriter()).lazy_init()

    def __call__(self):
      first = self.module(mutable=["cache"])
      second = self.module()
      return first, second

  first, second = NNXModule()()
  assert first == 0
  if _compat.FLAX_VERSION >= (0, 11):  # flax 0.10 loses the new entry: `second` is None
    assert second == 0


def test_batch_stats_updated_like_linen(impl):
  model = impl.lazy_init(impl.ToNNX(BNNet(), rngs=nnx.Rngs(0)), X)
  variables = linen_variables(model)
  for step in range(3):
    x = X * (step + 1)
    want, updates = BNNet().apply(variables, x, mutable=["batch_stats"])
    variables = {**variables, **updates}
    assert_close(model(x, mutable=["batch_stats"]), want)
    jax.tree.map(assert_close, linen_variables(model)["batch_stats"], variables["batch_stats"])
  assert isinstance(model.BatchNorm_0["mean"], nnx.BatchStat)


# ========================================================================= rng streams, dropout
def test_dropout_streams_follow_stock(impl):
  """Same seeds give the stock wrapper's outputs, call after call; each call draws anew."""

  def rngs():
    return nnx.Rngs(params=0, dropout=1)

  theirs = STOCK.lazy_init(STOCK.ToNNX(DropNet(), rngs=rngs()), X)
  mine = impl.lazy_init(impl.ToNNX(DropNet(), rngs=rngs()), X)
  ys = [mine(X) for _ in range(3)]
  for y in ys:
    np.testing.assert_array_equal(y, theirs(X))
  assert not np.array_equal(ys[0], ys[1])


def test_dropout_rngs_keyword_and_rate_zero_match_linen(impl):
  model = impl.lazy_init(impl.ToNNX(DropNet(0.0), rngs=nnx.Rngs(params=0, dropout=1)), X)
  assert_close(model(X), DropNet(0.0).apply(linen_variables(model), X))
  model = impl.lazy_init(impl.ToNNX(DropNet(), rngs=nnx.Rngs(params=0, dropout=1)), X)
  key = jax.random.key(3)
  y = model(X, rngs=nnx.Rngs(dropout=key))
  # Stock draws one key per stream per call (`stream()`): the same draw, made by hand.
  drawn = nnx.Rngs(dropout=key).dropout()
  want = DropNet().apply(linen_variables(model), X, rngs={"dropout": drawn})
  assert_close(y, want)


# ==================================================================== nested bridging (hybrid)
class NNXDropDense(nnx.Module):
  def __init__(self, din, dout, rate, rngs):
    self.w = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (din, dout)))
    self.dropout = nnx.Dropout(rate=rate, rngs=rngs)

  def __call__(self, x):
    return self.dropout(x @ self.w[...])


class LinenMiddle(nn.Module):
  dout: int
  rate: float

  @nn.compact
  def __call__(self, x):
    dot = bridge.to_linen(NNXDropDense, x.shape[-1], self.dout, self.rate, name="dot")
    b = self.param("b", nn.initializers.lecun_normal(), (1, self.dout))
    return dot(x) + b


class NNXTop(nnx.Module):
  def __init__(self, impl, dout, rate, *, rngs):
    self.inner = impl.ToNNX(LinenMiddle(dout, rate), rngs=rngs)
    self.rngs = rngs

  def __call__(self, x):
    return self.inner(x)


def test_nnx_inside_linen_inside_to_nnx(impl):
  """flax's hybrid test: NNX (to_linen) inside Linen inside ToNNX; reseed replays dropout."""
  model = impl.lazy_init(NNXTop(impl, 3, 0.5, rngs=nnx.Rngs(default=1, dropout=2)), X)
  stock = STOCK.lazy_init(NNXTop(STOCK, 3, 0.5, rngs=nnx.Rngs(default=1, dropout=2)), X)
  assert state_signature(model) == state_signature(stock)
  nnx.reseed(model, dropout=2)
  y1, y2 = model(X), model(X)
  assert not np.array_equal(y1, y2)
  nnx.reseed(model, dropout=2)
  np.testing.assert_array_equal(y1, model(X))

  model = impl.lazy_init(NNXTop(impl, 3, 0.0, rngs=nnx.Rngs(default=1, dropout=2)), X)
  w, b = model.inner.dot["w"], model.inner.b
  assert isinstance(w, nnx.Param)
  assert_close(model(X), X @ value_of(w) + value_of(b))


def make_dense_holder(impl):
  class DenseHolder(nnx.Module):
    """NNX module holding a ToNNX it initializes itself (ToLinen does not lazy_init)."""

    def __init__(self, din, dout, *, rngs):
      self.dense = impl.ToNNX(nn.Dense(dout), rngs=rngs)
      impl.lazy_init(self.dense, jnp.zeros((1, din)))

    def __call__(self, x):
      return jnp.tanh(self.dense(x))

  return DenseHolder


class LinenAroundNNX(nn.Module):
  holder: tp.Any

  @nn.compact
  def __call__(self, x):
    return bridge.to_linen(self.holder, x.shape[-1], 3, name="holder")(x) * 2.0


def test_to_nnx_inside_to_linen_inside_to_nnx(impl):
  holder = make_dense_holder(impl)
  model = impl.lazy_init(impl.ToNNX(LinenAroundNNX(holder), rngs=nnx.Rngs(0)), X)
  dense = linen_variables(model)["params"]["holder"]["dense"]
  want = jnp.tanh(nn.Dense(3).apply({"params": dense}, X)) * 2.0
  assert_close(model(X), want)
  assert_close(model(X * 2), jnp.tanh(nn.Dense(3).apply({"params": dense}, X * 2)) * 2.0)


# ============================================= what the installed flax's stock wrapper can do
# Probed by running stock, not read from the version: a test whose stock run hits one of these
# limits skips that run only (the `ours` run is the contract and still runs).
@functools.cache
def stock_inits_outside_lazy_init() -> bool:
  """Stock, called with mutable=True before lazy_init, creates its variables (flax >= 0.12.0).

  Before 0.12.0 only lazy_init hands Linen a 'params' rng (InvalidRngError), and
  nnx.bridge.Module.init relies on such a call.
  """
  try:
    bridge.ToNNX(nn.Dense(1), rngs=nnx.Rngs(0))(jnp.ones((1, 1)), mutable=True)
  except flax.errors.InvalidRngError:
    return False
  return True


@functools.cache
def stock_calls_again_after_a_sow() -> bool:
  """Stock can be called again after a mutable=True call that sowed.

  flax 0.11 keeps the sown tuple as an attribute its next call cannot convert (ValueError:
  "Cannot infer collection name from value").
  """
  model = bridge.lazy_init(bridge.ToNNX(Sower(), rngs=nnx.Rngs(0)), X)
  model(X, mutable=True)
  try:
    model(X, mutable=True)
  except ValueError:
    return False
  return True


def skip_stock_unless(impl: Impl, can: tp.Callable[[], bool]) -> None:
  """Skip the stock run of a test where the installed flax's stock wrapper cannot do `can`."""
  if not impl.records and not can():
    pytest.skip(f"flax {FLAX}: stock ToNNX cannot: {(can.__doc__ or '').splitlines()[0]}")


# ================================================================== nnx.bridge.Module parents
needs_bridge_module = pytest.mark.skipif(
  not HAS_BRIDGE_MODULE, reason=(f"flax {FLAX} has no nnx.bridge.Module (added in flax 0.10.4)")
)


@pytest.mark.skipif(
  _compat.FLAX_VERSION < (0, 11),
  reason=(f"flax {FLAX}: stock ToNNX passes no 'params' rng outside lazy_init (InvalidRngError)"),
)
def test_mutable_call_before_lazy_init_creates_the_variables(impl):
  """What nnx.bridge.Module.init relies on: an un-initialized wrapper called with
  mutable=True creates its variables through Linen, and later calls use them."""
  skip_stock_unless(impl, stock_inits_outside_lazy_init)
  model = impl.ToNNX(nn.Dense(3), rngs=nnx.Rngs(0))
  y = model(X, mutable=True)
  params = linen_variables(model)["params"]
  assert jax.tree.map(jnp.shape, params) == {"bias": (3,), "kernel": (4, 3)}
  assert_close(y, nn.Dense(3).apply({"params": params}, X))
  assert_close(model(X * 2), nn.Dense(3).apply({"params": params}, X * 2))


@needs_bridge_module
@pytest.mark.parametrize("style", ["setup", "compact"])
def test_bridge_module_submodule(impl, style):
  skip_stock_unless(impl, stock_inits_outside_lazy_init)
  if style == "setup":

    class SetupParent(bridge.Module):
      def setup(self):
        assert self.scope is not None
        self.dense = impl.ToNNX(nn.Dense(3), rngs=self.scope.rngs)

      def __call__(self, x):
        return self.dense(x) + 1.0

    parent = SetupParent()
  else:

    class CompactParent(bridge.Module):
      @bridge.compact
      def __call__(self, x):
        assert self.scope is not None
        self.dense = impl.ToNNX(nn.Dense(3), rngs=self.scope.rngs)
        return self.dense(x) + 1.0

    parent = CompactParent()
  variables = parent.init(0, X)
  assert jax.tree.map(jnp.shape, variables["params"]) == {"dense": {"bias": (3,), "kernel": (4, 3)}}
  want = nn.Dense(3).apply({"params": variables["params"]["dense"]}, X) + 1.0
  assert_close(parent.apply(variables, X), want)


@needs_bridge_module
def test_bridge_module_mutable_collection_inherited(impl):
  """A bridge.Module's `mutable=` reaches the wrapped Linen module (no `mutable` on the call)."""
  skip_stock_unless(impl, stock_inits_outside_lazy_init)

  class Parent(bridge.Module):
    def setup(self):
      assert self.scope is not None
      self.bn = impl.ToNNX(BNNet(), rngs=self.scope.rngs)

    def __call__(self, x):
      return self.bn(x)

  parent = Parent()
  variables = parent.init(0, X)
  y, updates = parent.apply(variables, X * 2, mutable=["batch_stats"])
  inner = {"params": variables["params"]["bn"], "batch_stats": variables["batch_stats"]["bn"]}
  want, want_updates = BNNet().apply(inner, X * 2, mutable=["batch_stats"])
  assert_close(y, want)
  jax.tree.map(assert_close, updates["batch_stats"]["bn"], want_updates["batch_stats"])


# ============================================================== NNX transforms over a child
N = 3  # transform axis size


class VmapParent(nnx.Module):
  def __init__(self, impl, linen_module, *, rngs):
    self.inner = impl.ToNNX(linen_module, rngs=rngs)

  def __call__(self, x, graph=True, **call_kwargs):
    @nnx.split_rngs(splits=N)
    @nnx.vmap(in_axes=(0, None), axis_size=N, **graph_kw(graph))
    def run(inner, x):
      return inner(x, **call_kwargs)

    return run(self.inner, x)


class ScanParent(nnx.Module):
  """Layers stacked by nnx.vmap at init (flax's bridge.Module pattern), run by nnx.scan."""

  def __init__(self, impl, linen_module, *, rngs):
    self.inner = impl.ToNNX(linen_module, rngs=rngs)

  def init_stack(self, x):
    @nnx.split_rngs(splits=N)
    @nnx.vmap(in_axes=(0, None), axis_size=N)
    def run(inner, x):
      return inner(x)

    return run(self.inner, x)

  def __call__(self, x, graph=True, **call_kwargs):
    @nnx.split_rngs(splits=N)
    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry, **graph_kw(graph))
    def run(inner, x):
      return inner(x, **call_kwargs)

    return run(self.inner, x)


class RematParent(nnx.Module):
  def __init__(self, impl, linen_module, *, rngs):
    self.inner = impl.ToNNX(linen_module, rngs=rngs)

  def __call__(self, x, **call_kwargs):
    return nnx.remat(lambda inner, x: inner(x, **call_kwargs))(self.inner, x)


def member(params, i):
  return jax.tree.map(lambda a: a[i], params)


def test_vmap_over_child_stacks_params_and_matches_linen(impl, graph):
  model = VmapParent(impl, nn.Dense(3), rngs=nnx.Rngs(0))
  impl.lazy_init(model, X)
  stock = STOCK.lazy_init(VmapParent(STOCK, nn.Dense(3), rngs=nnx.Rngs(0)), X)
  assert state_signature(model) == state_signature(stock)
  assert value_of(model.inner.kernel).shape == (N, 4, 3)
  assert value_of(model.inner.bias).shape == (N, 3)
  params = linen_variables(model.inner)["params"]
  assert not np.array_equal(params["kernel"][0], params["kernel"][1])  # rngs were split
  y = model(X, graph=graph)
  for i in range(N):
    assert_close(y[i], nn.Dense(3).apply({"params": member(params, i)}, X))


def test_scan_over_child_matches_linen_chain(impl, graph):
  model = ScanParent(impl, nn.Dense(4), rngs=nnx.Rngs(0))
  impl.lazy_init(model.init_stack, X)
  stock = ScanParent(STOCK, nn.Dense(4), rngs=nnx.Rngs(0))
  STOCK.lazy_init(stock.init_stack, X)
  assert state_signature(model) == state_signature(stock)
  params = linen_variables(model.inner)["params"]
  assert params["kernel"].shape == (N, 4, 4)
  h = X
  for i in range(N):
    h = nn.Dense(4).apply({"params": member(params, i)}, h)
  assert_close(model(X, graph=graph), h)


def test_remat_over_child_matches_linen_value_and_grad(impl):
  model = impl.lazy_init(RematParent(impl, Foo(), rngs=nnx.Rngs(0)), X)
  params = linen_variables(model.inner)["params"]
  assert_close(model(X), Foo().apply({"params": params}, X))

  grads = nnx.grad(lambda m: jnp.sum(m(X) ** 2), argnums=nnx.DiffState(0, nnx.Param))(model)
  want = jax.grad(lambda p: jnp.sum(Foo().apply({"params": p}, X) ** 2))(params)
  got = {"b": value_of(grads["inner"]["b"]), "w": value_of(grads["inner"]["w"])}
  jax.tree.map(assert_close, got, want)


# -------------------------------------------------- a sowing child inside a transform
def sower_reference(params_stack, xs_per_step, chain: bool):
  """Plain Linen per member (vmap) or per layer (scan chain), one apply per step.

  Returns (outputs per step, sown `h` per step stacked along the transform axis).
  """
  outs, sown = [], []
  for x in xs_per_step:
    hs, ys, h_in = [], [], x
    for i in range(N):
      y, state = Sower().apply({"params": member(params_stack, i)}, h_in, mutable=["intermediates"])
      (h,) = state["intermediates"]["h"]
      hs.append(h)
      ys.append(y)
      if chain:
        h_in = y
    outs.append(ys[-1] if chain else jnp.stack(ys))
    sown.append(jnp.stack(hs))
  return outs, sown


@pytest.mark.parametrize("transform", ["vmap", "scan"])
def test_sowing_child_inside_transform_records_stacked(impl, transform, graph):
  """Sows inside nnx.vmap/nnx.scan are stacked along the transform axis, as Linen stacks them.

  Stock keeps the latest call's sow (called with mutable=True, as the seeds do); ours records
  every call into buffers whose leading axis is the transform axis (like a native module
  stacked with nnx.vmap), and `lb.recorded` reads them record index first: (n, N, ...).
  In tree mode stock loses the sow: the Variable its call creates inside the transform does
  not leave it; only its outputs are compared there.
  """
  skip_stock_unless(impl, stock_calls_again_after_a_sow)
  if transform == "vmap":
    model = VmapParent(impl, Sower(), rngs=nnx.Rngs(0))
    impl.lazy_init(model, X, sows=True)
  else:
    model = ScanParent(impl, Sower(), rngs=nnx.Rngs(0))
    impl.lazy_init(model.init_stack, X, sows=True)
  params = linen_variables(model.inner)["params"]
  xs = [X * (t + 1) for t in range(3)]
  outs, sown = sower_reference(params, xs, chain=(transform == "scan"))
  for x, want_y, want_h in zip(xs, outs, sown):
    assert_close(model(x, graph=graph, mutable=True), want_y)
    if graph or impl.records:
      assert_close(latest_sown(model.inner, "h"), want_h)
  if impl.records:
    assert lb.buffers(model.inner)["intermediates"]["h"].shape[:2] == (N, CAPACITY)
    assert_close(lb.recorded(model.inner)["intermediates"]["h"], jnp.stack(sown))


def test_sowing_child_inside_remat_records_like_linen(impl):
  skip_stock_unless(impl, stock_calls_again_after_a_sow)
  model = RematParent(impl, Sower(), rngs=nnx.Rngs(0))
  impl.lazy_init(model, X, sows=True)
  params = linen_variables(model.inner)["params"]
  history = []
  for t in range(3):
    x = X * (t + 1)
    want, state = Sower().apply({"params": params}, x, mutable=["intermediates"])
    history.append(state["intermediates"]["h"][0])
    assert_close(model(x, mutable=True), want)
    assert_close(latest_sown(model.inner, "h"), history[-1])
  if impl.records:
    assert_close(lb.recorded(model.inner)["intermediates"]["h"], jnp.stack(history))


# ============================================================ metadata boxes and partitioning
def partitioned_dense():
  return nn.Dense(
    3,
    kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(), ("in", "out")),
    bias_init=nn.with_logical_partitioning(
      nn.initializers.zeros_init(), ("out-alias",), rules=(("out-alias", "out"),)
    ),
  )


def sharding_names(variable):
  """The partition names a Variable carries (renamed twice across the supported flax)."""
  for name in ("out_sharding", "sharding_names", "sharding"):
    metadata = variable.get_metadata() if hasattr(variable, "get_metadata") else {}
    if name in metadata:
      return tuple(metadata[name])
  return tuple(variable.sharding)


def test_partitioning_metadata_becomes_variable_metadata(impl):
  linen_vars = partitioned_dense().init(jax.random.key(0), X)
  assert isinstance(linen_vars["params"]["kernel"], nn.Partitioned)
  assert isinstance(linen_vars["params"]["bias"], nn.LogicallyPartitioned)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("in", "out"))

  @nnx.jit
  def create_sharded(x):
    model = impl.lazy_init(impl.ToNNX(partitioned_dense(), rngs=nnx.Rngs(0)), x)
    state = nnx.state(model)
    nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
    return model

  with use_mesh(mesh):
    model = create_sharded(X)
    spec = nnx.get_partition_spec(nnx.state(model))
  assert isinstance(model.kernel, nnx.Param)
  assert not isinstance(value_of(model.kernel), nn.Partitioned)  # the box became metadata
  assert sharding_names(model.kernel) == ("in", "out")
  assert sharding_names(model.bias) == ("out-alias",)
  assert model.bias.sharding_rules == (("out-alias", "out"),)
  assert value_of(spec["kernel"]) == jax.sharding.PartitionSpec("in", "out")
  with use_mesh(mesh):
    y = model(X)
  params = {"kernel": value_of(model.kernel), "bias": value_of(model.bias)}
  assert_close(y, nn.Dense(3).apply({"params": params}, X))


def test_partitioned_param_boxes_round_trip_to_linen(impl):
  """Linen variables rebuilt from the wrapper's Variables carry the same partitioning."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("in", "out"))
  with use_mesh(mesh):
    model = impl.lazy_init(impl.ToNNX(partitioned_dense(), rngs=nnx.Rngs(0)), X)
    attrs = {"kernel": model.kernel, "bias": model.bias}
    linen_vars = bridge.variables.nnx_attrs_to_linen_vars(attrs)
  assert isinstance(linen_vars["params"]["kernel"], nn.Partitioned)
  assert linen_vars["params"]["kernel"].names == ("in", "out")
  assert nn.get_partition_spec(linen_vars)["params"]["kernel"] == jax.sharding.PartitionSpec(
    "in", "out"
  )


# ================================================================== display, jit, split/merge
def test_nnx_display(impl, capsys):
  model = impl.lazy_init(impl.ToNNX(Foo(), rngs=nnx.Rngs(0)), X)
  nnx.display(model)
  shown = capsys.readouterr().out
  assert "ToNNX" in shown and "w" in shown


def test_jit_and_split_merge_match_eager(impl, graph):
  model = impl.lazy_init(impl.ToNNX(BNNet(), rngs=nnx.Rngs(0)), X)
  eager_ref = BNNet().apply(linen_variables(model), X, mutable=["batch_stats"])

  @nnx.jit(**graph_kw(graph))
  def step(m, x):
    return m(x, mutable=["batch_stats"])

  y = step(model, X)
  assert_close(y, eager_ref[0])
  # Tree mode: stock replaces the batch_stats Variables inside jit, so the update does not
  # leave it; ours writes into the existing Variables, which tree mode propagates.
  if graph or impl.records:
    jax.tree.map(assert_close, linen_variables(model)["batch_stats"], eager_ref[1]["batch_stats"])

  graphdef, state = nnx.split(model)
  clone = nnx.merge(graphdef, state)
  assert state_signature(clone) == state_signature(model)
  y2, _ = BNNet().apply(linen_variables(model), X * 3, mutable=["batch_stats"])
  assert_close(clone(X * 3, mutable=["batch_stats"]), y2)


# ===================================================== Linen variables in, Linen variables out
drop_in_bias_name = "drop_in_bias"


class DropInBias(nnx.Variable):
  pass


if hasattr(nnx, "register_variable_name"):
  nnx.register_variable_name(drop_in_bias_name, DropInBias, overwrite=True)
else:
  bridge.variables.register_variable_name_type_pair(drop_in_bias_name, DropInBias, overwrite=True)


class LinenInner(nn.Module):
  dout: int

  @nn.compact
  def __call__(self, x):
    w = self.param("w", nn.initializers.lecun_normal(), (x.shape[-1], self.dout))
    return nn.Dropout(rate=0.5, deterministic=False)(x @ w)


class LinenWhole(nn.Module):
  dout: int

  @nn.compact
  def __call__(self, x):
    b = self.variable(drop_in_bias_name, "b", nn.initializers.zeros_init(), None, (1, self.dout))
    return LinenInner(self.dout, name="dot")(x) + b.value


def test_state_structure_same_from_top_or_from_middle(impl):
  """flax's consistency test: bridging at the top or one level down gives the same state."""

  class NNXWhole(nnx.Module):
    def __init__(self, dout, *, rngs):
      self.dot = impl.ToNNX(LinenInner(dout), rngs=rngs)
      self.b = DropInBias(jnp.zeros((1, dout)))

    def __call__(self, x):
      return self.dot(x) + self.b[...]

  from_top = impl.lazy_init(impl.ToNNX(LinenWhole(3), rngs=nnx.Rngs(0, dropout=1)), X)
  from_middle = impl.lazy_init(NNXWhole(3, rngs=nnx.Rngs(0, dropout=1)), X)

  def weights(m):
    return nnx.split(m, nnx.RngState, ...)[2]

  assert jax.tree.structure(weights(from_top)) == jax.tree.structure(weights(from_middle))
  assert isinstance(from_top.b, DropInBias)


def test_load_linen_variables_then_call(impl):
  """Variables from a plain Linen `init` (another seed) loaded with nnx.update drive the call."""
  model = impl.lazy_init(impl.ToNNX(BNNet(), rngs=nnx.Rngs(0)), X)
  linen_vars = BNNet().init(jax.random.key(5), X)
  state = nnx.state(model)
  for path, leaf in flat_state(model):
    if is_wrapper_own(path):
      continue
    collection = collection_of(leaf_type(leaf))
    new = linen_vars[collection]
    for key in path:
      new = new[key]
    target = state
    for key in path[:-1]:
      target = target[key]
    target[path[-1]] = leaf.replace(new)
  nnx.update(model, state)
  jax.tree.map(np.testing.assert_array_equal, linen_variables(model), dict(linen_vars))
  want, _ = BNNet().apply(linen_vars, X, mutable=["batch_stats"])
  assert_close(model(X, mutable=["batch_stats"]), want)
