"""Measure `lb.port.draft` on a set of real Linen classes: equal to Linen with zero edits?

For each case, in its own subprocess with a timeout: import the class from an exported
checkout, draft it at the case's first setting, then build the drafted root class, unedited,
at the first setting and at the second (every width changed), fill it with Linen's variables
at that setting (`lb.checkpoint.linen_to_nnx`) and compare its output with plain Linen
`apply` on fresh inputs, with a negative control (one perturbed param must change the port's
output). Writes a markdown table and a JSON file.

    python tools/measure_drafting/measure.py --checkouts /tmp/checkouts --out /tmp/holdout
    python tools/measure_drafting/measure.py --cases tuning --checkouts /tmp/checkouts
    python tools/measure_drafting/measure.py --cases holdout_b --checkouts /tmp/checkouts
    python tools/measure_drafting/measure.py --cases holdout_c --checkouts /tmp/checkouts
    python tools/measure_drafting/measure.py --cases holdout_d --checkouts /tmp/checkouts
    python tools/measure_drafting/measure.py --cases holdout_e --checkouts /tmp/checkouts
    python tools/measure_drafting/measure.py --cases holdout_f --checkouts /tmp/checkouts
    python tools/measure_drafting/measure.py --cases holdout_g --checkouts /tmp/checkouts
    python tools/measure_drafting/measure.py --validate ...   # Linen only: no drafting

The loopbridge measured is the one under `--loopbridge-src` (default: this checkout's `src`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import typing as tp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cases as cases_lib  # noqa: E402

# float32 tolerances, at the highest matmul precision on both sides.
RTOL = 1e-4
ATOL = 1e-5
# The scale of the noise added to every fresh Linen param before a comparison: a zero- or
# one-initialized param (a last norm's zero scale) would otherwise hide a wrong port.
JITTER = 0.05
RESULT_TAG = "MEASURE-RESULT "
CASE_SETS = (*cases_lib.PINNED_SETS, "enumerate_hf")


class Mismatch(Exception):
  """The port's output is not Linen's (message: where and by how much)."""


# --------------------------------------------------------------------------------------------
# The worker: one case, in this process.


def _load_case_set(set_name: str) -> tp.Any:
  if set_name not in CASE_SETS:
    raise SystemExit(f"--cases must be one of {CASE_SETS}, got {set_name!r}")
  return importlib.import_module(set_name)


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def _leaves(tree: tp.Any) -> list[tp.Any]:
  import jax

  return jax.tree_util.tree_leaves(tree)


def _compare(want: tp.Any, got: tp.Any) -> float:
  """Max abs error between two outputs; raises Mismatch when they differ."""
  import numpy as np

  lw, lg = _leaves(want), _leaves(got)
  if len(lw) != len(lg):
    raise Mismatch(f"output has {len(lg)} arrays, Linen's has {len(lw)}")
  worst = 0.0
  for i, (a, b) in enumerate(zip(lw, lg)):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
      raise Mismatch(f"output {i}: shape {b.shape}, Linen's {a.shape}")
    if a.size == 0:
      continue
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    err = float(np.max(np.abs(a64 - b64)))
    worst = max(worst, err)
    if not np.allclose(b64, a64, rtol=RTOL, atol=ATOL, equal_nan=True):
      raise Mismatch(f"output {i}: max abs err {err:.3g} (rtol {RTOL}, atol {ATOL})")
  return worst


def _differs(want: tp.Any, got: tp.Any) -> bool:
  try:
    _compare(want, got)
  except Mismatch:
    return True
  return False


def _jitter(variables: tp.Any, seed: int) -> tp.Any:
  """Linen variables with noise added to every float leaf of 'params'."""
  import jax
  import jax.numpy as jnp

  out = dict(variables)
  if "params" not in out:
    return out
  leaves, treedef = jax.tree_util.tree_flatten(out["params"])
  keys = jax.random.split(jax.random.key(seed), max(len(leaves), 1))
  new = [
    leaf + JITTER * jax.random.normal(k, leaf.shape, leaf.dtype)
    if jnp.issubdtype(leaf.dtype, jnp.floating)
    else leaf
    for k, leaf in zip(keys, leaves)
  ]
  out["params"] = jax.tree_util.tree_unflatten(treedef, new)
  return out


def _perturb_largest(tree: tp.Any, seed: int) -> tp.Any:
  """`tree` with its largest float leaf moved by unit noise (the negative control)."""
  import jax
  import jax.numpy as jnp

  leaves, treedef = jax.tree_util.tree_flatten(tree)
  sizes = [
    leaf.size if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating) else -1
    for leaf in leaves
  ]
  if not sizes or max(sizes) <= 0:
    raise Mismatch("no float param to perturb")
  i = sizes.index(max(sizes))
  noise = jax.random.normal(jax.random.key(seed), leaves[i].shape, leaves[i].dtype)
  leaves = list(leaves)
  leaves[i] = leaves[i] + noise
  return jax.tree_util.tree_unflatten(treedef, leaves)


def _linen_call(module: tp.Any, variables: tp.Any, setting: cases_lib.Setting, seed: int) -> tp.Any:
  args, kwargs = cases_lib.build_call(setting, seed)
  return module.apply(variables, *args, method=setting.method, **kwargs)


def _linen_init(module: tp.Any, setting: cases_lib.Setting) -> tp.Any:
  import jax

  args, kwargs = cases_lib.build_call(setting, 0)
  keys = {name: jax.random.key(i + 1) for i, name in enumerate(("params", "dropout", "gating"))}
  variables = module.init(keys, *args, method=setting.method, **kwargs)
  return _jitter(dict(variables), seed=5)


def _field_names(module: tp.Any) -> set[str]:
  return {f.name for f in dataclasses.fields(module)} - {"parent", "name"}


class _KwargsAt:
  """The drafted root's constructor arguments at another instance of the Linen class.

  A dataclass field is read from the instance (a Linen submodule field becomes the `PortOf`
  it was drafted as, with its own fields read the same way). An argument that is no field
  (the draft made a root input width a constructor argument) is the input dimension that had
  its value in the first setting's call, read at the same place in the other call; when no
  single place had it, it is kept, and `notes` says so.
  """

  def __init__(
    self,
    first: cases_lib.Setting,
    other: cases_lib.Setting,
    input_sizes: tp.Mapping[str, tuple[int | str, int]] | None = None,
  ):
    self.dims1 = cases_lib.input_dims((first.args, first.kwargs))
    self.dims2 = dict(cases_lib.input_dims((other.args, other.kwargs)))
    # The draft's own word on which axis each root size argument is (`Draft.input_sizes`):
    # `x_features` is the last axis of `x`, whatever its rank in the other call.
    self.input_sizes = dict(input_sizes or {})
    self.notes: list[str] = []

  def _axis_in_other(self, key: str) -> tp.Any:
    where, axis = self.input_sizes[key]
    prefix = f"[0][{where}]" if isinstance(where, int) else f"[1][{where!r}]"
    rank1 = sum(1 for label, _ in self.dims1 if label.startswith(f"{prefix}.shape["))
    rank2 = sum(1 for label in self.dims2 if label.startswith(f"{prefix}.shape["))
    if axis == rank1 - 1:
      axis = rank2 - 1  # the feature axis: the last one there too
    return self.dims2.get(f"{prefix}.shape[{axis}]")

  def of(self, init_kwargs: tp.Mapping[str, tp.Any], module: tp.Any, at_root: bool) -> dict:
    return {k: self._value(k, v, module, at_root) for k, v in init_kwargs.items()}

  def _value(self, key: str, drafted: tp.Any, module: tp.Any, at_root: bool) -> tp.Any:
    import flax.linen as nn

    from loopbridge.port import PortOf

    if key in _field_names(module):
      value = getattr(module, key)
      if isinstance(drafted, PortOf) and isinstance(value, nn.Module):
        return PortOf(drafted.cls, self.of(drafted.kwargs, value, at_root=False))
      return value
    if at_root and key in self.input_sizes and (value := self._axis_in_other(key)) is not None:
      return value
    if at_root and isinstance(drafted, int) and not isinstance(drafted, bool):
      places = [label for label, size in self.dims1 if size == drafted]
      values = {self.dims2[p] for p in places if p in self.dims2}
      if len(values) == 1:
        (value,) = values
        if value != drafted:
          self.notes.append(f"{key}={drafted} is no field: read as input dim {places[0]}")
        return value
      if len(values) > 1:
        raise Mismatch(
          f"root argument {key}={drafted} is no field of the Linen class and several input "
          f"dims of the sample have that value ({', '.join(places)})"
        )
    self.notes.append(f"{key}={drafted!r} is no field: kept from the sample")
    return drafted


def _build_port(source_module: tp.Any, root: str, kwargs: dict) -> tp.Any:
  from flax import nnx

  from loopbridge.port import PortOf

  rngs = nnx.Rngs(0)

  def built(value: tp.Any) -> tp.Any:
    if isinstance(value, PortOf):
      return getattr(source_module, value.cls)(
        **{k: built(v) for k, v in value.kwargs.items()}, rngs=rngs
      )
    return value

  with _no_eager_sharding():
    return getattr(source_module, root)(**{k: built(v) for k, v in kwargs.items()}, rngs=rngs)


def _no_eager_sharding() -> tp.ContextManager[object]:
  """Variables with partitioning metadata are created unsharded (flax 0.12 shards them
  eagerly, which needs a mesh); as the drafter's own `Draft.build` does."""
  import contextlib

  import flax
  from flax import nnx

  if hasattr(nnx, "use_eager_sharding"):
    return nnx.use_eager_sharding(False)
  if getattr(flax.config, "flax_always_shard_variable", False):
    return flax.config.temp_flip_flag("always_shard_variable", False)
  return contextlib.nullcontext()


def _import_source(source: str, name: str) -> tp.Any:
  folder = tempfile.mkdtemp(prefix="measured_port_")
  path = os.path.join(folder, f"{name}.py")
  with open(path, "w") as f:
    f.write(source)
  spec = importlib.util.spec_from_file_location(name, path)
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def _port_at(
  draft: tp.Any,
  source_module: tp.Any,
  linen: tp.Any,
  first: cases_lib.Setting,
  setting: cases_lib.Setting,
) -> dict[str, tp.Any]:
  """Build the draft's root at `setting`, fill it from Linen, compare; control included."""
  import lb_import  # noqa: F401  (loopbridge from --loopbridge-src)
  from flax import nnx

  import loopbridge as lb

  out: dict[str, tp.Any] = {"equal": False}
  kwargs_at = _KwargsAt(first, setting, getattr(draft, "input_sizes", None))
  step = "kwargs"
  try:
    kwargs = kwargs_at.of(draft.init_kwargs, linen, at_root=True)
    step = "build"
    port = _build_port(source_module, draft.root, kwargs)
    step = "linen"
    variables = _linen_init(linen, setting)
    step = "convert"
    args, kw = cases_lib.build_call(setting, 0)
    lb.checkpoint.linen_to_nnx(
      linen, variables, port, *args, sample_kwargs=kw, method=setting.method
    )
    step = "run"
    want = _linen_call(linen, variables, setting, seed=1)
    args, kw = cases_lib.build_call(setting, 1)
    fn = getattr(port, setting.method) if setting.method else port
    got = fn(*args, **kw)
    step = "compare"
    out["max_err"] = _compare(want, got)
    step = "control"
    params = nnx.state(port, nnx.Param)
    nnx.update(port, _perturb_largest(params, seed=11))
    out["control_differs"] = _differs(want, fn(*args, **kw))
    if not out["control_differs"]:
      raise Mismatch("negative control: a perturbed param left the port's output unchanged")
    out["equal"] = True
  except Exception as e:
    out["error"] = f"{step}: {_first_line(e)}"
  out["notes"] = kwargs_at.notes
  return out


def _validate_linen(linen: tp.Any, setting: cases_lib.Setting) -> dict[str, tp.Any]:
  """Linen alone: init/apply run, and a perturbed param changes the output."""
  out: dict[str, tp.Any] = {"equal": False}
  try:
    variables = _linen_init(linen, setting)
    want = _linen_call(linen, variables, setting, seed=1)
    again = _linen_call(linen, variables, setting, seed=1)
    _compare(want, again)  # deterministic
    moved = dict(variables)
    moved["params"] = _perturb_largest(variables["params"], seed=11)
    out["control_differs"] = _differs(want, _linen_call(linen, moved, setting, seed=1))
    out["output_shapes"] = [list(getattr(x, "shape", ())) for x in _leaves(want)]
    out["param_shapes"] = {
      "/".join(str(getattr(k, "key", k)) for k in path): list(leaf.shape)
      for path, leaf in __import__("jax").tree_util.tree_leaves_with_path(variables["params"])
    }
    out["equal"] = bool(out["control_differs"])
    if not out["equal"]:
      out["error"] = "negative control: a perturbed param left Linen's output unchanged"
  except Exception as e:
    out["error"] = _first_line(e)
    out["trace"] = traceback.format_exc()[-2000:]
  return out


def run_case(case: cases_lib.Case, validate: bool) -> dict[str, tp.Any]:
  """Measure one case in this process; every failure is recorded, none raised."""
  import jax
  import lb_import  # noqa: F401

  import loopbridge as lb

  result: dict[str, tp.Any] = {
    "name": case.name,
    "repo": case.repo or f"transformers=={case.version}",
    "commit": case.commit,
    "module": case.module,
    "cls": case.cls,
    "kind": case.kind,
    "equal": False,
  }
  t0 = time.time()
  step = "import"
  try:
    cls = cases_lib.resolve_ref(f"{case.module}:{case.cls}")
    step = "instance"
    first = cls(**cases_lib.build_value(case.first.fields))
    second = cls(**cases_lib.build_value(case.second.fields))
  except Exception as e:
    result["cause"] = f"{step}: {_first_line(e)}"
    result["trace"] = traceback.format_exc()[-3000:]
    return result

  with jax.default_matmul_precision("highest"):
    if validate:
      result["sample"] = _validate_linen(first, case.first)
      result["second"] = _validate_linen(second, case.second)
      result["equal"] = result["sample"]["equal"] and result["second"]["equal"]
      result["cause"] = _cause(result)
      result["seconds"] = round(time.time() - t0, 1)
      return result
    # Linen itself must run both settings, else the case has no sample (a guessed input).
    for where, module, setting in (("first", first, case.first), ("second", second, case.second)):
      try:
        _linen_init(module, setting)
      except Exception as e:
        result["cause"] = f"no sample: Linen at the {where} setting: {_first_line(e)}"
        result["seconds"] = round(time.time() - t0, 1)
        return result
    try:
      args, kwargs = cases_lib.build_call(case.first, 0)
      draft = lb.port.draft(first, *args, method=case.first.method, **kwargs)
    except Exception as e:
      result["draft_error"] = _first_line(e)
      result["trace"] = traceback.format_exc()[-3000:]
      result["cause"] = f"draft raised: {result['draft_error']}"
      result["seconds"] = round(time.time() - t0, 1)
      return result
    result["draft_seconds"] = round(time.time() - t0, 1)
    result["draft_ok"] = bool(draft.ok)
    result["todos"] = len(draft.todos)
    result["todo_lines"] = [_todo_line(t) for t in draft.todos][:20]
    result["check_equal"] = None if draft.check is None else bool(draft.check.equal)
    drafts_dir = os.environ.get("MEASURE_DRAFTS")
    if drafts_dir:  # the draft and its report, to read after the run
      with open(os.path.join(drafts_dir, f"{case.name}.py"), "w") as f:
        f.write(draft.source + "\n# " + draft.report().replace("\n", "\n# ") + "\n")
    try:
      source_module = _import_source(draft.source, f"measured_port_{case.name}")
    except Exception as e:
      result["cause"] = f"draft source does not import: {_first_line(e)}"
      result["seconds"] = round(time.time() - t0, 1)
      return result
    result["sample"] = _port_at(draft, source_module, first, case.first, case.first)
    result["second"] = _port_at(draft, source_module, second, case.first, case.second)
  result["equal"] = bool(
    result["sample"]["equal"] and result["second"]["equal"] and not result.get("todos")
  )
  result["cause"] = _cause(result)
  result["seconds"] = round(time.time() - t0, 1)
  return result


def _todo_line(todo: tp.Any) -> str:
  text = str(getattr(todo, "reason", None) or getattr(todo, "message", None) or todo)
  return text.splitlines()[0][:200] if text else ""


def _cause(result: dict[str, tp.Any]) -> str:
  """The first reason a case is not equal ('' when it is)."""
  if result.get("equal"):
    return ""
  if result.get("todos"):
    first = result["todo_lines"][0] if result.get("todo_lines") else ""
    return f"{result['todos']} TODO(s): {first}"
  for where in ("sample", "second"):
    part = result.get(where) or {}
    if not part.get("equal"):
      return f"{where}: {part.get('error', 'not equal')}"
  return "not equal"


# --------------------------------------------------------------------------------------------
# The driver: one subprocess per case.


def _worker_main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--worker", required=True)
  parser.add_argument("--cases", required=True)
  parser.add_argument("--validate", action="store_true")
  ns = parser.parse_args(argv)
  case_set = _load_case_set(ns.cases)
  try:
    case = case_set.case(ns.worker)
  except Exception as e:
    result = {"name": ns.worker, "equal": False, "cause": f"case: {_first_line(e)}"}
    print(RESULT_TAG + json.dumps(result, default=str), flush=True)
    return
  if case.repo:
    root = os.environ["MEASURE_CHECKOUTS"]
    tree = os.path.join(root, case.checkout_dir, case.path)
    if not os.path.isdir(tree):
      raise SystemExit(f"no exported tree at {tree}: run export_checkouts.py first")
    sys.path.insert(0, tree)
  result = run_case(case, ns.validate)
  sys.stdout.flush()
  print(RESULT_TAG + json.dumps(result, default=str), flush=True)


def _run_subprocess(name: str, ns: argparse.Namespace) -> dict[str, tp.Any]:
  env = dict(os.environ)
  env["MEASURE_CHECKOUTS"] = os.path.abspath(ns.checkouts) if ns.checkouts else ""
  env["MEASURE_LOOPBRIDGE_SRC"] = os.path.abspath(ns.loopbridge_src)
  env.setdefault("JAX_PLATFORMS", "cpu")
  if ns.drafts:
    os.makedirs(ns.drafts, exist_ok=True)
    env["MEASURE_DRAFTS"] = os.path.abspath(ns.drafts)
  env["PYTHONWARNINGS"] = "ignore"
  cmd = [ns.python, os.path.abspath(__file__), "--worker", name, "--cases", ns.cases]
  if ns.validate:
    cmd.append("--validate")
  t0 = time.time()
  try:
    proc = subprocess.run(
      cmd, env=env, capture_output=True, text=True, timeout=ns.timeout, cwd=tempfile.gettempdir()
    )
  except subprocess.TimeoutExpired:
    return {"name": name, "equal": False, "cause": f"timeout after {ns.timeout} s"}
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(RESULT_TAG):
      return json.loads(line[len(RESULT_TAG) :])
  tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
  return {
    "name": name,
    "equal": False,
    "cause": f"worker exited {proc.returncode}: {' | '.join(tail)[:400]}",
    "seconds": round(time.time() - t0, 1),
  }


def cause_kind(cause: str) -> str:
  """A cause cut to its kind: the step and the exception's name ('TODO' for TODOs)."""
  if " TODO(s): " in cause:
    return "TODO left"
  if "no sample" in cause:
    return "no sample"
  match = re.match(r"^(.*?\b[A-Za-z_]*(?:Error|Exception|Mismatch|Exit)\b)", cause)
  if match:
    return match.group(1)
  return cause.split(" (")[0][:60]


def table(results: list[dict[str, tp.Any]], validate: bool = False) -> str:
  """The markdown table of a run, with its count."""
  lines = [
    "| case | class | repo | draft ok | TODOs | sample | second setting | control | EQUAL "
    "| first cause |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in results:
    s, t = r.get("sample") or {}, r.get("second") or {}

    def mark(part: dict) -> str:
      if not part:
        return "-"
      return "yes" if part.get("equal") else "no"

    # The control runs only where a port was built and matched; '-' where it was not reached.
    control = "-"
    if "control_differs" in s and "control_differs" in t:
      control = "yes" if s["control_differs"] and t["control_differs"] else "no"
    cause = str(r.get("cause", "")).replace("|", "\\|").replace("\n", " ")[:160]
    lines.append(
      f"| {r['name']} | `{r.get('cls', '')}` | {r.get('repo', '')} | "
      f"{r.get('draft_ok', '-')} | {r.get('todos', '-')} | {mark(s)} | {mark(t)} | {control} | "
      f"{'**yes**' if r.get('equal') else 'no'} | {cause} |"
    )
  n_equal = sum(bool(r.get("equal")) for r in results)
  kinds: dict[str, list[str]] = {}
  for r in results:
    if not r.get("equal"):
      kinds.setdefault(cause_kind(str(r.get("cause", ""))), []).append(r["name"])
  if kinds:
    lines += ["", "| first cause | count | cases |", "|---|---|---|"]
    for kind, who in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
      lines.append(f"| {kind.replace('|', '/')} | {len(who)} | {', '.join(who)} |")
  what = "valid in Linen at both settings" if validate else "EQUAL with zero edits"
  lines.append("")
  lines.append(f"{what}: **{n_equal} of {len(results)}**")
  return "\n".join(lines)


def main(argv: list[str] | None = None, default_cases: str = "holdout") -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--worker" in argv:
    _worker_main(argv)
    return 0
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument("--cases", default=default_cases, choices=CASE_SETS)
  parser.add_argument("--checkouts", help="folder holding DIR/owner+name exported trees")
  parser.add_argument(
    "--loopbridge-src",
    default=os.path.join(HERE, os.pardir, os.pardir, "src"),
    help="the src folder of the loopbridge to measure (default: this checkout's)",
  )
  parser.add_argument("--python", default=sys.executable, help="the interpreter of the workers")
  parser.add_argument("--only", action="append", default=[], help="case name (repeat or a,b)")
  parser.add_argument("--jobs", type=int, default=1)
  parser.add_argument("--timeout", type=int, default=900, help="seconds per case")
  parser.add_argument("--out", help="write OUT.json and OUT.md")
  parser.add_argument("--validate", action="store_true", help="Linen only: no drafting")
  parser.add_argument("--drafts", help="write each draft and its report to DRAFTS/<case>.py")
  ns = parser.parse_args(argv)
  case_set = _load_case_set(ns.cases)
  names = list(case_set.names())
  if ns.only:
    wanted = [n for arg in ns.only for n in arg.split(",") if n]
    unknown = [n for n in wanted if n not in names]
    if unknown:
      raise SystemExit(f"unknown case(s) {unknown}; known: {', '.join(names)}")
    names = wanted
  needs_tree = ns.cases != "enumerate_hf" and any(case_set.case(n).repo for n in names)
  if needs_tree and not ns.checkouts:
    raise SystemExit("--checkouts DIR is needed (DIR/owner+name trees: export_checkouts.py)")
  results: dict[str, dict[str, tp.Any]] = {}
  with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, ns.jobs)) as pool:
    futures = {pool.submit(_run_subprocess, n, ns): n for n in names}
    for future in concurrent.futures.as_completed(futures):
      r = future.result()
      results[r["name"]] = r
      if ns.out:  # each result as it comes, so a long run that is stopped keeps what it did
        with open(ns.out + ".partial.jsonl", "a") as f:
          f.write(json.dumps(r, default=str) + "\n")
      print(
        f"{r['name']}: {'EQUAL' if r.get('equal') else 'NOT EQUAL:'} {r.get('cause', '')}"[:240]
      )
      sys.stdout.flush()
  ordered = [results[n] for n in names]
  md = table(ordered, ns.validate)
  print(md)
  if ns.out:
    with open(ns.out + ".json", "w") as f:
      json.dump(
        {
          "cases": ns.cases,
          "validate": ns.validate,
          "rtol": RTOL,
          "atol": ATOL,
          "results": ordered,
        },
        f,
        indent=1,
        default=str,
      )
    with open(ns.out + ".md", "w") as f:
      f.write(md + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
