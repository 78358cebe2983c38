"""The command line on a model as real ones are: dropout and a required keyword `train=`.

A new user's flow from the shell (`inspect`, `port`, `convert`, `compare` with `--kwarg`), the
Linen weights loaded into a port holding rng state and an `nnx.List` of blocks, a wrong
LayerNorm epsilon named at its module from the Linen checkpoint alone (checked against plain
Linen `apply`), and the exit statuses every subcommand shares.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import uuid

import jax
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import loopbridge as lb
from loopbridge.__main__ import main
from loopbridge._cli import call_specs, compare_cmd, errors, inspect_cmd, loading

SOURCE = '''
import flax.linen as nn
import jax.numpy as jnp
from flax import nnx


class MlpBlock(nn.Module):
  @nn.compact
  def __call__(self, x, *, deterministic):
    y = nn.gelu(nn.Dense(16)(x))
    y = nn.Dropout(rate=0.1)(y, deterministic=deterministic)
    return nn.Dense(x.shape[-1])(y)


class Encoder1DBlock(nn.Module):
  @nn.compact
  def __call__(self, x, *, deterministic):
    y = nn.Dense(x.shape[-1])(nn.LayerNorm()(x))
    x = x + nn.Dropout(rate=0.1)(y, deterministic=deterministic)
    return x + MlpBlock()(nn.LayerNorm()(x), deterministic=deterministic)


class ViT(nn.Module):
  """A small ViT: a cls token, dropout, blocks named encoderblock_0, encoderblock_1."""

  @nn.compact
  def __call__(self, x, *, train):
    x = nn.Dense(8, name="embedding")(x)
    cls = self.param("cls", nn.initializers.normal(1.0), (1, 1, 8))
    x = jnp.concatenate([jnp.tile(cls, [x.shape[0], 1, 1]), x], axis=1)
    x = nn.Dropout(rate=0.1)(x, deterministic=not train)
    for i in range(2):
      x = Encoder1DBlock(name=f"encoderblock_{i}")(x, deterministic=not train)
    x = nn.LayerNorm(name="encoder_norm")(x)
    return nn.Dense(3, name="head")(x[:, 0])

  def features(self, x, *, train):
    return self(x, train=train)


def nnx_list(items):
  return nnx.List(items) if hasattr(nnx, "List") else items


class PortMlp(nnx.Module):
  def __init__(self, rngs):
    self.Dense_0 = nnx.Linear(8, 16, rngs=rngs)
    self.Dropout_0 = nnx.Dropout(0.1, rngs=rngs)
    self.Dense_1 = nnx.Linear(16, 8, rngs=rngs)

  def __call__(self, x, *, deterministic):
    y = self.Dropout_0(nnx.gelu(self.Dense_0(x)), deterministic=deterministic)
    return self.Dense_1(y)


class PortBlock(nnx.Module):
  def __init__(self, rngs, epsilon=1e-6):
    self.LayerNorm_0 = nnx.LayerNorm(8, rngs=rngs)
    self.Dense_0 = nnx.Linear(8, 8, rngs=rngs)
    self.Dropout_0 = nnx.Dropout(0.1, rngs=rngs)
    self.LayerNorm_1 = nnx.LayerNorm(8, epsilon=epsilon, rngs=rngs)
    self.MlpBlock_0 = PortMlp(rngs)

  def __call__(self, x, *, deterministic):
    x = x + self.Dropout_0(self.Dense_0(self.LayerNorm_0(x)), deterministic=deterministic)
    return x + self.MlpBlock_0(self.LayerNorm_1(x), deterministic=deterministic)


class Port(nnx.Module):
  """As `loopbridge port` drafts it: rng streams in every Dropout, an nnx.List of blocks."""

  def __init__(self, rngs, epsilon=1e-6):
    self.embedding = nnx.Linear(6, 8, rngs=rngs)
    self.cls = nnx.Param(nnx.initializers.normal(1.0)(rngs.params(), (1, 1, 8)))
    self.Dropout_0 = nnx.Dropout(0.1, rngs=rngs)
    self.encoderblock = nnx_list([PortBlock(rngs, epsilon) for _ in range(2)])
    self.encoder_norm = nnx.LayerNorm(8, rngs=rngs)
    self.head = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x, *, train):
    x = self.embedding(x)
    x = jnp.concatenate([jnp.tile(self.cls[...], [x.shape[0], 1, 1]), x], axis=1)
    x = self.Dropout_0(x, deterministic=not train)
    for block in self.encoderblock:
      x = block(x, deterministic=not train)
    return self.head(self.encoder_norm(x)[:, 0])

  def features(self, x, *, train):
    return self(x, train=train)


def wrong_epsilon(rngs):
  """The planted bug: LayerNorm_1 of every block with epsilon=1e-3 (Linen: 1e-6)."""
  return Port(rngs, epsilon=1e-3)
'''

X = "float32[2,4,6]"


@pytest.fixture
def target(tmp_path, monkeypatch):
  name = f"lb_cli_vit_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(SOURCE)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.chdir(tmp_path)
  yield name
  sys.modules.pop(name, None)


def run(capsys, *argv):
  code = main(list(argv))
  out, err = capsys.readouterr()
  return code, out, err


def _sample(target):
  module = importlib.import_module(target)
  x = jax.random.normal(jax.random.key(1), (2, 4, 6))
  variables = module.ViT().init(jax.random.key(0), x, train=False)
  return module, x, variables


# ---------------------------------------------------------------- weights into any port
def _rng_values(port):
  leaves = jax.tree.leaves(nnx.state(port, nnx.RngState))
  return [
    np.asarray(jax.random.key_data(v) if jax.numpy.issubdtype(v.dtype, jax.dtypes.prng_key) else v)
    for v in leaves
  ]


def test_linen_weights_load_into_a_port_with_rng_state_and_a_list(target):
  """A port holding rng streams (nnx.Dropout(..., rngs=)) and nnx.List blocks takes the Linen
  weights; it then computes what plain Linen computes."""
  module, x, variables = _sample(target)
  port = loading.load_nnx_target(f"{target}:Port", seed=5)
  rng_before = _rng_values(port)
  assert compare_cmd.load_linen_params(port, variables) == 27  # every param, nothing else
  rng_after = _rng_values(port)
  assert rng_before and all(np.array_equal(a, b) for a, b in zip(rng_before, rng_after))
  np.testing.assert_allclose(
    port(x, train=False), module.ViT().apply(variables, x, train=False), rtol=1e-5, atol=1e-6
  )


def test_load_params_maps_a_list_of_blocks_to_linen_names(target):
  """`lb.layers.load_params([params], [port])`, as lb.compare's docstring loads a port:
  `encoderblock/0` takes Linen's `encoderblock_0`."""
  module, x, variables = _sample(target)
  port = module.Port(nnx.Rngs(3))
  lb.layers.load_params([variables["params"]], [port])
  np.testing.assert_allclose(
    port(x, train=False), module.ViT().apply(variables, x, train=False), rtol=1e-5, atol=1e-6
  )


def test_the_planted_epsilon_is_named_by_lb_compare_from_the_linen_weights_alone(target):
  module, x, variables = _sample(target)
  port = module.wrong_epsilon(nnx.Rngs(3))  # its own weights are random: only Linen's count
  lb.layers.load_params([variables["params"]], [port])
  report = lb.compare((module.ViT(), variables), port, x, train=False)
  assert not report.ok
  first = report.first_divergence
  assert first is not None
  assert (first.reference_path, first.candidate_path) == (
    "encoderblock_0/LayerNorm_1",
    "encoderblock/0/LayerNorm_1",
  )
  # the same port with Linen's epsilon agrees: the divergence is the epsilon, not the loading
  good = module.Port(nnx.Rngs(3))
  lb.layers.load_params([variables["params"]], [good])
  assert lb.compare((module.ViT(), variables), good, x, train=False).ok


def test_compare_cli_names_the_planted_epsilon(capsys, target):
  argv = ["compare", f"{target}:ViT", f"{target}:wrong_epsilon", "--arg", X]
  code, out, err = run(capsys, *argv, "--kwarg", "train=False", "--json")
  assert code == errors.FAILURE, err
  first = json.loads(out)["first_divergence"]
  assert (first["reference_path"], first["candidate_path"]) == (
    "encoderblock_0/LayerNorm_1",
    "encoderblock/0/LayerNorm_1",
  )
  code, out, err = run(
    capsys, "compare", f"{target}:ViT", f"{target}:Port", "--arg", X, "--kwarg", "train=False"
  )
  assert code == errors.SUCCESS, out + err
  assert out.startswith("lb.compare: OK")


def test_compare_cli_takes_a_method(capsys, target):
  code, out, err = run(
    capsys,
    "compare",
    f"{target}:ViT",
    f"{target}:wrong_epsilon",
    "--arg",
    X,
    "--kwarg",
    "train=False",
    "--method",
    "features",
  )
  assert code == errors.FAILURE, err
  assert "first at reference encoderblock_0/LayerNorm_1" in out
  code, _, err = run(
    capsys,
    "compare",
    f"{target}:ViT",
    f"{target}:Port",
    "--arg",
    X,
    "--kwarg",
    "train=False",
    "--method",
    "nope",
  )
  assert code == errors.USAGE_ERROR
  assert "OLD_TARGET ViT has no method 'nope' (--method)" in err


def test_lb_compare_takes_a_method(target):
  module, x, variables = _sample(target)
  port = module.Port(nnx.Rngs(3))
  lb.layers.load_params([variables["params"]], [port])
  assert lb.compare((module.ViT(), variables), port, x, train=False, method="features").ok
  with pytest.raises(lb.CompareError, match=r"method='nope': the reference ViT has no such"):
    lb.compare((module.ViT(), variables), port, x, train=False, method="nope")


# ---------------------------------------------------------------- the shared call options
@pytest.mark.parametrize("command", ["compare", "inspect", "convert", "port"])
def test_every_subcommand_takes_the_same_call_options(command):
  from loopbridge._cli.main import build_parser

  parser = build_parser()
  sub = next(a for a in parser._actions if a.dest == "command")
  options = {o for a in sub.choices[command]._actions for o in a.option_strings}  # pyright: ignore
  assert {"--arg", "--kwarg", "--method"} <= options
  assert ("--call" in options) == (command == "port")


@pytest.mark.parametrize("command", ["compare", "inspect"])
def test_a_missing_keyword_input_names_the_option_to_add(capsys, target, command):
  argv = (
    [command, f"{target}:ViT", f"{target}:Port"]
    if command == "compare"
    else [command, f"{target}:ViT"]
  )
  code, out, err = run(capsys, *argv, "--arg", X)
  assert code == errors.USAGE_ERROR and out == ""
  line = err.strip().splitlines()[-1]
  assert "missing 1 required keyword-only argument: 'train'" in line
  assert line.endswith("Fix: add --kwarg train=... (e.g. --kwarg train=False).")


def test_inspect_runs_a_model_with_a_required_keyword(capsys, target):
  code, out, err = run(
    capsys,
    "inspect",
    f"{target}:ViT",
    "--arg",
    X,
    "--kwarg",
    "train=False",
    "--capture",
    "Encoder1DBlock",
    "--steps",
    "2",
  )
  assert code == errors.SUCCESS, err
  assert "lb.ToNNX: ran 2 steps" in out
  assert "intermediates/encoderblock_0/__call__" in out


def test_missing_argument_hint():
  hint = call_specs.missing_argument_hint
  assert hint(TypeError("f() missing 1 required positional argument: 'x'")) == (
    " Fix: add one --arg DTYPE[DIMS] per positional input, in order (missing: x), e.g. "
    "--arg float32[1,16]."
  )
  assert hint(TypeError("f() missing 2 required keyword-only arguments: 'train' and 'mask'")) == (
    " Fix: add --kwarg train=... --kwarg mask=... (e.g. --kwarg train=False --kwarg mask=VALUE)."
  )
  assert hint(ValueError("missing 1 required positional argument: 'x'")) == ""
  wrapped = RuntimeError("the draft failed")
  wrapped.__cause__ = TypeError("g() missing 1 required keyword-only argument: 'deterministic'")
  assert hint(wrapped).endswith("(e.g. --kwarg deterministic=True).")


# ---------------------------------------------------------------- the exit statuses
def test_exit_status_0_equal_1_diverges(capsys, target):
  base = ["compare", f"{target}:ViT"]
  assert run(capsys, *base, f"{target}:Port", "--arg", X, "--kwarg", "train=False")[0] == 0
  assert run(capsys, *base, f"{target}:wrong_epsilon", "--arg", X, "--kwarg", "train=False")[0] == 1


def test_exit_status_1_for_a_port_that_does_not_fit(capsys, target):
  code, out, err = run(
    capsys, "compare", f"{target}:ViT", f"{target}:PortMlp", "--arg", X, "--kwarg", "train=False"
  )
  assert code == errors.FAILURE and out == ""
  assert "cannot load the Linen params into NEW_TARGET: the port has a Param at" in err


@pytest.mark.parametrize(
  "argv",
  [
    ["compare", "nocolon", "x:y"],
    ["compare", "lb_no_such_module_xyz:M", "x:y"],
    ["inspect", "lb_no_such_module_xyz:M"],
    ["port", "lb_no_such_module_xyz:M"],
    ["convert", "lb_no_such_module_xyz:M", "x:y", "src", "dest"],
    ["inspect", "--kwarg", "train"],
  ],
)
def test_exit_status_2_usage_for_every_subcommand(capsys, argv):
  code, out, err = run(capsys, *argv)
  assert code == errors.USAGE_ERROR and out == "" and "Traceback" not in err


def test_exit_status_2_for_a_backend_jax_cannot_start(capsys, monkeypatch):
  """`JAX_PLATFORMS=tpu` where libtpu is missing: JAX's RuntimeError, as jax 0.10.2 says it."""
  missing = (
    "Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so: libtpu.so: cannot "
    "open shared object file: No such file or directory (set JAX_PLATFORMS='' to "
    "automatically choose an available backend)"
  )

  def no_backend(*args, **kwargs):
    raise RuntimeError(missing)

  monkeypatch.setattr(inspect_cmd, "inspect_model", no_backend)
  code, out, err = run(capsys, "inspect")
  assert code == errors.USAGE_ERROR and out == "" and "unexpected" not in err
  assert err.strip() == (
    "loopbridge inspect: error: JAX could not start the 'tpu' backend (INTERNAL: Failed to "
    "open libtpu.so: libtpu.so: cannot open shared object file: No such file or directory "
    "(set JAX_PLATFORMS='' to automatically choose an available backend)). Fix: run this "
    "command on the CPU, `JAX_PLATFORMS=cpu loopbridge inspect ...`, or install what that "
    "backend needs (e.g. `pip install 'jax[tpu]'` for a TPU, `jax[cuda12]` for a GPU) and "
    "unset JAX_PLATFORMS if it names a backend this machine lacks."
  )


def test_exit_status_3_internal_error_and_debug(capsys, monkeypatch, target):
  def broken(*args, **kwargs):
    raise KeyError("internal")

  monkeypatch.setattr(compare_cmd, "load_nnx_target", broken)
  code, out, err = run(capsys, "compare", f"{target}:ViT", "x:y")
  assert code == errors.INTERNAL_ERROR and out == "" and "Traceback" not in err
  assert err.strip().endswith(
    "unexpected KeyError: 'internal' (run again with --debug for the traceback)"
  )
  code, _, err = run(capsys, "compare", f"{target}:ViT", "x:y", "--debug")
  assert code == errors.INTERNAL_ERROR and "Traceback" in err and "KeyError" in err


def test_every_help_documents_the_exit_statuses(capsys):
  for command in ("inspect", "compare", "convert", "port"):
    with pytest.raises(SystemExit):
      main([command, "--help"])
    assert " ".join(errors.EXIT_STATUS_HELP.split()) in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------- conversion's refusal
def test_linen_to_nnx_refusal_names_the_first_differing_module_and_the_way_to_check(target):
  module, x, variables = _sample(target)
  port = module.wrong_epsilon(nnx.Rngs(3))
  with pytest.raises(lb.checkpoint.CheckpointError) as info:
    lb.checkpoint.linen_to_nnx(module.ViT(), variables, port, x, sample_kwargs={"train": False})
  message = str(info.value)
  assert re.search(
    r"The first module pair whose outputs differ: Linen `encoderblock_0/LayerNorm_1` and NNX "
    r"`encoderblock/0/LayerNorm_1`",
    message,
  ), message
  assert "<root>" not in message
  # the route it gives loads the weights and finds the same module
  assert "lb.layers.load_params([variables['params']], [port])" in message
  lb.layers.load_params([variables["params"]], [port])
  first = lb.compare((module.ViT(), variables), port, x, train=False).first_divergence
  assert first is not None and first.reference_path == "encoderblock_0/LayerNorm_1"


# ---------------------------------------------------------------- params with axis metadata
class AxesDense(nn.Module):
  """A Dense as flaxformer/t5x write it: axis names in a `params_axes` collection."""

  @nn.compact
  def __call__(self, x):
    from flax.linen import partitioning

    init = nn.initializers.lecun_normal()
    kernel = partitioning.param_with_axes("kernel", init, (x.shape[-1], 2), axes=("embed", "mlp"))
    return x @ kernel


class AxesPort(nnx.Module):
  def __init__(self, rngs):
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (3, 2)))

  def __call__(self, x):
    return x @ self.kernel[...]


def test_params_with_axis_metadata_convert_and_load():
  x = jax.random.normal(jax.random.key(1), (2, 3))
  variables = AxesDense().init(jax.random.key(0), x)
  assert "params_axes" in variables  # the metadata the conversion must leave alone
  port = AxesPort(nnx.Rngs(5))
  lb.checkpoint.linen_to_nnx(AxesDense(), variables, port, x)
  np.testing.assert_allclose(port(x), AxesDense().apply(variables, x), rtol=1e-6)
  loaded = AxesPort(nnx.Rngs(6))
  assert compare_cmd.load_linen_params(loaded, variables) == 1
  np.testing.assert_allclose(loaded(x), AxesDense().apply(variables, x), rtol=1e-6)


# ---------------------------------------------------------------- a new user's flow
@pytest.mark.slow  # drafts a port and converts a checkpoint (about a minute); `-m slow`
def test_a_new_users_flow_from_the_shell_alone(capsys, target, tmp_path):
  """inspect, port, convert, compare with --kwarg; the drafted port loads and agrees; a
  wrong LayerNorm epsilon edited into it is named at its module."""
  import orbax.checkpoint as ocp

  call = ["--arg", X, "--kwarg", "train=False"]
  code, out, err = run(capsys, "inspect", f"{target}:ViT", *call, "--capture", "all")
  assert code == 0, err
  code, out, err = run(capsys, "port", f"{target}:ViT", *call, "-o", f"{target}_nnx.py")
  assert code == 0, out + err
  draft = tmp_path / f"{target}_nnx.py"
  assert "nnx.Dropout(" in draft.read_text()

  _, _, variables = _sample(target)
  trained = jax.tree.map(lambda a: a + 0.25, variables)  # not what an init would give
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(str(tmp_path / "linen"), trained)
  checkpointer.wait_until_finished()
  code, out, err = run(
    capsys, "convert", f"{target}:ViT", f"{target}_nnx:ViT", "linen", "nnx", *call
  )
  assert code == 0, out + err

  code, out, err = run(capsys, "compare", f"{target}:ViT", f"{target}_nnx:ViT", *call)
  assert code == 0 and out.startswith("lb.compare: OK"), out + err

  # the hand edit: Linen's LayerNorm epsilon is 1e-6
  source = draft.read_text()
  edited, count = re.subn(
    r"(self\.LayerNorm_1 = nnx\.LayerNorm\()(.*?)(rngs=rngs)",
    r"\1\2epsilon=1e-3, \3",
    source,
    flags=re.DOTALL,
  )
  assert count == 1
  (tmp_path / f"{target}_edited.py").write_text(edited)
  code, out, err = run(capsys, "compare", f"{target}:ViT", f"{target}_edited:ViT", *call, "--json")
  assert code == 1, err
  first = json.loads(out)["first_divergence"]
  assert first["reference_path"] == "encoderblock_0/LayerNorm_1"
  sys.modules.pop(f"{target}_nnx", None)
  sys.modules.pop(f"{target}_edited", None)


def test_linen_to_nnx_check_false_loads_a_wrong_port_for_checking(target):
  """The route the refusal gives: the port is filled (its params equal Linen's, compared with
  the variables themselves), the report says what is unproven and where outputs differ."""
  module, x, variables = _sample(target)
  port = module.wrong_epsilon(nnx.Rngs(3))
  report = lb.checkpoint.linen_to_nnx(
    module.ViT(), variables, port, x, sample_kwargs={"train": False}, check=False
  )
  assert report.unproven is not None and report.unproven.endswith(
    "first at Linen `encoderblock_0/LayerNorm_1` and NNX `encoderblock/0/LayerNorm_1`"
  )
  assert str(report).startswith("linen_to_nnx: 14 modules, loaded without proof (check=False)")
  kernel = variables["params"]["encoderblock_1"]["MlpBlock_0"]["Dense_0"]["kernel"]
  assert np.array_equal(port.encoderblock[1].MlpBlock_0.Dense_0.kernel[...], kernel)
  first = lb.compare((module.ViT(), variables), port, x, train=False).first_divergence
  assert first is not None and first.reference_path == "encoderblock_0/LayerNorm_1"
  # a right port loaded the same way: nothing differs, and the report says it is unproven
  good = module.Port(nnx.Rngs(3))
  report = lb.checkpoint.linen_to_nnx(
    module.ViT(), variables, good, x, sample_kwargs={"train": False}, check=False
  )
  assert report.unproven is not None and report.unproven.endswith("the outputs agree")
