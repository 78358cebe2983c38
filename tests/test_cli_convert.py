"""`loopbridge convert`: an orbax Linen train state to an NNX checkpoint and back, checked
against the Linen state written by plain optax training (bit-exact after the round trip), and
the port restored from the NNX checkpoint computing what Linen computes."""

from __future__ import annotations

import importlib
import json
import sys
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from flax import nnx
from flax.nnx.training.optimizer import OptState

from loopbridge.__main__ import main

SOURCE = """
import jax.numpy as jnp
import optax
from flax import linen as nn, nnx


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return nn.LayerNorm()(nn.Dense(4)(x)), None


class Model(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.BatchNorm(use_running_average=False)(nn.Dense(4)(x))
    x, _ = nn.scan(Block, variable_axes={"params": 1}, split_rngs={"params": True}, length=2)(
      name="stack"
    )(x, None)
    return nn.Dense(2)(x)


class PortBlock(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(4, 4, rngs=rngs)
    self.norm = nnx.LayerNorm(4, rngs=rngs)

  def __call__(self, x):
    return self.norm(self.lin(x))


class Port(nnx.Module):
  def __init__(self, rngs):
    self.proj = nnx.Linear(3, 4, rngs=rngs)
    self.bn = nnx.BatchNorm(4, rngs=rngs)

    @nnx.split_rngs(splits=2)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return PortBlock(rngs)

    self.blocks = make(rngs)
    self.head = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    x = self.bn(self.proj(x), use_running_average=False)

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, block):
      return block(x)

    return self.head(run(x, self.blocks))


tx = optax.adam(1e-2)


class Fused(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = self.param("wi", nn.initializers.normal(1.0), (2, 3, 4))
    return nn.gelu(x @ w[0]) * (x @ w[1])


class SplitPort(nnx.Module):
  def __init__(self, rngs):
    self.gate = nnx.Linear(3, 4, use_bias=False, rngs=rngs)
    self.up = nnx.Linear(3, 4, use_bias=False, rngs=rngs)

  def __call__(self, x):
    return nnx.gelu(self.gate(x)) * self.up(x)


class Encoder(nn.Module):
  # Called as `encode(x, train=...)`: dropout draws random numbers in training mode.

  def setup(self):
    self.inp = nn.Dense(4)
    self.drop = nn.Dropout(0.5)
    self.out = nn.Dense(2)

  def encode(self, x, train):
    return self.out(self.drop(jnp.tanh(self.inp(x)), deterministic=not train))


class Annotated(nn.Module):
  # lm1b style: params boxed with logical axis names (nn.LogicallyPartitioned) at init.
  @nn.compact
  def __call__(self, x):
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    return nn.Dense(4, kernel_init=init, name="proj")(x)


class AnnotatedPort(nnx.Module):
  def __init__(self, rngs):
    self.proj = nnx.Linear(3, 4, rngs=rngs)

  def __call__(self, x):
    return self.proj(x)


class EncoderPort(nnx.Module):
  def __init__(self, rngs):
    self.first = nnx.Linear(3, 4, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.last = nnx.Linear(4, 2, rngs=rngs)

  def encode(self, x, train):
    return self.last(self.dropout(jnp.tanh(self.first(x)), deterministic=not train))
"""


@pytest.fixture
def target(tmp_path, monkeypatch):
  name = f"lb_cli_convert_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(SOURCE)
  monkeypatch.syspath_prepend(str(tmp_path))
  yield name
  sys.modules.pop(name, None)


def _same(a, b) -> bool:
  return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
    np.asarray(x).dtype == np.asarray(y).dtype and bool((np.asarray(x) == np.asarray(y)).all())
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


@pytest.mark.slow
def test_convert_a_linen_train_state_to_nnx_and_back(tmp_path, target, capsys):
  models = importlib.import_module(target)
  model, tx = models.Model(), models.tx
  x = jax.random.normal(jax.random.key(0), (5, 3))
  variables = model.init(jax.random.key(1), x)
  params, batch_stats, opt_state = variables["params"], variables["batch_stats"], None
  opt_state = tx.init(params)
  for step in range(2):  # plain Linen training: the reference train state
    y = jax.random.normal(jax.random.key(10 + step), (5, 2))

    def loss_fn(params, batch_stats=batch_stats, y=y):
      out, upd = model.apply(
        {"params": params, "batch_stats": batch_stats}, x, mutable=["batch_stats"]
      )
      return jnp.mean((out - y) ** 2), upd["batch_stats"]

    (_, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
  state = {
    "params": params,
    "batch_stats": batch_stats,
    "opt_state": opt_state,
    "step": jnp.asarray(2, jnp.int32),
  }
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(str(tmp_path / "linen"), state)
  checkpointer.wait_until_finished()

  common = [f"{target}:Model", f"{target}:Port", "--arg", "float32[5,3]", "--tx", f"{target}:tx"]
  code = main(["convert", *common, str(tmp_path / "linen"), str(tmp_path / "nnx"), "--json"])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert json.loads(out)["placements"][0]["nnx"] == "proj"
  assert json.loads(out)["tolerance"]["precision"] == "highest"  # the check's default

  # The NNX checkpoint, read the way the NNX checkpoint guide reads one.
  port = models.Port(nnx.Rngs(7))
  optimizer = nnx.Optimizer(port, tx, wrt=nnx.Param)
  restored = checkpointer.restore(
    str(tmp_path / "nnx"), {"model": nnx.state(port), "optimizer": nnx.state(optimizer, OptState)}
  )
  nnx.update(port, restored["model"])
  nnx.update(optimizer, restored["optimizer"])
  reference, _ = model.apply(
    {"params": params, "batch_stats": batch_stats}, x, mutable=["batch_stats"]
  )
  np.testing.assert_allclose(port(x), reference, rtol=1e-5, atol=1e-6)
  assert int(optimizer.step[...]) == 2

  code = main(["convert", *common, str(tmp_path / "nnx"), str(tmp_path / "back"), "--to", "linen"])
  assert code == 0, capsys.readouterr().err
  back = checkpointer.restore(str(tmp_path / "back"), state)
  assert _same(back, state)

  # DEST is never overwritten; a malformed --map is a usage error.
  code = main(["convert", *common, str(tmp_path / "linen"), str(tmp_path / "nnx")])
  assert code == 2 and "exists" in capsys.readouterr().err
  code = main(["convert", *common, str(tmp_path / "linen"), str(tmp_path / "x"), "--map", "a"])
  assert code == 2 and "expected LINEN_PATH=NNX_PATH" in capsys.readouterr().err


@pytest.mark.slow
def test_convert_with_a_rule_both_ways(tmp_path, target, capsys):
  models = importlib.import_module(target)
  x = jax.random.normal(jax.random.key(0), (5, 3))
  variables = models.Fused().init(jax.random.key(1), x)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(str(tmp_path / "linen"), variables)
  checkpointer.wait_until_finished()
  rule = "split('wi', ['gate/kernel', 'up/kernel'], axis=0)"
  common = [f"{target}:Fused", f"{target}:SplitPort", "--arg", "float32[5,3]", "--rule", rule]

  argv = ["convert", *common, str(tmp_path / "linen"), str(tmp_path / "nnx"), "--json"]
  code = main([*argv, "--precision", "model"])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert json.loads(out)["placements"][0]["transforms"] == [f"lb.checkpoint.{rule}"]
  assert json.loads(out)["tolerance"]["precision"] == "model"
  port = models.SplitPort(nnx.Rngs(7))
  nnx.update(port, checkpointer.restore(str(tmp_path / "nnx"), {"model": nnx.state(port)})["model"])
  np.testing.assert_allclose(port(x), models.Fused().apply(variables, x), rtol=1e-5, atol=1e-6)

  code = main(["convert", *common, str(tmp_path / "nnx"), str(tmp_path / "back"), "--to", "linen"])
  assert code == 0, capsys.readouterr().err
  assert _same(checkpointer.restore(str(tmp_path / "back"), variables), variables)


@pytest.mark.parametrize(
  "rule, match",
  [("split(", "cannot read the rule"), ("os.system('x')", "cannot read the rule")],
)
def test_a_malformed_rule_is_a_usage_error(tmp_path, rule, match, capsys):
  code = main(["convert", "a:b", "c:d", str(tmp_path / "s"), str(tmp_path / "d"), "--rule", rule])
  assert code == 2 and match in capsys.readouterr().err


def test_the_sample_call_takes_a_method_and_keyword_inputs(tmp_path, target, capsys):
  models = importlib.import_module(target)
  x = jax.random.normal(jax.random.key(0), (5, 3))
  linen = models.Encoder()
  variables = linen.init(jax.random.key(1), x, False, method="encode")
  variables = jax.tree.map(lambda a: a + 0.5, variables)  # not what an init would give
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(str(tmp_path / "linen"), variables)
  checkpointer.wait_until_finished()
  common = [f"{target}:Encoder", f"{target}:EncoderPort", "--arg", "float32[5,3]"]
  call = ["--method", "encode", "--kwarg", "train=False"]

  code = main(["convert", *common, *call, str(tmp_path / "linen"), str(tmp_path / "nnx")])
  assert code == 0, capsys.readouterr().err
  port = models.EncoderPort(nnx.Rngs(7))
  # Read as `convert --to linen` reads it: the port's dropout stream is a typed key, which the
  # orbax of flax 0.10 cannot restore into directly.
  io = importlib.import_module("loopbridge._cli.checkpoint_io")
  nnx.update(port, io.restore(str(tmp_path / "nnx"), {"model": nnx.state(port)}, "NNX")["model"])
  reference = linen.apply(variables, x, train=False, method="encode")
  np.testing.assert_allclose(port.encode(x, train=False), reference, rtol=1e-5, atol=1e-6)

  back = tmp_path / "back"
  code = main(["convert", *common, *call, str(tmp_path / "nnx"), str(back), "--to", "linen"])
  assert code == 0, capsys.readouterr().err
  assert _same(checkpointer.restore(str(back), variables), variables)

  # In training mode dropout draws other bits on each side: the check refuses, naming the fix.
  train = ["--method", "encode", "--kwarg", "train=True"]
  code = main(["convert", *common, *train, str(tmp_path / "linen"), str(tmp_path / "t")])
  assert code == 1 and "sample_kwargs={'train': False}" in capsys.readouterr().err


@pytest.mark.parametrize(
  "extra, code, match",
  [
    (["--method", "decode"], 2, "LINEN_TARGET Encoder has no method 'decode' (--method)"),
    (
      ["--method", "encode"],
      2,
      "the sample call (--arg float32[5,3] --method encode) failed (TypeError: "
      "Encoder.encode() missing",
    ),
    (["--kwarg", "train"], 2, "--kwarg 'train': expected NAME=VALUE"),
    (["--kwarg", "train=maybe"], 2, "is not a Python literal"),
  ],
  ids=["unknown method", "a keyword input missing", "no value", "not a literal"],
)
def test_a_bad_method_or_keyword_input_is_named(tmp_path, target, capsys, extra, code, match):
  common = [f"{target}:Encoder", f"{target}:EncoderPort", "--arg", "float32[5,3]"]
  got = main(["convert", *common, *extra, str(tmp_path / "src"), str(tmp_path / "dst")])
  assert got == code and match in capsys.readouterr().err


@pytest.mark.parametrize("saved", ["boxed", "unboxed"])
def test_a_train_state_saved_with_or_without_its_metadata_boxes_converts(
  tmp_path, target, capsys, saved
):
  models = importlib.import_module(target)
  model, tx = models.Annotated(), models.tx
  x = jax.random.normal(jax.random.key(0), (5, 3))
  params = model.init(jax.random.key(1), x)["params"]  # boxed: kernel is LogicallyPartitioned
  if saved == "unboxed":
    params = nn.unbox(params)  # what many training loops save
  opt_state = tx.init(params)
  state = {"params": params, "opt_state": opt_state, "step": jnp.asarray(3, jnp.int32)}
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(str(tmp_path / "linen"), state)
  checkpointer.wait_until_finished()

  argv = [f"{target}:Annotated", f"{target}:AnnotatedPort", "--arg", "float32[5,3]"]
  argv += ["--tx", f"{target}:tx", str(tmp_path / "linen"), str(tmp_path / "nnx")]
  assert main(["convert", *argv]) == 0, capsys.readouterr().err

  port = models.AnnotatedPort(nnx.Rngs(7))
  optimizer = nnx.Optimizer(port, tx, wrt=nnx.Param)
  restored = checkpointer.restore(
    str(tmp_path / "nnx"), {"model": nnx.state(port), "optimizer": nnx.state(optimizer, OptState)}
  )
  nnx.update(port, restored["model"])
  nnx.update(optimizer, restored["optimizer"])
  np.testing.assert_allclose(port(x), model.apply({"params": params}, x), rtol=1e-6, atol=1e-6)
  assert int(optimizer.step[...]) == 3
