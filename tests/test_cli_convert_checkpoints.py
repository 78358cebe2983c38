"""`loopbridge convert` reading checkpoints: a port holding an rng stream round-trips, a
checkpoint that does not fit the models is refused with the fix for its cause, and stderr holds
only the one-line error (no orbax/asyncio shutdown noise). References: the Linen variables
written by plain Linen `init`, and the port's own rng state read back by hand."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from loopbridge.__main__ import main

from conftest import child_env

SOURCE = """
import optax
from flax import linen as nn, nnx


class Model(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dropout(0.5, deterministic=True)(nn.Dense(4)(x))
    return nn.Dense(2)(x)


class Port(nnx.Module):
  def __init__(self, rngs):
    self.proj = nnx.Linear(3, 4, rngs=rngs)
    self.drop = nnx.Dropout(0.5, deterministic=True, rngs=rngs)  # holds an rng stream
    self.head = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.head(self.drop(self.proj(x)))


tx = optax.sgd(0.1)
"""


@pytest.fixture
def target(tmp_path, monkeypatch):
  name = f"lb_cli_ckpt_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(SOURCE)
  monkeypatch.syspath_prepend(str(tmp_path))
  yield name
  sys.modules.pop(name, None)


def _linen_checkpoint(path, models, with_opt: bool = False, step: object = None, dtype=None):
  variables = models.Model().init(jax.random.key(1), jnp.ones((5, 3)))
  if dtype is not None:
    variables = jax.tree.map(lambda a: a.astype(dtype), variables)
  state = dict(variables)
  if with_opt:
    step = jnp.asarray(3, jnp.int32) if step is None else step
    state |= {"opt_state": models.tx.init(variables["params"]), "step": step}
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(str(path), state)
  checkpointer.wait_until_finished()
  return state


def _keys(tree):
  return [
    np.asarray(jax.random.key_data(x))
    for x in jax.tree.leaves(tree)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
  ]


def test_a_port_holding_an_rng_stream_converts_both_ways(tmp_path, target, capsys):
  models = importlib.import_module(target)
  state = _linen_checkpoint(tmp_path / "linen", models)
  common = [f"{target}:Model", f"{target}:Port", "--arg", "float32[5,3]"]

  assert main(["convert", *common, str(tmp_path / "linen"), str(tmp_path / "nnx")]) == 0
  back_args = [str(tmp_path / "nnx"), str(tmp_path / "back"), "--to", "linen"]
  assert main(["convert", *common, *back_args]) == 0
  assert capsys.readouterr().err.count("error") == 0

  checkpointer = ocp.StandardCheckpointer()
  back = checkpointer.restore(str(tmp_path / "back"), state)
  for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(state)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)

  # The port's rng stream was saved and comes back as a typed key with the same data.
  port = models.Port(nnx.Rngs(0))  # what `convert` builds with the default --seed
  fresh = models.Port(nnx.Rngs(123))
  assert not all((a == b).all() for a, b in zip(_keys(nnx.state(port)), _keys(nnx.state(fresh))))
  io = importlib.import_module("loopbridge._cli.checkpoint_io")
  restored = io.restore(str(tmp_path / "nnx"), {"model": nnx.state(fresh)}, "NNX")
  got, want = _keys(restored), _keys(nnx.state(port))
  assert len(got) == len(want) == 1
  np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize(
  "extra, kind, match",
  [
    (
      ["--arg", "float32[5,7]"],
      False,
      r"params/Dense_0/kernel saved float32\[3, 4\], the models "
      r"make float32\[7, 4\]\. Fix: pass the --arg shapes",
    ),
    (["--arg", "float32[5,3]", "--tx", "{t}:tx"], False, "Fix: drop --tx"),
    (["--arg", "float32[5,3]"], True, r"Fix: pass --tx \(the optax transformation"),
    (
      ["--arg", "float32[5,3]"],
      "bfloat16",
      r"saved bfloat16\[3, 4\], the models make float32"
      r"\[3, 4\].*Fix: build the models with the checkpoint's dtypes",
    ),
  ],
)
def test_a_checkpoint_that_does_not_fit_is_refused_with_the_fix_for_its_cause(
  tmp_path, target, capsys, extra, kind, match
):
  models = importlib.import_module(target)
  if kind == "bfloat16":
    _linen_checkpoint(tmp_path / "linen", models, dtype=jnp.bfloat16)
  else:
    _linen_checkpoint(tmp_path / "linen", models, with_opt=kind)
  args = [a.format(t=target) for a in extra]
  code = main(
    [
      "convert",
      f"{target}:Model",
      f"{target}:Port",
      *args,
      str(tmp_path / "linen"),
      str(tmp_path / "out"),
    ]
  )
  err = capsys.readouterr().err
  assert code == 2  # usage or environment: the checkpoint is not what the models describe
  assert "does not hold the Linen checkpoint" in err
  assert re.search(match, err), err
  assert not (tmp_path / "out").exists()


def test_a_step_saved_as_a_python_int_is_read(tmp_path, target, capsys):
  """flax's TrainState starts from `step=0`, a Python int: orbax saves it as an int64 scalar."""
  _linen_checkpoint(tmp_path / "linen", importlib.import_module(target), True, step=3)
  code = main(
    [
      "convert",
      f"{target}:Model",
      f"{target}:Port",
      "--arg",
      "float32[5,3]",
      "--tx",
      f"{target}:tx",
      str(tmp_path / "linen"),
      str(tmp_path / "nnx"),
      "--json",
    ]
  )
  out = capsys.readouterr().out
  assert code == 0, out
  assert '"step": 3' in out


def test_a_directory_orbax_cannot_read_is_named_as_such(tmp_path, target, capsys):
  (tmp_path / "junk").mkdir()
  (tmp_path / "junk" / "note.txt").write_text("not a checkpoint")
  code = main(
    [
      "convert",
      f"{target}:Model",
      f"{target}:Port",
      "--arg",
      "float32[5,3]",
      str(tmp_path / "junk"),
      str(tmp_path / "out"),
    ]
  )
  assert code == 2
  assert "is not a readable orbax checkpoint" in capsys.readouterr().err


@pytest.mark.slow
def test_stderr_holds_only_the_one_line_error(tmp_path, target):
  """A separate process, as a user runs it: orbax's failed-read shutdown noise would appear
  there (asyncio log lines, 'Event loop is closed' tracebacks), after `main` returns."""
  _linen_checkpoint(tmp_path / "linen", importlib.import_module(target))
  env = child_env(str(tmp_path), *sys.path)
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "loopbridge",
      "convert",
      f"{target}:Model",
      f"{target}:Port",
      "--arg",
      "float32[5,7]",
      str(tmp_path / "linen"),
      str(tmp_path / "out"),
    ],
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
    check=False,
  )
  assert run.returncode == 2
  lines = run.stderr.splitlines()
  errors = [line for line in lines if line.startswith("loopbridge convert: error: ")]
  # Besides the error, only progress notes ("loopbridge: importing the models...").
  notes = [line for line in lines if line.startswith("loopbridge: ") and line.endswith("...")]
  assert len(errors) == 1 and "the models make float32[7, 4]" in errors[0], run.stderr
  assert len(lines) == len(errors) + len(notes), run.stderr[:3000]
