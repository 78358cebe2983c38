"""`loopbridge compare OLD NEW`: exit status 0 for a correct port, 1 with the first divergence
for a planted bug, the Linen params loaded into the port (checked against plain Linen), clear
one-line errors for targets and layouts that do not fit, and one end-to-end subprocess run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid

import jax
import numpy as np
import pytest

from loopbridge.__main__ import main
from loopbridge._cli import compare_cmd, inputs, loading

from conftest import child_env

SOURCE = """
import flax.linen as nn
from flax import nnx


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(8, name="Dense_0")(x))
    h = nn.LayerNorm(name="LayerNorm_0")(h)
    return nn.Dense(3, name="Dense_1")(h)


def nnx_list(items):
  return nnx.List(items) if hasattr(nnx, "List") else items


class Port(nnx.Module):
  def __init__(self, rngs, act=nnx.relu):
    self.Dense_0 = nnx.Linear(4, 8, rngs=rngs)
    self.LayerNorm_0 = nnx.LayerNorm(8, rngs=rngs)
    self.Dense_1 = nnx.Linear(8, 3, rngs=rngs)
    self.act = act

  def __call__(self, x):
    return self.Dense_1(self.LayerNorm_0(self.act(self.Dense_0(x))))


def buggy(rngs):
  return Port(rngs, act=nnx.gelu)


class Renamed(nnx.Module):
  def __init__(self, rngs):
    self.fc1 = nnx.Linear(4, 8, rngs=rngs)
    self.norm = nnx.LayerNorm(8, rngs=rngs)
    self.fc2 = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    return self.fc2(self.norm(nnx.relu(self.fc1(x))))


class RenamedBuggy(Renamed):
  def __init__(self, rngs):
    super().__init__(rngs)
    self.norm = nnx.LayerNorm(8, epsilon=0.5, rngs=rngs)


class Wider(nnx.Module):
  def __init__(self, rngs):
    self.Dense_0 = nnx.Linear(4, 16, rngs=rngs)
    self.LayerNorm_0 = nnx.LayerNorm(16, rngs=rngs)
    self.Dense_1 = nnx.Linear(16, 3, rngs=rngs)

  def __call__(self, x):
    return self.Dense_1(self.LayerNorm_0(nnx.relu(self.Dense_0(x))))


class Stacked(nn.Module):
  @nn.compact
  def __call__(self, x):
    for i in range(2):
      x = nn.Dense(4, name=f"layers_{i}")(x)
    return x


class StackedPort(nnx.Module):
  def __init__(self, rngs):
    self.layers = nnx_list([nnx.Linear(4, 4, rngs=rngs) for _ in range(2)])

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


class Cell(nn.Module):
  @nn.compact
  def __call__(self, c, _):
    return nn.tanh(nn.Dense(4, name="Dense_0")(c)), None


class Scanned(nn.Module):
  depth: int = 3

  @nn.compact
  def __call__(self, x):
    x, _ = nn.scan(Cell, variable_axes={"params": 0}, split_rngs={"params": True},
                   length=self.depth)(name="cells")(x, None)
    return x


class CellPort(nnx.Module):
  def __init__(self, rngs):
    self.Dense_0 = nnx.Linear(4, 4, rngs=rngs)

  def __call__(self, c):
    return nnx.tanh(self.Dense_0(c))


class ScannedPort(nnx.Module):
  def __init__(self, rngs, depth=3):
    self.cells = nnx_list([CellPort(rngs) for _ in range(depth)])

  def __call__(self, x):
    for cell in self.cells:
      x = cell(x)
    return x


def shallow(rngs):
  return ScannedPort(rngs, depth=2)


def needs_width(width):
  return None


class NoBias(Port):
  def __init__(self, rngs):
    super().__init__(rngs)
    self.Dense_1 = nnx.Linear(8, 3, use_bias=False, rngs=rngs)


class MLPNoBias(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(8, name="Dense_0")(x))
    h = nn.LayerNorm(name="LayerNorm_0")(h)
    return nn.Dense(3, use_bias=False, name="Dense_1")(h)


instance = Port(nnx.Rngs(3))
"""


@pytest.fixture
def target(tmp_path, monkeypatch):
  name = f"lb_cli_compare_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(SOURCE)
  monkeypatch.syspath_prepend(str(tmp_path))
  yield name
  sys.modules.pop(name, None)


def run(capsys, *argv):
  code = main(list(argv))
  out, err = capsys.readouterr()
  return code, out, err


def test_correct_port_exits_0(capsys, target):
  code, out, err = run(
    capsys, "compare", f"{target}:MLP", f"{target}:Port", "--arg", "float32[2,4]"
  )
  assert code == 0, err
  assert out.startswith("lb.compare: OK, all 4 aligned module calls agree")


@pytest.mark.parametrize("precision", [None, "highest", "model"])
def test_precision_option_reaches_the_check_and_the_report(capsys, target, precision):
  chosen = [] if precision is None else ["--precision", precision]
  argv = ["compare", f"{target}:MLP", f"{target}:Port", "--arg", "float32[2,4]", *chosen]
  code, out, err = run(capsys, *argv, "--json")
  assert code == 0, err
  used = json.loads(out)["default_tolerance"]
  assert used["precision"] == (precision or "highest")
  assert used["matmul_precision"] == ("default" if precision == "model" else "highest")


def test_port_receives_the_linen_params(target):
  import importlib

  module = importlib.import_module(target)
  port = loading.load_nnx_target(f"{target}:Port", seed=5)
  x = inputs.sample_inputs([inputs.parse_arg_spec("float32[2,4]")], 0)[0]
  variables = module.MLP().init(jax.random.key(0), x)
  assert compare_cmd.load_linen_params(port, variables) == 6
  np.testing.assert_allclose(port(x), module.MLP().apply(variables, x), rtol=1e-6, atol=1e-6)


def test_planted_bug_exits_1_and_names_the_first_divergence(capsys, target):
  code, out, err = run(
    capsys, "compare", f"{target}:MLP", f"{target}:buggy", "--arg", "float32[2,4]"
  )
  assert code == 1 and "error" not in err
  assert "DIVERGES, first at reference LayerNorm_0 ~ candidate LayerNorm_0" in out
  code, out, _ = run(
    capsys, "compare", f"{target}:MLP", f"{target}:buggy", "--arg", "float32[2,4]", "--json"
  )
  data = json.loads(out)
  assert code == 1 and data["first_divergence"]["reference_path"] == "LayerNorm_0"


def test_list_of_layers_matches_linen_names(capsys, target):
  code, out, err = run(
    capsys, "compare", f"{target}:Stacked", f"{target}:StackedPort", "--arg", "float32[1,4]"
  )
  assert code == 0, out + err
  assert re.search(r"layers_0 +layers/0 +name", out), out


def test_scanned_linen_params_load_into_a_list_of_layers(capsys, target):
  code, out, err = run(
    capsys, "compare", f"{target}:Scanned", f"{target}:ScannedPort", "--arg", "float32[2,4]"
  )
  assert code == 0, out + err
  # each layer of the nn.scan is compared with its element of the port's list, by name
  for i in range(3):
    assert re.search(
      rf"cells\[{i}\]/Dense_0 +cells/{i}/Dense_0 +name +float32\[2,4\].* ok\n", out
    ), out
  assert "not recorded" not in out
  assert_error(
    capsys,
    ["compare", f"{target}:Scanned", f"{target}:shallow", "--arg", "float32[2,4]"],
    1,
    r"'cells/Dense_0/\w+' stacks 3 layers \(nn.scan\) but the port's list has 2",
  )


def test_random_weights_compare_structure_only(capsys, target):
  code, out, _ = run(
    capsys,
    "compare",
    f"{target}:MLP",
    f"{target}:Renamed",
    "--arg",
    "float32[2,4]",
    "--weights",
    "random",
  )
  # Structure and shapes agree (aligned by order), so a correct port passes though its own
  # random weights give other values.
  assert code == 0, out
  assert "Dense_0" in out and "fc1" in out and "values are not compared" in out
  code, out, _ = run(
    capsys,
    "compare",
    f"{target}:MLP",
    f"{target}:Port",
    "--arg",
    "float32[2,4]",
    "--weights",
    "random",
  )
  assert code == 0 and "lb.compare: OK" in out, out
  code, out, _ = run(  # a shape difference is still a divergence
    capsys,
    "compare",
    f"{target}:MLP",
    f"{target}:Wider",
    "--arg",
    "float32[2,4]",
    "--weights",
    "random",
  )
  assert code == 1 and "output shapes differ" in out, out


def assert_error(capsys, argv, code, pattern):
  got, out, err = run(capsys, *argv)
  assert got == code and out == ""
  line = err.strip().splitlines()[-1]
  assert line.startswith("loopbridge compare: error: ") and "Traceback" not in err
  assert re.search(pattern, line), line


@pytest.mark.parametrize(
  "new, code, pattern",
  [
    (
      "Wider",
      1,
      r"Dense_0/\w+' is \[\d+\] in the Linen model but 'Dense_0/\w+' is \[16\] in the "
      r"port.*Pairing by the models' calls failed too: ",
    ),
    (
      "NoBias",
      1,
      r"the Linen param 'Dense_1/bias' has no Param in the port.*Why: the port's layer "
      r"'Dense_1' has no 'bias' \(built with use_bias=False\?\).*the names match\. "
      r"Fix: build the port's layer 'Dense_1' with use_bias=True",
    ),
    ("MLP", 2, r"NEW_TARGET '.*:MLP' is a Linen module; loopbridge compare takes the NNX port"),
    ("needs_width", 2, r"needs arguments \(width\)"),
  ],
)
def test_bad_new_target(capsys, target, new, code, pattern):
  """A port that does not fit the Linen weights failed the check (1); a NEW_TARGET that is
  no port at all is a usage error (2)."""
  assert_error(
    capsys, ["compare", f"{target}:MLP", f"{target}:{new}", "--arg", "float32[2,4]"], code, pattern
  )


def test_other_names_pair_by_the_models_calls_and_say_so(capsys, target):
  """A port named otherwise (fc1, norm, fc2) gets the Linen weights paired by the two models'
  calls; the report says so, and what it could not prove."""
  argv = ["compare", f"{target}:MLP", f"{target}:Renamed", "--arg", "float32[2,4]"]
  code, out, err = run(capsys, *argv)
  assert code == 0, out + err
  assert out.startswith(
    "weights: the port's attribute names differ from the Linen submodules', so the Linen "
    "weights were paired by the two models' calls:\nlinen_to_nnx: 3 modules, loaded without "
    "proof (check=False)"
  )
  assert re.search(r"Dense_0 +-> +fc1", out) and "lb.compare: OK" in out
  code, out, err = run(
    capsys, "compare", f"{target}:MLP", f"{target}:RenamedBuggy", "--arg", "float32[2,4]", "--json"
  )
  assert code == 1, err
  doc = json.loads(out)
  assert doc["first_divergence"]["candidate_path"] == "norm"
  assert doc["weights"]["paired_by"] == "calls"
  assert doc["weights"]["pairing"]["unproven"].endswith(
    "the port's output differs from the Linen model's, first at Linen `LayerNorm_0` and NNX `norm`"
  )
  code, out, _ = run(
    capsys, "compare", f"{target}:MLP", f"{target}:Port", "--arg", "float32[2,4]", "--json"
  )
  assert code == 0 and json.loads(out)["weights"]["paired_by"] == "name"


def test_bad_old_target_and_usage(capsys, target):
  assert_error(
    capsys,
    ["compare", f"{target}:Port", f"{target}:Port", "--arg", "float32[2,4]"],
    2,
    r"is an NNX module; loopbridge compare takes a Linen module as OLD_TARGET",
  )
  assert_error(
    capsys,
    ["compare", "nocolon", f"{target}:Port"],
    2,
    r"OLD_TARGET 'nocolon' is not of the form package\.module:attribute",
  )
  assert_error(
    capsys,
    ["compare", f"{target}:MLP", f"{target}:Port"],
    2,
    r"cannot run on the given inputs \(no inputs\).*--arg",
  )
  with pytest.raises(SystemExit) as exit_info:
    main(["compare", f"{target}:MLP", f"{target}:Port", "--rtol", "-1"])
  assert exit_info.value.code == 2
  assert "expected a number >= 0" in capsys.readouterr().err


def test_unalignable_is_one_line(capsys, target):
  assert_error(
    capsys,
    [
      "compare",
      f"{target}:MLP",
      f"{target}:StackedPort",
      "--arg",
      "float32[2,4]",
      "--weights",
      "random",
    ],
    1,
    r"no module call of the reference could be aligned",
  )


@pytest.mark.slow  # subprocess; the in-process tests above cover the command; `-m slow`
def test_end_to_end_subprocess(tmp_path):
  (tmp_path / "cli_compare_models.py").write_text(SOURCE)
  env = child_env(str(tmp_path))
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "loopbridge",
      "compare",
      "cli_compare_models:MLP",
      "cli_compare_models:buggy",
      "--arg",
      "float32[2,4]",
    ],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 1, result.stderr
  assert ">>" in result.stdout and "first divergence" in result.stdout


def test_port_with_a_bias_the_linen_layer_lacks(capsys, target):
  assert_error(
    capsys,
    ["compare", f"{target}:MLPNoBias", f"{target}:Port", "--arg", "float32[2,4]"],
    1,
    r"the port has a Param at 'Dense_1/bias' that the Linen model lacks.*Why: the Linen "
    r"layer 'Dense_1' has no 'bias'.*Fix: build the port's layer 'Dense_1' with use_bias=False",
  )


def test_plot_draws_the_errors(capsys, target, tmp_path):
  pytest.importorskip("matplotlib")
  path = tmp_path / "errors.png"
  code, out, err = run(
    capsys,
    "compare",
    f"{target}:MLP",
    f"{target}:buggy",
    "--arg",
    "float32[2,4]",
    "--plot",
    str(path),
  )
  assert code == 1 and "error" not in err, err
  assert "DIVERGES" in out and path.read_bytes()[:4] == b"\x89PNG"
  # the report is printed first: a plot that cannot be written does not hide it
  code, out, err = run(
    capsys, "compare", f"{target}:MLP", f"{target}:Port", "--arg", "float32[2,4]", "--plot", "e.txt"
  )
  assert code == 2 and "lb.compare: OK" in out and "Traceback" not in err
  assert re.search(
    r"^loopbridge compare: error: --plot: plot_report cannot write 'e.txt': the suffix "
    r"'\.txt' names no image format",
    err.strip().splitlines()[-1],
  ), err
