"""lb.checkpoint.linen_to_nnx / nnx_to_linen against plain Linen apply and training.

The references are independent of the conversion: Linen `apply` outputs, a Linen training
loop with optax, and the port's arrays read by hand at the paths a person would map them to.
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

DEPTH = 3


def _list(items):
  # flax 0.12 modules hold lists of submodules as nnx.List; 0.10 as plain lists.
  return nnx.List(items) if hasattr(nnx, "List") else items


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return nn.LayerNorm()(nn.Dense(4)(x)), None


class LinenModel(nn.Module):
  axis: int = 1  # the scanned stack's layer axis (`variable_axes`)
  remat: bool = False
  per_layer: int = 0  # Linen per-layer Dense modules `layers_0`, ... before the stack

  @nn.compact
  def __call__(self, x, train=True):
    x = nn.Dense(4)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.5)(x)
    for i in range(self.per_layer):
      x = nn.relu(nn.Dense(4, name=f"layers_{i}")(x))
    body = nn.remat(Block) if self.remat else Block
    stack = nn.scan(
      body, variable_axes={"params": self.axis}, split_rngs={"params": True}, length=DEPTH
    )
    x, _ = stack(name="stack")(x, None)
    return nn.Dense(2, param_dtype=jnp.bfloat16, dtype=jnp.float32)(x)


class PortBlock(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(4, 4, rngs=rngs)
    self.norm = nnx.LayerNorm(4, rngs=rngs)

  def __call__(self, x):
    return self.norm(self.lin(x))


class Port(nnx.Module):
  """The hand port: its own attribute names, a list of layers, an nnx.vmap stack + nnx.scan."""

  def __init__(self, per_layer: int, rngs: nnx.Rngs):
    self.proj = nnx.Linear(3, 4, rngs=rngs)
    self.norm = nnx.BatchNorm(4, momentum=0.5, rngs=rngs)
    self.hidden = _list([nnx.Linear(4, 4, rngs=rngs) for _ in range(per_layer)])

    @nnx.split_rngs(splits=DEPTH)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return PortBlock(rngs)

    self.blocks = make(rngs)
    self.head = nnx.Linear(4, 2, param_dtype=jnp.bfloat16, dtype=jnp.float32, rngs=rngs)

  def __call__(self, x, train=True):
    x = self.norm(self.proj(x), use_running_average=not train)
    for layer in self.hidden:
      x = nnx.relu(layer(x))

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, block):
      return block(x)

    return self.head(run(x, self.blocks))


X = jax.random.normal(jax.random.key(0), (8, 3))


def _trained_like(variables):
  """Variables that are not an init's (so a test cannot pass by two equal inits)."""
  keys = iter(jax.random.split(jax.random.key(7), 100))
  return jax.tree.map(
    lambda a: jnp.abs(a + jax.random.normal(next(keys), a.shape, a.dtype)).astype(a.dtype),
    variables,
  )


def _same(a, b) -> bool:
  return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
    x.dtype == y.dtype and bool((np.asarray(x) == np.asarray(y)).all())
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


@pytest.mark.parametrize("axis, remat", [(0, False), pytest.param(1, True, marks=pytest.mark.slow)])
def test_round_trip_is_bit_exact_and_the_port_computes_what_linen_does(axis, remat):
  linen = LinenModel(axis=axis, remat=remat, per_layer=2)
  variables = _trained_like(linen.init(jax.random.key(1), X))
  port = Port(per_layer=2, rngs=nnx.Rngs(2))
  tx = optax.adam(1e-2)
  opt_state = jax.tree.map(lambda a: a + 1, tx.init(variables["params"]))
  optimizer = nnx.Optimizer(port, tx, wrt=nnx.Param)

  report = lb.checkpoint.linen_to_nnx(
    linen, variables, port, X, opt_state=opt_state, optimizer=optimizer
  )

  # The reference: plain Linen apply, in eval and in train mode (batch_stats updated).
  np.testing.assert_allclose(port(X, False), linen.apply(variables, X, False), rtol=1e-6)
  # The port's arrays where a person would look for them.
  stacked = np.moveaxis(np.asarray(variables["params"]["stack"]["Dense_0"]["kernel"]), axis, 0)
  np.testing.assert_array_equal(port.blocks.lin.kernel[...], stacked)
  np.testing.assert_array_equal(
    port.hidden[1].kernel[...], variables["params"]["layers_1"]["kernel"]
  )
  np.testing.assert_array_equal(
    port.norm.mean[...], variables["batch_stats"]["BatchNorm_0"]["mean"]
  )
  assert port.head.kernel[...].dtype == jnp.bfloat16
  assert int(optimizer.step[...]) == 1  # adam's count, plus one above
  lines = str(report).splitlines()
  assert any(
    "stack/Dense_0 [layers 0-2]" in line and "blocks/lin [layers 0-2]" in line for line in lines
  )
  assert report.to_dict()["placements"][0] == {
    "linen": "Dense_0",
    "nnx": "proj",
    "how": "order",
    "variables": [["params/bias", "params/bias"], ["params/kernel", "params/kernel"]],
    "transforms": [],
    "decided": "unique",
    "candidates": 1,
    "checked": "module",  # its own call compared with Linen's
    "max_abs_error": 0.0,
    "probes": [],  # one candidate: nothing to rule out
  }

  back, back_opt = lb.checkpoint.nnx_to_linen(port, linen, X, optimizer=optimizer)
  assert _same(back, {k: variables[k] for k in ("batch_stats", "params")})
  assert _same(back_opt, opt_state)


class Swapped(nnx.Module):
  """Calls its Linears in the other order than Linen: call order alone pairs them wrongly."""

  def __init__(self, rngs, dtype=jnp.float32):
    self.a = nnx.Linear(3, 3, param_dtype=dtype, rngs=rngs)
    self.b = nnx.Linear(3, 3, rngs=rngs)

  def __call__(self, x):
    return self.a(x) - self.b(x)


class TwoDense(nn.Module):
  @nn.compact
  def __call__(self, x):
    first = nn.Dense(3)(x)  # Dense_0: ported as `b`
    return nn.Dense(3)(x) - first  # Dense_1: ported as `a`


def test_unplaceable_variables_are_named_with_the_mapping_fix():
  x = jnp.ones((2, 3))
  variables = _trained_like(TwoDense().init(jax.random.key(0), x))

  class Wider(nnx.Module):
    def __init__(self):
      self.a = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
      self.wide = nnx.Linear(3, 5, rngs=nnx.Rngs(0))

    def __call__(self, x):
      return self.a(x), self.wide(x)

  port = Wider()
  before = np.asarray(port.a.kernel[...])
  with pytest.raises(
    lb.checkpoint.CheckpointError, match=r"(?s)Linen `Dense_1`.*NNX `wide`.*mapping="
  ):
    lb.checkpoint.linen_to_nnx(TwoDense(), variables, port, x)
  np.testing.assert_array_equal(port.a.kernel[...], before)  # nothing written
  with pytest.raises(lb.checkpoint.CheckpointError, match=r"mapping key 'Dense_9' names no Linen"):
    lb.checkpoint.linen_to_nnx(
      TwoDense(), variables, Swapped(nnx.Rngs(0)), x, mapping={"Dense_9": "a"}
    )

  # mapping= pairs what call order would pair wrongly.
  swapped = Swapped(nnx.Rngs(0))
  report = lb.checkpoint.linen_to_nnx(
    TwoDense(), variables, swapped, x, mapping={"Dense_0": "b", "Dense_1": "a"}
  )
  np.testing.assert_allclose(swapped(x), TwoDense().apply(variables, x), rtol=1e-6)
  assert {p.how for p in report.placements} == {"mapping"}


@pytest.mark.parametrize(
  "call, match",
  [
    (lambda v, p, x: lb.checkpoint.linen_to_nnx(TwoDense(), v, p, x, opt_state=()), "go together"),
    (lambda v, p, x: lb.checkpoint.linen_to_nnx(TwoDense(), [v], p, x), "variables dict"),
    (
      lambda v, p, x: lb.checkpoint.linen_to_nnx(TwoDense(), {"params": {}}, p, x),
      r"missing \['params/Dense_0/bias'",
    ),
    (lambda v, p, x: lb.checkpoint.linen_to_nnx(nnx.Linear, v, p, x), "flax.linen Module"),
    (lambda v, p, x: lb.checkpoint.linen_to_nnx(TwoDense(), v, p), "sample arguments failed"),
    (
      lambda v, p, x: lb.checkpoint.linen_to_nnx(TwoDense(), v, p, x, mapping={"Dense_0": "z"}),
      "mapping value 'z' names no NNX module",
    ),
    (
      lambda v, p, x: lb.checkpoint.linen_to_nnx(
        TwoDense(),
        v,
        p,
        x,
        opt_state=optax.sgd(0.1, momentum=0.9).init(v["params"]),
        optimizer=nnx.Optimizer(p, optax.adam(0.1), wrt=nnx.Param),
      ),
      "optax state does not have the structure",
    ),
    (
      lambda v, p, x: lb.checkpoint.linen_to_nnx(
        TwoDense(), v, Swapped(nnx.Rngs(0), jnp.bfloat16), x
      ),
      # Values are never cast: a module of other dtypes has no counterpart.
      r"(?s)Linen `Dense_1` \(params/bias float32\[3\].*NNX `a` \(params/bias bfloat16\[3\]",
    ),
  ],
  ids=["opt", "variables", "missing", "module", "args", "mapping", "tx", "dtype"],
)
def test_bad_inputs_say_what_and_how_to_fix(call, match):
  x = jnp.ones((2, 3))
  variables = TwoDense().init(jax.random.key(0), x)
  with pytest.raises(lb.checkpoint.CheckpointError, match=match):
    call(variables, Swapped(nnx.Rngs(0)), x)


def _linen_train(linen, tx, variables, opt_state, batches):
  @jax.jit
  def step(params, batch_stats, opt_state, x, y):
    def loss_fn(params):
      out, updates = linen.apply(
        {"params": params, "batch_stats": batch_stats}, x, True, mutable=["batch_stats"]
      )
      return jnp.mean((out - y) ** 2), updates["batch_stats"]

    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), batch_stats, opt_state, loss

  params, batch_stats, losses = variables["params"], variables["batch_stats"], []
  for x, y in batches:
    params, batch_stats, opt_state, loss = step(params, batch_stats, opt_state, x, y)
    losses.append(float(loss))
  return {"params": params, "batch_stats": batch_stats}, opt_state, losses


@pytest.mark.slow
def test_training_continues_identically_after_conversion():
  linen, tx = LinenModel(axis=1), optax.adam(1e-2)
  keys = jax.random.split(jax.random.key(3), 12)
  batches = [
    (jax.random.normal(keys[2 * i], (8, 3)), jax.random.normal(keys[2 * i + 1], (8, 2)))
    for i in range(6)
  ]
  variables = linen.init(jax.random.key(1), X)
  variables, opt_state, _ = _linen_train(
    linen, tx, variables, tx.init(variables["params"]), batches[:3]
  )

  port = Port(per_layer=0, rngs=nnx.Rngs(5))
  optimizer = nnx.Optimizer(port, tx, wrt=nnx.Param)
  lb.checkpoint.linen_to_nnx(linen, variables, port, X, opt_state=opt_state, optimizer=optimizer)
  assert int(optimizer.step[...]) == 3

  @nnx.jit
  def nnx_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x, True) - y) ** 2))(model)
    _compat.optimizer_update(optimizer, model, grads)
    return loss

  nnx_losses = [float(nnx_step(port, optimizer, x, y)) for x, y in batches[3:]]
  variables, _, linen_losses = _linen_train(linen, tx, variables, opt_state, batches[3:])

  np.testing.assert_allclose(nnx_losses, linen_losses, rtol=1e-5)
  params = variables["params"]
  close = dict(rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(port.proj.kernel[...], params["Dense_0"]["kernel"], **close)
  np.testing.assert_allclose(
    port.blocks.lin.kernel[...], np.moveaxis(params["stack"]["Dense_0"]["kernel"], 1, 0), **close
  )
  scale = port.blocks.norm.scale
  assert scale is not None
  np.testing.assert_allclose(
    scale[...], np.moveaxis(params["stack"]["LayerNorm_0"]["scale"], 1, 0), **close
  )
  np.testing.assert_allclose(
    port.norm.var[...], variables["batch_stats"]["BatchNorm_0"]["var"], **close
  )
  np.testing.assert_allclose(
    np.asarray(port.head.kernel[...], np.float32),
    np.asarray(params["Dense_1"]["kernel"], np.float32),
    rtol=1e-2,
  )
  assert int(optimizer.step[...]) == 6


@pytest.mark.slow
def test_converted_values_keep_the_ports_shardings():
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
  width = 8 * len(jax.devices())
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "x"))
  port = nnx.Linear(3, width, rngs=nnx.Rngs(0))
  _compat.set_variable_value(port.kernel, jax.device_put(port.kernel[...], sharding))
  variables = _trained_like(nn.Dense(width).init(jax.random.key(1), X))

  lb.checkpoint.linen_to_nnx(nn.Dense(width), variables, port, X)

  assert port.kernel[...].sharding == sharding  # a fresh array would sit on one device
  np.testing.assert_array_equal(port.kernel[...], variables["params"]["kernel"])


class ScannedBlocks(nn.Module):
  @nn.compact
  def __call__(self, x):
    stack = nn.scan(Block, variable_axes={"params": 1}, split_rngs={"params": True}, length=DEPTH)
    return stack(name="stack")(x, None)[0]


class PerLayerBlocks(nn.Module):
  @nn.compact
  def __call__(self, x):
    for i in range(DEPTH):
      x, _ = Block(name=f"layers_{i}")(x, None)
    return x


class NamedBlock(nnx.Module):
  def __init__(self, rngs):
    self.Dense_0 = nnx.Linear(4, 4, rngs=rngs)
    self.LayerNorm_0 = nnx.LayerNorm(4, rngs=rngs)

  def __call__(self, x):
    return self.LayerNorm_0(self.Dense_0(x))


class ListOfBlocks(nnx.Module):
  def __init__(self, rngs):
    self.layers = _list([NamedBlock(rngs) for _ in range(DEPTH)])

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


class StackOfBlocks(nnx.Module):
  def __init__(self, rngs):
    @nnx.split_rngs(splits=DEPTH)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return NamedBlock(rngs)

    self.blocks = make(rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, block):
      return block(x)

    return run(x, self.blocks)


@pytest.mark.slow
@pytest.mark.parametrize("linen_cls", [ScannedBlocks, PerLayerBlocks])
@pytest.mark.parametrize("port_cls", [ListOfBlocks, StackOfBlocks])
def test_every_stack_layout_converts_both_ways(linen_cls, port_cls):
  x = jax.random.normal(jax.random.key(0), (2, 4))
  variables = _trained_like(linen_cls().init(jax.random.key(1), x))
  port = port_cls(nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(linen_cls(), variables, port, x)
  assert type(port) is port_cls  # the discovery run logs calls on a copy only
  np.testing.assert_allclose(port(x), linen_cls().apply(variables, x), rtol=1e-5, atol=1e-6)
  assert _same(lb.checkpoint.nnx_to_linen(port, linen_cls(), x), dict(variables))


# --- a sample call with keywords or another method (as in Linen's apply) --------------------


class KeywordNet(nn.Module):
  """Needs `train=` on every call; `score` is a second method over the same modules."""

  def setup(self):
    self.proj = nn.Dense(4)
    self.norm = nn.BatchNorm()
    self.drop = nn.Dropout(0.5)
    self.head = nn.Dense(2)

  def __call__(self, x, *, train: bool):
    h = self.norm(self.proj(x), use_running_average=not train)
    return self.head(nn.relu(self.drop(h, deterministic=not train)))

  def score(self, x, scale):
    return scale * self.head(self.norm(self.proj(x), use_running_average=True))


class KeywordPort(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.proj = nnx.Linear(3, 4, rngs=rngs)
    self.norm = nnx.BatchNorm(4, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)
    self.head = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x, *, train: bool):
    h = self.norm(self.proj(x), use_running_average=not train)
    return self.head(nnx.relu(self.drop(h, deterministic=not train)))

  def score(self, x, scale):
    return scale * self.head(self.norm(self.proj(x), use_running_average=True))


def _keyword_variables():
  x = jax.random.normal(jax.random.key(0), (5, 3))
  return x, _trained_like(KeywordNet().init(jax.random.key(1), x, train=False))


def test_a_sample_call_with_keywords_converts_both_ways():
  x, variables = _keyword_variables()
  port = KeywordPort(nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(KeywordNet(), variables, port, x, sample_kwargs={"train": False})
  reference = KeywordNet().apply(variables, x, train=False)
  np.testing.assert_allclose(port(x, train=False), reference, rtol=1e-5, atol=1e-6)
  back = lb.checkpoint.nnx_to_linen(port, KeywordNet(), x, sample_kwargs={"train": False})
  assert _same(back, dict(variables))


def test_a_sample_call_of_another_method_converts_both_ways():
  x, variables = _keyword_variables()
  port = KeywordPort(nnx.Rngs(0))
  lb.checkpoint.linen_to_nnx(
    KeywordNet(), variables, port, x, method="score", sample_kwargs={"scale": 3.0}
  )
  reference = KeywordNet().apply(variables, x, 3.0, method="score")
  np.testing.assert_allclose(port.score(x, 3.0), reference, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    port(x, train=False), KeywordNet().apply(variables, x, train=False), rtol=1e-5, atol=1e-6
  )
  back = lb.checkpoint.nnx_to_linen(port, KeywordNet(), x, 2.0, method="score")
  assert _same(back, dict(variables))


def test_a_keyword_the_sample_call_lacks_is_reported():
  x, variables = _keyword_variables()
  with pytest.raises(lb.checkpoint.CheckpointError, match="train"):
    lb.checkpoint.linen_to_nnx(KeywordNet(), variables, KeywordPort(nnx.Rngs(0)), x)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"method": "decode"}, r"method='decode': the Linen model KeywordNet has no method"),
    ({"method": 3}, r"method= takes the name of the method"),
    ({"sample_kwargs": [("train", False)]}, r"sample_kwargs= takes the keyword arguments"),
  ],
)
def test_a_bad_sample_call_is_refused(kwargs, match):
  x, variables = _keyword_variables()
  port = KeywordPort(nnx.Rngs(0))
  with pytest.raises(lb.checkpoint.CheckpointError, match=match):
    lb.checkpoint.linen_to_nnx(KeywordNet(), variables, port, x, **kwargs)
  with pytest.raises(lb.checkpoint.CheckpointError, match=match.replace("Linen model", ".*")):
    lb.checkpoint.nnx_to_linen(port, KeywordNet(), x, **kwargs)


def test_a_method_only_the_linen_model_has_is_refused():
  class Bare(KeywordPort):
    score = None  # pyright: ignore[reportAssignmentType]

  x, variables = _keyword_variables()
  with pytest.raises(lb.checkpoint.CheckpointError, match=r"the port Bare has no method 'score'"):
    lb.checkpoint.linen_to_nnx(KeywordNet(), variables, Bare(nnx.Rngs(0)), x, 1.0, method="score")
