"""`loopbridge inspect`: every error path (exit status + one stderr line), the report content on
a small target (checked against plain Linen), and the command end to end in two subprocesses."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import uuid

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from loopbridge.__main__ import main
from loopbridge._cli import inputs, inspect_cmd, inspect_report, output
from loopbridge._cli.errors import CliError

from conftest import child_env

TARGET_SOURCE = '''
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx


class Block(nn.Module):
  @nn.compact
  def __call__(self, c, _):
    c = nn.relu(nn.Dense(4)(c))
    self.sow("intermediates", "h", c)
    return c, None


class Net(nn.Module):
  """Top-level sow (twice per call), a sow inside nn.scan, and one nn.scan drops."""

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    self.sow("intermediates", "x", x * 2)
    x, _ = nn.scan(Block, variable_axes={"params": 0, "intermediates": 0},
                   split_rngs={"params": True}, length=2)(name="kept")(x, None)
    x, _ = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                   length=2)(name="dropper")(x, None)
    return x

  def other(self, x, flag):
    self.sow("intermediates", "flag", flag)
    return x


class NeedsFields(nn.Module):
  depth: int

  def __call__(self, x):
    return x


class Picky(nn.Module):
  def __call__(self, x):
    if x.ndim != 2:
      raise ValueError(f"expected a (batch, features) input, got shape {x.shape}")
    return x


class Small(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(3)(x)
    self.sow("intermediates", "h", h)
    return h


class WithStats(nn.Module):
  """batch_stats update on every call (needs mutable=True, as in the seed program)."""

  @nn.compact
  def __call__(self, x):
    x = nn.BatchNorm(use_running_average=False)(nn.Dense(3)(x))
    self.sow("intermediates", "normed", x)
    return x


class Attention(nn.Module):
  """Returns (out, weights), as attention that exposes its weights does; never sows."""

  @nn.compact
  def __call__(self, x):
    q = nn.Dense(4)(x)
    weights = jax.nn.softmax(q @ q.T, axis=-1)
    return weights @ q, weights


class NoSow(nn.Module):
  """A model as most real ones are: no `sow` anywhere."""

  @nn.compact
  def __call__(self, x):
    h, _ = Attention()(x)
    return nn.Dense(4)(jnp.tanh(h))


instance = Net()
not_a_model = 42


def factory():
  return Net()


def factory_with_param(width):
  return Net()


def factory_raises():
  raise RuntimeError("no weights here")


def factory_wrong_type():
  return "Net"


nnx_model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
'''


@pytest.fixture
def target_module(tmp_path, monkeypatch):
  """A uniquely named module holding TARGET_SOURCE, importable from tmp_path."""
  name = f"lb_cli_target_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(TARGET_SOURCE)
  monkeypatch.syspath_prepend(str(tmp_path))
  yield name
  sys.modules.pop(name, None)


def run_main(capsys, *argv):
  code = main(list(argv))
  out, err = capsys.readouterr()
  return code, out, err


def assert_one_line_error(capsys, argv, code, pattern):
  got, out, err = run_main(capsys, *argv)
  assert got == code
  assert out == ""
  lines = err.strip().splitlines()
  # A progress note may precede the error; the error itself is one line, no traceback.
  assert lines[-1].startswith("loopbridge inspect: error: ")
  assert "Traceback" not in err
  assert re.search(pattern, lines[-1]), lines[-1]


# ----------------------------------------------------------------------------- error paths
@pytest.mark.parametrize("target", ["nocolon", "pkg.mod:", ":Net", "pkg mod:Net", "a:b-c"])
def test_malformed_target(capsys, target):
  assert_one_line_error(
    capsys, ["inspect", target], 2, r"TARGET .* is not of the form package\.module:attribute"
  )


@pytest.mark.parametrize(
  "target,fixed",
  [
    ("models.py:TransformerLM", "models:TransformerLM"),
    ("src/lm/models.py:LM", "src.lm.models:LM"),
  ],
)
def test_a_file_for_a_module_suggests_the_module(capsys, target, fixed):
  assert_one_line_error(
    capsys, ["inspect", target], 2, rf"names a file.*did you mean '{re.escape(fixed)}'\? \(drop"
  )


def test_unimportable_module(capsys):
  assert_one_line_error(
    capsys,
    ["inspect", "lb_no_such_module_xyz:Net", "--arg", "float32[1]"],
    2,
    r"cannot import module 'lb_no_such_module_xyz'.*PYTHONPATH",
  )


def test_module_raising_on_import(capsys, tmp_path, monkeypatch):
  name = f"lb_cli_broken_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text("raise RuntimeError('boom at import')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert_one_line_error(
    capsys,
    ["inspect", f"{name}:Net"],
    2,
    rf"importing '{name}' failed: RuntimeError: boom at import",
  )


@pytest.mark.parametrize("code", [0, 3, None])
def test_module_exiting_on_import(capsys, tmp_path, monkeypatch, code):
  """A script with an unguarded sys.exit: an error (exit 2), not a silent success."""
  name = f"lb_cli_exits_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(f"import sys\nsys.exit({code!r})\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert_one_line_error(
    capsys,
    ["inspect", f"{name}:Net", "--json"],
    2,
    rf"importing '{name}' called sys.exit\({code!r}\).*Fix: guard",
  )


@pytest.mark.parametrize(
  "attr,pattern",
  [
    ("Missing", r"has no attribute 'Missing'$"),
    ("NET", r"has no attribute 'NET'; did you mean '[\w]+:Net'\?$"),
    ("Nett", r"has no attribute 'Nett'; did you mean '[\w]+:Net'\?$"),
    ("Net.othr", r"has no attribute 'Net.othr'; did you mean '[\w]+:Net.other'\?$"),
    ("NeedsFields", r"Linen module class NeedsFields, which has required fields \(depth\)"),
    ("not_a_model", r"is a int, not a Linen module"),
    ("factory_with_param", r"function with required parameters \(width\)"),
    ("factory_raises", r"calling it failed: RuntimeError: no weights here"),
    ("factory_wrong_type", r"returned a str, not a Linen module"),
    ("nnx_model", r"is an NNX module; loopbridge inspect takes a Linen module"),
  ],
)
def test_bad_attribute(capsys, target_module, attr, pattern):
  assert_one_line_error(
    capsys, ["inspect", f"{target_module}:{attr}", "--arg", "float32[1,4]"], 2, pattern
  )


@pytest.mark.parametrize(
  "spec,pattern",
  [
    ("float32(1,100)", r"expected DTYPE\[DIM,\.\.\.\] such as 'float32\[1,100\]'"),
    ("float32[1,x]", r"expected DTYPE\[DIM,\.\.\.\]"),
    ("flot32[1]", r"unknown dtype 'flot32'"),
    ("float32[1,,2]", r"empty dimension"),
    ("float64[2]", r"float64 needs 64-bit JAX \(set JAX_ENABLE_X64=1\)"),
    ("object[1]", r"JAX arrays cannot have dtype 'object'.*use a number or bool dtype"),
    ("str[2]", r"JAX arrays cannot have dtype 'str'"),
  ],
)
def test_bad_arg_spec(capsys, spec, pattern):
  assert_one_line_error(capsys, ["inspect", "--arg", spec], 2, pattern)


def test_model_cannot_run_on_inputs(capsys, target_module):
  assert_one_line_error(
    capsys,
    ["inspect", f"{target_module}:Picky", "--arg", "float32[3]"],
    2,
    r"Picky cannot run on the given inputs \(--arg float32\[3\]\): ValueError: expected a "
    r"\(batch, features\) input",
  )


def test_no_inputs_for_a_model_that_needs_some(capsys, target_module):
  assert_one_line_error(
    capsys,
    ["inspect", f"{target_module}:Net"],
    2,
    r"cannot run on the given inputs \(no inputs\).*pass its inputs with --arg",
  )


def test_unknown_method(capsys, target_module):
  assert_one_line_error(
    capsys,
    ["inspect", f"{target_module}:Net", "--arg", "float32[1,4]", "--method", "nope"],
    2,
    r"Net has no method 'nope' \(--method\)",
  )


@pytest.mark.parametrize(
  "argv,pattern",
  [
    (["inspect", "--capacity", "0"], r"--capacity: expected a positive integer, got 0"),
    (["inspect", "--steps", "many"], r"--steps: expected a positive integer, got 'many'"),
    ([], r"the following arguments are required: COMMAND"),
  ],
)
def test_malformed_options(capsys, argv, pattern):
  with pytest.raises(SystemExit) as exit_info:
    main(argv)
  assert exit_info.value.code == 2
  assert re.search(pattern, capsys.readouterr().err)


def test_debug_shows_the_traceback(capsys):
  code, _, err = run_main(capsys, "inspect", "lb_no_such_module_xyz:Net", "--debug")
  assert code == 2
  assert "Traceback" in err and "ModuleNotFoundError" in err
  assert err.strip().splitlines()[-1].startswith("loopbridge inspect: error: cannot import")


def test_unexpected_failure_is_one_line_unless_debug(capsys, monkeypatch):
  def broken(*args, **kwargs):
    raise KeyError("internal")

  monkeypatch.setattr(inspect_cmd, "inspect_model", broken)
  code, _, err = run_main(capsys, "inspect")
  assert code == 3
  assert err.strip().splitlines()[-1] == (
    "loopbridge inspect: error: unexpected KeyError: 'internal' (run again with --debug "
    "for the traceback)"
  )
  code, _, err = run_main(capsys, "inspect", "--debug")
  assert code == 3 and "Traceback" in err and "KeyError: 'internal'" in err


# JAX's error when another process holds the chip, as a TPU VM raises it (jax 0.10.2).
TPU_BUSY = (
  "Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid "
  "4242. Not attempting to load libtpu.so in this process. (set JAX_PLATFORMS='' to "
  "automatically choose an available backend)"
)
TPU_LOCKFILE = (
  "Unable to initialize backend 'tpu': ABORTED: Internal error when accessing libtpu "
  'multi-process lockfile. Run "$ sudo lsof -w /dev/accel0" to figure out which process is '
  "using the TPU. (set JAX_PLATFORMS='' to automatically choose an available backend)"
)


@pytest.mark.parametrize("message", [TPU_LOCKFILE, TPU_BUSY], ids=["lockfile", "in-use"])
@pytest.mark.parametrize("wrapped", [False, True], ids=["raised", "quoted"])
def test_a_busy_accelerator_is_one_line_naming_it_and_the_fix(
  capsys, monkeypatch, message, wrapped
):
  def busy(*args, **kwargs):
    error = RuntimeError(message)
    if not wrapped:
      raise error
    # a command that quotes the model's failure in a CliError of its own
    raise CliError(f"the model failed on the inputs: RuntimeError: {message}") from error

  monkeypatch.setattr(inspect_cmd, "inspect_model", busy)
  code, _, err = run_main(capsys, "inspect")
  assert code == 2
  assert err.count("\n") == 1 and "Traceback" not in err and "unexpected" not in err
  assert err.strip() == (
    "loopbridge inspect: error: JAX could not open the 'tpu' backend: another process holds "
    "it (a notebook, a training job or another loopbridge; the chip admits one process at a "
    "time). Fix: run this command on the CPU, `JAX_PLATFORMS=cpu loopbridge inspect ...`, or "
    "close the other process."
  )


def test_other_backend_failures_are_not_called_busy(capsys, monkeypatch):
  def broken(*args, **kwargs):
    raise RuntimeError("Unable to initialize backend 'cuda': no CUDA-capable device is detected")

  monkeypatch.setattr(inspect_cmd, "inspect_model", broken)
  code, _, err = run_main(capsys, "inspect")
  assert code == 2 and "unexpected" not in err and "another process" not in err
  assert "JAX could not start the 'cuda' backend (no CUDA-capable device is detected)" in err


# ----------------------------------------------------------------------------- pieces
def test_parse_arg_spec():
  assert inputs.parse_arg_spec("float32[1,100]") == inputs.ArgSpec("float32", (1, 100))
  assert inputs.parse_arg_spec(" int32[ 2 , 3 ] ") == inputs.ArgSpec("int32", (2, 3))
  assert inputs.parse_arg_spec("bool[]") == inputs.ArgSpec("bool", ())
  assert inputs.parse_arg_spec("bfloat16[4]").dtype == "bfloat16"
  assert str(inputs.parse_arg_spec("uint8[2,2]")) == "uint8[2,2]"


def test_sample_inputs_kinds():
  specs = [inputs.parse_arg_spec(s) for s in ("float32[2,3]", "int32[4]", "bool[2]")]
  x, ids, mask = inputs.sample_inputs(specs, seed=0)
  assert (x.shape, x.dtype) == ((2, 3), jnp.float32) and float(jnp.abs(x).sum()) > 0
  assert ids.dtype == jnp.int32 and not ids.any()
  assert mask.dtype == jnp.bool_ and mask.all()


def test_progress_note_only_when_slow():
  slow, fast = io.StringIO(), io.StringIO()
  with output.progress("compiling the thing", stream=slow, delay=0.0):
    time.sleep(0.05)
  with output.progress("compiling the thing", stream=fast, delay=60.0):
    pass
  assert slow.getvalue() == "loopbridge: compiling the thing...\n"
  assert fast.getvalue() == ""


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_live_progress_note_ends_its_own_line():
  """On a terminal (the note and the report in one stream) the report starts a line."""
  term = _Terminal()
  with output.progress("initializing the model", stream=term, delay=0.0):
    time.sleep(0.25)
  text = term.getvalue()
  assert text.endswith("\n"), repr(text)
  *updates, last = text.removesuffix("\n").split("\r")
  assert re.fullmatch(r"loopbridge: initializing the model\.\.\. \d+\.\ds", last), repr(text)
  assert all(u == "" or u.startswith("loopbridge: initializing the model...") for u in updates)


def test_progress_note_comes_after_what_stdout_printed_before(monkeypatch):
  """Stdout is flushed before a note: a merged stream (`2>&1`) keeps the order of events."""
  merged = io.StringIO()

  class BufferedStdout(io.StringIO):  # holds its text until flushed, as a pipe's buffer does
    def flush(self):
      merged.write(self.getvalue())
      self.seek(0)
      self.truncate()

  monkeypatch.setattr(sys, "stdout", BufferedStdout())
  print("printed first")
  with output.progress("compiling the thing", stream=merged, delay=0.0):
    time.sleep(0.05)
  assert merged.getvalue() == "printed first\nloopbridge: compiling the thing...\n"


# ----------------------------------------------------------------------------- content
def test_json_report_on_a_target(capsys, target_module):
  code, out, _ = run_main(
    capsys,
    "inspect",
    f"{target_module}:factory",
    "--arg",
    "float32[1,4]",
    "--steps",
    "3",
    "--capacity",
    "4",
    "--json",
  )
  assert code == 0
  doc = json.loads(out)
  assert doc["model"] == "Net" and doc["inputs"] == ["float32[1,4]"]
  assert (doc["capacity"], doc["steps"]) == (4, 3)

  # Reference: plain Linen on the same input shape.
  net = sys.modules[target_module].Net()
  x = jnp.ones((1, 4))
  variables = net.init(jax.random.key(0), x)
  _, state = net.apply(variables, x, mutable=["intermediates"])
  inter = state["intermediates"]
  sites = {s["path"]: s for s in doc["sow_sites"]["sites"]}
  assert set(sites) == {"x", "kept/h"} and "dropper" not in inter
  assert sites["x"]["per_call"] == len(inter["x"]) == 2
  assert sites["kept/h"]["shape"] == list(inter["kept"]["h"][0].shape) == [2, 1, 4]
  assert sites["kept/h"]["transforms"][0] == {
    "kind": "scan",
    "path": "kept",
    "axis": 0,
    "length": 2,
    "reverse": False,
  }
  (dropped,) = doc["sow_sites"]["dropped"]
  assert (dropped["module_path"], dropped["name"]) == ("dropper", "h")
  assert doc["buffer_memory"]["buffers_bytes"] == 4 * (1 * 4 + 2 * 1 * 4) * 4
  assert doc["buffer_memory"]["counts_bytes"] == 8

  leaves = jax.tree_util.tree_leaves(variables["params"])
  assert doc["parameters"] == {
    "params": {
      "arrays": len(leaves),
      "values": sum(int(np.prod(leaf.shape)) for leaf in leaves),
      "bytes": sum(leaf.nbytes for leaf in leaves),
    }
  }

  stock = doc["live_check"]["stock"]
  assert not stock["ok"] and stock["error"].startswith("ValueError: ")
  # The JSON keeps flax's whole message (the text report shows its first line).
  assert "\n" in stock["error"].strip() and len(stock["error"]) > 300, stock["error"]
  assert not stock["error"].endswith("...")
  assert not stock["explain"]["ok"]
  assert {c["kind"] for c in stock["explain"]["changes"]} >= {"sow"}
  ours = doc["live_check"]["loopbridge"]
  assert ours["ok"] and ours["steps_run"] == 3
  # 3 steps: `x` is sown twice per call (6 values, 4 kept), `kept/h` once (3 values).
  assert ours["recorded"]["intermediates/x"] == {
    "sown": 6,
    "kept": 4,
    "capacity": 4,
    "value_shape": [1, 4],
  }
  assert ours["recorded"]["intermediates/kept/h"]["sown"] == 3
  assert ours["first_call_s"] > 0 and ours["next_call_s"] > 0


def test_text_report_with_method(capsys, target_module):
  code, out, _ = run_main(
    capsys,
    "inspect",
    f"{target_module}:instance",
    "--arg",
    "float32[1,4]",
    "--arg",
    "bool[]",
    "--method",
    "other",
    "--steps",
    "2",
  )
  assert code == 0
  assert "inputs: float32[1,4], bool[]; method: other; capacity 2" in out
  assert "intermediates  flag  ()" in out
  assert inspect_report.STOCK_EXPECTED in out and "    its error: ValueError" in out
  assert "lb.ToNNX: ran 2 steps" in out
  assert "intermediates/flag  2     2     2" in out


def test_live_check_updates_other_collections(capsys, target_module):
  code, out, _ = run_main(
    capsys,
    "inspect",
    f"{target_module}:WithStats",
    "--arg",
    "float32[4,2]",
    "--steps",
    "2",
    "--json",
  )
  assert code == 0
  doc = json.loads(out)
  assert doc["parameters"]["batch_stats"] == {"arrays": 2, "values": 6, "bytes": 24}
  ours = doc["live_check"]["loopbridge"]
  assert ours["ok"], ours["error"]
  assert ours["recorded"]["intermediates/normed"]["sown"] == 2


def test_capture_records_submodule_outputs_of_a_model_that_never_sows(capsys, target_module):
  code, out, _ = run_main(
    capsys,
    "inspect",
    f"{target_module}:NoSow",
    "--arg",
    "float32[3,4]",
    "--steps",
    "2",
    "--capture",
    "Attention",
    "--json",
  )
  assert code == 0
  doc = json.loads(out)
  assert doc["capture"] == "Attention"
  # Reference: plain Linen capture with the same filter (Attention's __call__ only).
  net = sys.modules[target_module].NoSow()
  x = jnp.ones((3, 4))
  variables = net.init(jax.random.key(0), x)
  _, state = net.apply(
    variables,
    x,
    mutable=["intermediates"],
    capture_intermediates=lambda m, n: type(m).__name__ == "Attention",
  )
  out_shape, w_shape = (v.shape for v in state["intermediates"]["Attention_0"]["__call__"][0])
  sites = {s["path"]: s for s in doc["sow_sites"]["sites"]}
  assert set(sites) == {"Attention_0/__call__"}  # two leaves of one sow
  assert [s["shape"] for s in doc["sow_sites"]["sites"]] == [list(out_shape), list(w_shape)]
  ours = doc["live_check"]["loopbridge"]
  assert ours["recorded"]["intermediates/Attention_0/__call__[1]"] == {
    "sown": 2,
    "kept": 2,
    "capacity": 2,
    "value_shape": [3, 3],
  }
  stock = doc["live_check"]["stock"]
  assert stock["ok"] and stock["mutable"] is False and stock["model_sows"] is False
  # One captured output (a pair: two buffers) and no sow of the model's own.
  assert doc["site_counts"] == {
    "sow_sites": 0,
    "captured_outputs": 1,
    "buffers": 2,
    "dropped_sows": 0,
  }
  assert all(s["captured"] for s in doc["sow_sites"]["sites"])


def test_capture_counts_sows_and_captured_outputs_apart(capsys, target_module):
  argv = ["inspect", f"{target_module}:Small", "--arg", "float32[2,4]", "--steps", "2"]
  code, out, _ = run_main(capsys, *argv, "--capture", "all")
  assert code == 0
  # Small sows `h`; the filter captures Dense_0's and Small's own __call__ outputs.
  assert "  Small: 1 sow site(s), 2 captured output(s), buffers 144 B\n" in out
  code, out, _ = run_main(capsys, *argv, "--capture", "all", "--json")
  doc = json.loads(out)
  assert doc["site_counts"] == {
    "sow_sites": 1,
    "captured_outputs": 2,
    "buffers": 3,
    "dropped_sows": 0,
  }
  captured = {s["path"]: s["captured"] for s in doc["sow_sites"]["sites"]}
  assert captured == {"h": False, "Dense_0/__call__": True, "__call__": True}
  code, out, _ = run_main(capsys, *argv)  # without --capture: lb.sow_sites' headline
  assert "  Small: 1 sow site(s), buffers 48 B\n" in out


def test_stock_check_calls_a_model_that_does_not_sow_as_a_user_would(capsys, target_module):
  code, out, _ = run_main(
    capsys, "inspect", f"{target_module}:NoSow", "--arg", "float32[3,4]", "--steps", "2"
  )
  assert code == 0
  assert (
    "stock flax.nnx.bridge.ToNNX: ran 2 steps (the model does not sow) — stock bridge "
    "works; loopbridge adds recording"
  ) in out
  assert "FAILED" not in out
  assert "record submodule outputs with --capture all" in out
  # With everything captured the model still does not sow: the stock check is unchanged.
  code, out, _ = run_main(
    capsys,
    "inspect",
    f"{target_module}:NoSow",
    "--arg",
    "float32[3,4]",
    "--steps",
    "2",
    "--capture",
    "all",
  )
  assert code == 0 and "stock bridge works; loopbridge adds recording" in out
  assert re.search(r"intermediates/Attention_0/__call__\[1\] +2 +2 +2 +\(3, 3\)", out)
  assert "intermediates/Dense_0/__call__" in out


def test_stock_check_keeps_mutable_for_models_that_sow_or_hold_state(capsys, target_module):
  _, out, _ = run_main(
    capsys,
    "inspect",
    f"{target_module}:WithStats",
    "--arg",
    "float32[4,2]",
    "--steps",
    "2",
    "--json",
  )
  stock = json.loads(out)["live_check"]["stock"]
  assert stock["model_sows"] and stock["mutable"] and not stock["ok"]


@pytest.mark.parametrize(
  "capture, pattern",
  [
    (
      "Nope",
      r"--capture 'Nope': no module of class Nope runs in this call.*Attention, Dense, "
      r"NoSow",
    ),
    ("a b", r"--capture 'a b': expected 'all' or module class names"),
  ],
)
def test_bad_capture_filter(capsys, target_module, capture, pattern):
  assert_one_line_error(
    capsys,
    ["inspect", f"{target_module}:NoSow", "--arg", "float32[3,4]", "--capture", capture],
    2,
    pattern,
  )


# ----------------------------------------------------------------------------- end to end
def _run(argv, cwd, extra_path=None):
  env = child_env(*([extra_path] if extra_path else []))
  return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # subprocess, the default model end to end; run by `-m slow` (.ci/run)
def test_end_to_end_default_model(tmp_path):
  result = _run([sys.executable, "-m", "loopbridge", "inspect"], cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert "default model" in out and "inputs: float32[1,100]; capacity 5" in out
  assert (
    "intermediates  ScanBlock_0/carry  (3, 1, 100)  float32  1         scan(axis=0, len=3)" in out
  )
  assert "dropped sows: none" in out
  assert "params      2       30,300  118.4 KiB" in out
  assert "stock flax.nnx.bridge.ToNNX: fails, as expected (the demonstration" in out
  assert "its error: ValueError: nnx.while_loop requires" in out
  assert "[sow] carry[0].x: new sow tuple" in out
  assert "lb.ToNNX: ran 5 steps" in out
  assert "intermediates/ScanBlock_0/carry  5     5     5         (3, 1, 100)" in out
  assert "Traceback" not in result.stderr
  # The excerpt of this output on the command-line page is current.
  page = pathlib.Path(__file__).resolve().parents[1] / "migration_guides" / "command_line.md"
  excerpt = page.read_text().split("An excerpt of the default output:")[1].split("```text\n")[1]
  excerpt = excerpt.split("```")[0]
  assert excerpt.strip() and excerpt in out + "\n"


@pytest.mark.slow  # subprocess; test_json_report_on_a_target covers it in-process
def test_end_to_end_target_module_json(tmp_path):
  (tmp_path / "user_models.py").write_text(TARGET_SOURCE)
  script = os.path.join(os.path.dirname(sys.executable), "loopbridge")
  command = [script] if os.path.exists(script) else [sys.executable, "-m", "loopbridge"]
  result = _run(
    [*command, "inspect", "user_models:Small", "--arg", "float32[2,4]", "--steps", "2", "--json"],
    cwd=tmp_path.parent,
    extra_path=str(tmp_path),
  )
  assert result.returncode == 0, result.stderr
  doc = json.loads(result.stdout)
  assert doc["target"] == "user_models:Small"
  (site,) = doc["sow_sites"]["sites"]
  assert (site["path"], site["shape"], site["per_call"]) == ("h", [2, 3], 1)
  assert doc["parameters"]["params"] == {"arrays": 2, "values": 4 * 3 + 3, "bytes": 60}
  assert doc["live_check"]["loopbridge"]["recorded"]["intermediates/h"]["sown"] == 2
  assert not doc["live_check"]["stock"]["ok"]


def _run_in_terminal(argv, cwd):
  """Run with stdout and stderr on one pseudo-terminal, as in a terminal (or its log)."""
  import pty

  primary, secondary = pty.openpty()
  proc = subprocess.Popen(
    argv, cwd=cwd, env=child_env(), stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary
  )
  os.close(secondary)
  chunks = []
  while True:
    try:
      data = os.read(primary, 65536)
    except OSError:  # EIO: the child closed the terminal
      break
    if not data:
      break
    chunks.append(data)
  os.close(primary)
  assert proc.wait(timeout=600) == 0
  return b"".join(chunks).decode().replace("\r\n", "\n")  # the terminal writes \n as \r\n


@pytest.mark.slow  # a subprocess on a pseudo-terminal; run by `-m slow` (.ci/run)
def test_progress_notes_and_report_have_lines_of_their_own_in_one_terminal(tmp_path):
  text = _run_in_terminal([sys.executable, "-m", "loopbridge", "inspect", "--json"], tmp_path)
  report = []
  for line in text.split("\n"):  # not splitlines(), which splits at a carriage return too
    updates = [u for u in line.split("\r") if u]
    if all(u.startswith("loopbridge: ") for u in updates):
      continue  # a progress note (its live updates end in one line)
    assert len(updates) == 1, repr(line)  # nothing glued to a note
    report.append(line)
  assert json.loads("\n".join(report))["live_check"]["loopbridge"]["ok"]


PRINTING_SOURCE = """
import flax.linen as nn
import jax

print("hello from the import")


class Chatty(nn.Module):
  @nn.compact
  def __call__(self, x):
    print("tracing Chatty")
    jax.debug.print("step value {}", x.sum())
    h = nn.Dense(3)(x)
    self.sow("intermediates", "h", h)
    return h
"""


@pytest.mark.slow  # two subprocesses (stdout vs stderr); run by `-m slow` (.ci/run)
def test_json_is_the_only_stdout_when_the_model_prints(tmp_path):
  (tmp_path / "chatty_models.py").write_text(PRINTING_SOURCE)
  result = _run(
    [
      sys.executable,
      "-m",
      "loopbridge",
      "inspect",
      "chatty_models:Chatty",
      "--arg",
      "float32[1,4]",
      "--steps",
      "2",
      "--json",
    ],
    cwd=tmp_path.parent,
    extra_path=str(tmp_path),
  )
  assert result.returncode == 0, result.stderr
  doc = json.loads(result.stdout)  # nothing else on stdout
  assert doc["live_check"]["loopbridge"]["recorded"]["intermediates/h"]["sown"] == 2
  for line in ("hello from the import", "tracing Chatty", "step value"):
    assert line in result.stderr  # the model's output is kept, on stderr
  text = _run(
    [
      sys.executable,
      "-m",
      "loopbridge",
      "inspect",
      "chatty_models:Chatty",
      "--arg",
      "float32[1,4]",
      "--steps",
      "2",
    ],
    cwd=tmp_path.parent,
    extra_path=str(tmp_path),
  )
  assert "hello from the import" in text.stdout  # without --json, stdout is left alone


# lm1b / t5x style: params annotated with logical axis names, no mesh on the command line.
LOGICAL_SOURCE = """
import flax.linen as nn


class Logical(nn.Module):
  @nn.compact
  def __call__(self, x):
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    h = nn.Dense(4, kernel_init=init)(x)
    self.sow("intermediates", "h", h)
    return h
"""


@pytest.fixture
def logical_target(tmp_path, monkeypatch):
  name = f"lb_cli_logical_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(LOGICAL_SOURCE)
  monkeypatch.syspath_prepend(str(tmp_path))
  yield f"{name}:Logical"
  sys.modules.pop(name, None)


def test_inspect_of_logically_partitioned_params_gives_the_whole_fix(capsys, logical_target):
  if not (hasattr(nnx, "use_eager_sharding") or hasattr(flax.config, "flax_always_shard_variable")):
    pytest.skip("this flax never shards a Variable when it creates it")
  code, _, err = run_main(capsys, "inspect", logical_target, "--arg", "float32[1,3]")
  line = err.strip().splitlines()[-1]
  assert code == 2
  assert "cannot run on the given inputs" not in line
  assert "Logical cannot create its partition-annotated params without a mesh" in line
  assert "Fix: either initialize under a mesh" in line  # lb.ToNNX's fix, not cut off
  assert line.endswith(
    "Fix here: pass --no-eager-sharding (the params are created unsharded, as flax 0.10 did; "
    "what the model sows does not depend on it)."
  )


def test_inspect_no_eager_sharding_records_what_plain_linen_sows(capsys, logical_target):
  argv = ["inspect", logical_target, "--arg", "float32[1,3]", "--no-eager-sharding", "--json"]
  code, out, _ = run_main(capsys, *argv)
  assert code == 0
  doc = json.loads(out)
  # The reference: plain Linen's own apply, with the params unboxed (no mesh needed).
  module = importlib.import_module(logical_target.split(":")[0]).Logical()
  x = jnp.ones((1, 3))
  with contextlib.ExitStack() as stack:
    if hasattr(nnx, "use_eager_sharding"):
      stack.enter_context(nnx.use_eager_sharding(False))
    params = nn.unbox(module.init(jax.random.key(0), x))
  _, state = module.apply(params, x, mutable=["intermediates"])
  (expected,) = state["intermediates"]["h"]
  assert [s["path"] for s in doc["sow_sites"]["sites"]] == ["h"]
  assert doc["sow_sites"]["sites"][0]["shape"] == list(expected.shape)
  assert doc["live_check"]["loopbridge"]["recorded"]["intermediates/h"]["kept"] == 5
