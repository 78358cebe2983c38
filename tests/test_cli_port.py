"""`loopbridge port TARGET`: the drafted file is written and ruff-clean with exit status 0 for a
zoo model, 1 naming the line of a TODO, 2 for a malformed command line; `--kwarg` / `--call`
parsing and its errors."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import uuid

import pytest

from loopbridge.__main__ import main
from loopbridge._cli import call_specs, inputs
from loopbridge._cli.errors import USAGE_ERROR, CliError

from conftest import child_env
from port_models import ZOO

REPO = pathlib.Path(__file__).resolve().parent.parent
MLP = ["port_models.mlp_dropout:model", "--arg", "float32[4,24]", "--kwarg", "train=False"]


def ruff_clean(path: pathlib.Path) -> None:
  """`ruff check` and `ruff format --check` pass on the file, with the configuration ruff finds
  where it was written (the draft is formatted for where it lands)."""
  if importlib.util.find_spec("ruff") is None:
    pytest.skip("ruff is not installed in this interpreter")
  for command in (["check"], ["format", "--check", "--diff"]):
    done = subprocess.run(
      [sys.executable, "-m", "ruff", *command, str(path)],
      capture_output=True,
      text=True,
      cwd=path.parent,
      env=child_env(),
    )
    assert done.returncode == 0, f"ruff {command[0]}:\n{done.stdout}{done.stderr}"


# ------------------------------------------------------------------------- parsing (no model)
def test_call_spec_items():
  spec = call_specs.parse_call_spec("method=generate  float32[3,8] int32[3] scale=0.5 x=bool[2]")
  assert spec.method == "generate"
  assert spec.args == (inputs.ArgSpec("float32", (3, 8)), inputs.ArgSpec("int32", (3,)))
  assert spec.kwargs == (("scale", 0.5), ("x", inputs.ArgSpec("bool", (2,))))
  assert str(spec) == "method=generate float32[3,8] int32[3] scale=0.5 x=bool[2]"
  assert call_specs.parse_call_spec("train=False").args == ()


@pytest.mark.parametrize(
  ("text", "message"),
  [
    ("   ", r"--call '   ' is empty"),
    ("float32[2 train=True", r"expected DTYPE\[DIM,...\]"),
    ("train=True float32[2,3]", r"positional input 'float32\[2,3\]' after a keyword one"),
    ("method=a method=b", r"method= names one Linen method once"),
    ("method=1x", r"method= names one Linen method once"),
    ("train=True train=False", r"keyword 'train' given twice"),
    ("act=relu", r"'relu' is not a Python literal .* act=\"'relu'\""),
  ],
)
def test_call_spec_errors(text, message):
  with pytest.raises(CliError, match=message) as info:
    call_specs.parse_call_spec(text)
  assert info.value.code == USAGE_ERROR


@pytest.mark.parametrize(
  ("text", "message"),
  [
    ("train", r"expected NAME=VALUE"),
    ("=True", r"expected NAME=VALUE"),
    ("2x=True", r"expected NAME=VALUE"),
    ("rate=", r"expected NAME=VALUE"),
    ("mask=floaty[2]", r"unknown dtype 'floaty'"),
  ],
)
def test_kwarg_errors(text, message):
  with pytest.raises(CliError, match=message) as info:
    call_specs.parse_kwarg(text)
  assert info.value.code == USAGE_ERROR


@pytest.mark.parametrize("name", call_specs.DRAFT_PARAMETERS)
def test_kwarg_named_like_a_draft_parameter(name):
  with pytest.raises(CliError, match=rf"'{name}' is a parameter of lb.port.draft itself") as info:
    call_specs.keyword_values([(name, True)], seed=0)
  assert info.value.code == USAGE_ERROR


def test_kwarg_values():
  assert call_specs.parse_kwarg("rate = 0.5") == ("rate", 0.5)
  assert call_specs.parse_kwarg("name='relu'") == ("name", "relu")
  assert call_specs.parse_kwarg("mask=None") == ("mask", None)
  values = call_specs.keyword_values([("mask", inputs.ArgSpec("bool", (2,))), ("t", 1)], seed=0)
  assert values["mask"].shape == (2,) and bool(values["mask"].all()) and values["t"] == 1


@pytest.mark.parametrize(
  ("argv", "message"),
  [
    ([*MLP, "--call", "train=True float32[4,24]"], "after a keyword one"),
    ([*MLP, "--kwarg", "train"], "expected NAME=VALUE"),
    ([*MLP, "--kwarg", "check=True"], "'check' is a parameter of lb.port.draft itself"),
    (["port_models.mlp_dropout:model", "--arg", "float32[4,"], r"expected DTYPE\[DIM,...\]"),
    (["port_models.mlp_dropout", "--arg", "float32[4,24]"], "package.module:attribute"),
  ],
)
def test_usage_errors_exit_2(argv, message, capsys, tmp_path):
  assert main(["port", *argv, "-o", str(tmp_path / "out.py")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("loopbridge port: error: ") and re.search(message, err[-1]), err


def test_existing_file_is_not_overwritten(capsys, tmp_path):
  out = tmp_path / "out.py"
  out.write_text("# my edits\n")
  assert main(["port", *MLP, "-o", str(out)]) == 2
  err = capsys.readouterr().err
  assert "out.py' exists" in err and "--force" in err, err
  assert out.read_text() == "# my edits\n"


def test_a_misspelled_target_is_reported_before_an_existing_output(capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "mlp_dropout_nnx.py").write_text("# an earlier draft\n")  # the default output
  argv = ["port", "port_models.mlp_dropout:Model", "--arg", "float32[4,24]"]
  assert main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err == (
    "loopbridge port: error: module 'port_models.mlp_dropout' has no attribute 'Model'; "
    "did you mean 'port_models.mlp_dropout:model'?"
  )


def test_directory_output_is_a_usage_error(capsys, tmp_path):
  assert main(["port", *MLP, "-o", str(tmp_path)]) == 2
  assert "is a directory" in capsys.readouterr().err


def test_unknown_method(capsys, tmp_path):
  argv = ["port", *MLP, "--call", "method=decode float32[1]", "-o", str(tmp_path / "o.py")]
  assert main(argv) == 2
  assert "MLP has no method 'decode' (--call method=decode float32[1])" in capsys.readouterr().err


# ------------------------------------------------------------------------------ drafting runs
def test_zoo_model_writes_a_ruff_clean_file_and_exits_0(capsys, tmp_path):
  out = tmp_path / "mlp_nnx.py"
  status = main(["port", *MLP, "--call", "float32[2,24]", "-o", str(out)])
  report = capsys.readouterr().out
  assert status == 0, report
  assert f"wrote {out}" in report and re.search(r"equal\b.* on 2 calls", report), report
  source = out.read_text()
  assert "loopbridge" not in source
  compile(source, str(out), "exec")
  ruff_clean(out)


def test_json_report(capsys, tmp_path):
  out = tmp_path / "mlp_nnx.py"
  assert main(["port", *MLP, "--json", "-o", str(out)]) == 0
  doc = json.loads(capsys.readouterr().out)
  assert doc["ok"] is True and doc["root"] == "MLP" and doc["file"] == str(out)
  assert doc["todos"] == [] and doc["check"]["equal"] is True and len(doc["check"]["calls"]) == 1
  assert all({"file", "line", "old", "new", "why"} <= set(c) for c in doc["changes"])


def test_todo_exits_1_naming_the_line(capsys, tmp_path):
  out = tmp_path / "wn_nnx.py"
  status = main(
    ["port", "port_models.todo_map_variables:model", "--arg", "float32[2,12]", "-o", str(out)]
  )
  captured = capsys.readouterr()
  assert status == 1
  source = (REPO / "tests" / "port_models" / "todo_map_variables.py").read_text().splitlines()
  line = next(i for i, text in enumerate(source, 1) if "nn.map_variables(" in text)
  assert re.search(rf"todo_map_variables\.py:{line}: TODO\(port\)", captured.err), captured.err
  assert "# TODO(port)" in out.read_text()  # written all the same, to be finished by hand


def _spec(array) -> str:
  return f"{array.dtype}[{','.join(map(str, array.shape))}]"


def _argv(name: str) -> list[str]:
  """The command line that drafts a zoo model with its sample call's shapes and its calls."""
  m = importlib.import_module(f"port_models.{name}")
  argv = [f"port_models.{name}:model"]
  for a in m.sample_args():
    argv += ["--arg", _spec(a)]
  for k, v in m.SAMPLE_KWARGS.items():
    argv += ["--kwarg", f"{k}={v!r}"]
  for method, args, kw in m.EXTRA_CALLS:
    items = [f"method={method}"] if method else []
    items += [_spec(a) for a in args()] + [f"{k}={v!r}" for k, v in kw.items()]
    argv += ["--call", " ".join(items)]
  return argv


# The decode build needs its cache sized on the full length: `variables=` from Python only.
CLI_ZOO = [n for n in ZOO if n != "transformer_lm_decode"]


@pytest.mark.parametrize(
  "name", [pytest.param(n, marks=() if n == "mlp_dropout" else pytest.mark.slow) for n in CLI_ZOO]
)
def test_every_zoo_model_from_the_command_line(name, capsys, tmp_path):
  out = tmp_path / f"{name}_nnx.py"
  status = main(["port", *_argv(name), "-o", str(out)])
  captured = capsys.readouterr()
  assert status == 0, captured.out + captured.err
  assert "loopbridge" not in out.read_text()
  ruff_clean(out)


@pytest.mark.slow
def test_subprocess_end_to_end(tmp_path):
  """The installed entry point, from another directory: batch statistics and a train --call."""
  # In front of the caller's PYTHONPATH, not instead of it: an environment that brings its
  # packages on PYTHONPATH (libcst on a GPU image) keeps them.
  env = child_env(str(REPO / "src"), str(REPO / "tests"))
  argv = [sys.executable, "-m", "loopbridge", "port", "port_models.setup_style:model"]
  done = subprocess.run(
    [
      *argv,
      "--arg",
      "float32[5,12]",
      "--kwarg",
      "train=False",
      "--call",
      "float32[5,12] train=True",
    ],
    capture_output=True,
    text=True,
    cwd=tmp_path,
    env=env,
  )
  assert done.returncode == 0, done.stdout + done.stderr
  out = tmp_path / "setup_style_nnx.py"
  assert f"wrote {out}" in done.stdout
  ruff_clean(out)
  again = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env)
  assert again.returncode == 2 and "setup_style_nnx.py' exists" in again.stderr, again.stderr


def test_class_without_source_exits_1(capsys, tmp_path, monkeypatch):
  """`lb.port.PortError` (here: a class made by `exec`, which has no source) is one line, 1."""
  name = f"lb_port_nosource_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(
    "import flax.linen as nn\n"
    "namespace = {'nn': nn}\n"
    "exec('class Net(nn.Module):\\n  @nn.compact\\n  def __call__(self, x):\\n"
    "    return nn.Dense(2)(x)\\n', namespace)\n"
    "model = namespace['Net']()\n"
  )
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))
  assert main(["port", f"{name}:model", "--arg", "float32[1,3]", "-o", "out.py"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("loopbridge port: error: lb.port.draft: the source of the Linen class")
  assert not (tmp_path / "out.py").exists()


def test_each_phase_of_the_draft_has_its_progress_note(capsys, tmp_path, monkeypatch):
  from loopbridge._cli import output

  monkeypatch.setattr(output, "PROGRESS_DELAY", 0.0)  # every note shows, however fast
  out = tmp_path / "mlp_nnx.py"
  assert main(["port", *MLP, "-o", str(out)]) == 0
  err = capsys.readouterr().err
  phases = [
    "tracing the Linen model and rewriting its classes",
    "building the port and converting the Linen variables into it",
    "comparing the port with Linen on 1 call(s)",
  ]
  at = [err.find(f"loopbridge: {phase}...") for phase in phases]
  assert all(i >= 0 for i in at) and at == sorted(at), err


@pytest.mark.parametrize("precision", ["highest", "model"])
def test_precision_is_passed_to_the_check_and_reported(precision, capsys, tmp_path):
  out = tmp_path / "out.py"
  assert main(["port", *MLP, "--precision", precision, "--json", "-o", str(out)]) == 0
  document = json.loads(capsys.readouterr().out)
  assert document["check"]["precision"] == precision
  assert all(
    call["default_tolerance"]["precision"] == precision for call in document["check"]["calls"]
  )
  assert main(["port", *MLP, "--precision", precision, "--force", "-o", str(out)]) == 0
  assert f"Verdict (check_precision={precision!r})" in capsys.readouterr().out


def test_a_bad_precision_is_a_usage_error(capsys, tmp_path):
  with pytest.raises(SystemExit) as exit_:  # argparse's own refusal of a choice
    main(["port", *MLP, "--precision", "fast", "-o", str(tmp_path / "out.py")])
  assert exit_.value.code == 2
  assert "argument --precision: invalid choice: 'fast'" in capsys.readouterr().err
