"""The `loopbridge` command line: `inspect` a Linen model, `compare` an NNX port with it.

`loopbridge inspect`: what a Linen model sows, what recording it costs, and a live loop check.

The command wraps the model with `lb.ToNNX`, initializes it on sample inputs, and prints the
sow-site table (`lb.sow_sites`), sows Linen drops, buffer memory, parameter sizes, and then
runs the model in a jitted `nnx.while_loop` twice: wrapped with stock `flax.nnx.bridge.ToNNX`
called the way a user calls it (`mutable=True` only for a model that sows or updates other
collections; that fails on any model that sows, and `lb.explain` says why) and with `lb.ToNNX`
(which records every step). `--capture FILTER` also records submodule outputs
(`capture_intermediates`), the way to record a model that never calls `sow`. Everything the
text shows is also available as one JSON document.

Exit status: 0 success; 1 the target or the model failed (import, attribute, inputs, loop,
including a target that calls `sys.exit` while importing); 2 a malformed command line (TARGET
or --arg syntax, a dtype JAX arrays cannot have, option values). With `--json`, stdout holds
the JSON document only: whatever the model prints goes to stderr.

`loopbridge compare OLD NEW`: `lb.compare` of a Linen model and its NNX port on sample inputs,
the port loaded with the Linen params where the paths correspond. Exit status: 0 the port
agrees; 1 a divergence, or a target or model that failed; 2 a malformed command line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect as pyinspect
import json
import math
import os
import re
import sys
import threading
import time
import traceback
import typing as tp
import warnings

USAGE_ERROR = 2
FAILURE = 1
PROGRESS_DELAY = 0.5  # seconds of silence before a progress note appears on stderr

_MAX_ARRAY_SIZE = 2**63 - 1  # array dimensions and sizes are int64 in JAX
_ARG_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[\s*([0-9,\s]*)\]\s*$")


class CliError(Exception):
  """A failure reported as one line on stderr (with `code` as exit status)."""

  def __init__(self, message: str, code: int = FAILURE):
    super().__init__(message)
    self.code = code


# ----------------------------------------------------------------------------- parsing
def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="loopbridge",
    description="Tools for moving Flax Linen models to NNX loops with loopbridge.",
  )
  commands = parser.add_subparsers(dest="command", metavar="COMMAND")
  commands.required = True
  p = commands.add_parser(
    "inspect",
    help="show a Linen model's sow sites, buffer memory and a live loop check",
    description=(
      "Wrap a Linen model with lb.ToNNX, list its sow sites (shapes, sows per call, "
      "enclosing nn.scan/nn.vmap), sows Linen drops, buffer memory and parameter sizes, "
      "then run it in a jitted nnx.while_loop with stock flax.nnx.bridge.ToNNX (and "
      "explain why that fails) and with lb.ToNNX (counting what it recorded)."
    ),
    epilog=(
      "TARGET is package.module:attribute where attribute is a Linen module instance, a "
      "Linen module class with no required fields, or a function taking no arguments "
      "that returns one. Without TARGET: a built-in MLP (a sow at the top level and "
      "inside nn.scan; width 100, depth 3; input float32[1,100]). Inputs: floats are "
      "standard normal (seeded), integers zeros, bools True. Exit status: 0 ok, 1 the "
      "target or model failed, 2 malformed command line."
    ),
  )
  p.add_argument(
    "target",
    nargs="?",
    metavar="TARGET",
    help="package.module:attribute (default: a built-in MLP that sows)",
  )
  p.add_argument(
    "--arg",
    action="append",
    default=None,
    metavar="SPEC",
    dest="args",
    help="a sample positional input as DTYPE[DIMS], e.g. 'float32[1,100]', "
    "'int32[1,16]', 'bool[]'; repeat for each input",
  )
  p.add_argument("--method", default=None, help="the Linen method to call (default: __call__)")
  p.add_argument(
    "--capture",
    default=None,
    metavar="FILTER",
    help="also record submodule outputs (Linen capture_intermediates): 'all' for "
    "every submodule's __call__, or module class names, comma-separated "
    "(e.g. 'EncoderBlock,Dense'); for models that never call sow",
  )
  p.add_argument(
    "--capacity",
    type=_positive_int,
    default=None,
    help="values each sow buffer holds (default: --steps)",
  )
  p.add_argument(
    "--steps", type=_positive_int, default=5, help="loop steps of the live check (default: 5)"
  )
  p.add_argument("--seed", type=int, default=0, help="seed for parameters and inputs")
  p.add_argument("--json", action="store_true", help="print one JSON document instead")
  p.add_argument("--debug", action="store_true", help="show tracebacks of failures")
  c = commands.add_parser(
    "compare",
    help="find the first module where an NNX port diverges from its Linen original",
    description=(
      "Run a Linen model (OLD_TARGET) and its NNX port (NEW_TARGET) on the same sample "
      "inputs, record every module call on both sides, align them and print where the "
      "port first diverges (lb.compare)."
    ),
    epilog=(
      "OLD_TARGET is package.module:attribute naming a Linen module instance, a Linen "
      "module class with no required fields, or a function taking no arguments that "
      "returns one; its params are initialized with --seed. NEW_TARGET names an NNX "
      "module instance, or a class or function building one from no arguments or from "
      "`rngs` alone. With --weights linen (default) the port receives the Linen params: "
      "its attributes must be named like the Linen submodules (self.Dense_0 = "
      "nnx.Linear(...); a list self.layers[0] matches Linen's layers_0). --weights random "
      "keeps the port's own initialization (to check structure and shapes only). Exit "
      "status: 0 the port agrees; 1 a divergence was found, or a target or model failed "
      "(the message says which); 2 malformed command line."
    ),
  )
  c.add_argument("old", metavar="OLD_TARGET", help="the Linen original: package.module:attribute")
  c.add_argument("new", metavar="NEW_TARGET", help="the NNX port: package.module:attribute")
  c.add_argument(
    "--arg",
    action="append",
    default=None,
    metavar="SPEC",
    dest="args",
    help="a sample positional input as DTYPE[DIMS], e.g. 'float32[1,100]'; repeat for each input",
  )
  c.add_argument(
    "--weights",
    choices=("linen", "random"),
    default="linen",
    help="the port's params: the Linen model's (default), or its own (random: values are "
    "not compared, only structure, shapes and dtypes; --atol is ignored)",
  )
  c.add_argument(
    "--rtol",
    type=_non_negative_float,
    default=None,
    help="relative tolerance (default: per dtype, float32 1e-5)",
  )
  c.add_argument(
    "--atol",
    type=_non_negative_float,
    default=None,
    help="absolute tolerance (default: per dtype, float32 1e-5)",
  )
  c.add_argument("--seed", type=int, default=0, help="seed for parameters and inputs")
  c.add_argument("--json", action="store_true", help="print the report as one JSON document")
  c.add_argument("--debug", action="store_true", help="show tracebacks of failures")
  return parser


def _non_negative_float(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
  if not value >= 0:
    raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
  return value


def _positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
  return value


@dataclasses.dataclass(frozen=True)
class ArgSpec:
  """One `--arg`: a dtype name and a shape."""

  dtype: str
  shape: tuple[int, ...]

  def __str__(self) -> str:
    return f"{self.dtype}[{','.join(map(str, self.shape))}]"


def parse_arg_spec(text: str) -> ArgSpec:
  """`'float32[1,100]'` -> ArgSpec('float32', (1, 100)); CliError (usage) if malformed."""
  import jax
  from jax import numpy as jnp

  match = _ARG_RE.match(text)
  if match is None:
    raise CliError(
      f"--arg {text!r}: expected DTYPE[DIM,...] such as 'float32[1,100]', 'int32[1,16]' "
      "or 'bool[]' (a scalar)",
      USAGE_ERROR,
    )
  name, dims = match.groups()
  try:
    dtype = jnp.dtype(name)
  except TypeError:
    raise CliError(
      f"--arg {text!r}: unknown dtype {name!r}; use a NumPy/JAX dtype name such as "
      "float32, bfloat16, int32 or bool",
      USAGE_ERROR,
    ) from None
  if dtype.itemsize == 8 and dtype.kind in "fiuc" and not jax.config.read("jax_enable_x64"):
    raise CliError(
      f"--arg {text!r}: {name} needs 64-bit JAX (set JAX_ENABLE_X64=1), or use the 32-bit type",
      USAGE_ERROR,
    )
  try:  # e.g. object, str, datetime: NumPy dtypes no JAX array can have
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      jnp.zeros((0,), dtype)
  except TypeError as e:
    raise CliError(
      f"--arg {text!r}: JAX arrays cannot have dtype {name!r} ({_first_line(e)}); use a "
      "number or bool dtype such as float32, bfloat16, int32 or bool",
      USAGE_ERROR,
    ) from None
  pieces = [d.strip() for d in dims.split(",")] if dims.strip() else []
  if any(not p for p in pieces):
    raise CliError(f"--arg {text!r}: empty dimension; write e.g. 'float32[1,100]'", USAGE_ERROR)
  shape = tuple(int(p) for p in pieces)
  # JAX sizes arrays with int64: beyond it, jax fails with an unreadable binding error.
  if any(d > _MAX_ARRAY_SIZE for d in shape) or math.prod(shape) > _MAX_ARRAY_SIZE:
    raise CliError(
      f"--arg {text!r}: {math.prod(shape)} elements, more than a JAX array can hold "
      f"({_MAX_ARRAY_SIZE}, the int64 limit); give the shape a sample input of the model has, "
      "e.g. 'float32[1,100]'",
      USAGE_ERROR,
    )
  return ArgSpec(dtype.name, shape)


def sample_inputs(specs: tp.Sequence[ArgSpec], seed: int) -> list[tp.Any]:
  """Arrays for the specs: floats standard normal, integers zeros, bools True."""
  import jax
  from jax import numpy as jnp

  key = jax.random.key(seed)
  values = []
  for spec in specs:
    key, sub = jax.random.split(key)
    dtype = jnp.dtype(spec.dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
      values.append(jax.random.normal(sub, spec.shape, dtype))
    elif dtype == jnp.bool_:
      values.append(jnp.ones(spec.shape, dtype))
    else:
      values.append(jnp.zeros(spec.shape, dtype))
  return values


# ----------------------------------------------------------------------------- target
def _required_fields(cls: type) -> list[str]:
  return [
    f.name
    for f in dataclasses.fields(cls)
    if f.init
    and f.name not in ("parent", "name")
    and f.default is dataclasses.MISSING
    and f.default_factory is dataclasses.MISSING
  ]


def _resolve(target: str, what: str = "TARGET") -> tp.Any:
  """Import `package.module:attr` and return the attribute (CliError otherwise)."""
  module_name, sep, attr = target.partition(":")
  if (
    not sep
    or not module_name
    or not attr
    or not all(part.isidentifier() for part in module_name.split(".") + attr.split("."))
  ):
    raise CliError(
      f"{what} {target!r} is not of the form package.module:attribute (e.g. mypackage.models:MLP)",
      USAGE_ERROR,
    )
  # Like `python -m`: modules of the current directory are importable.
  if os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name and module_name.startswith(e.name):
      raise CliError(
        f"cannot import module {module_name!r} ({e}); is its directory on PYTHONPATH "
        "or the current directory?"
      ) from e
    raise CliError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from e
  except Exception as e:  # the module itself raised while importing
    raise CliError(f"importing {module_name!r} failed: {type(e).__name__}: {_first_line(e)}") from e
  except SystemExit as e:  # e.g. a script's unguarded `sys.exit(main())`: not a model
    raise CliError(
      f"importing {module_name!r} called sys.exit({e.code!r}), so it defines no model to "
      "inspect. Fix: guard the script part of that module with "
      '`if __name__ == "__main__":`, or point TARGET at a module that only defines the '
      "model"
    ) from None
  obj: tp.Any = module
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise CliError(f"module {module_name!r} has no attribute {attr!r}")
    obj = getattr(obj, part)
  return obj


def load_target(target: str, command: str = "inspect", what: str = "TARGET") -> tp.Any:
  """Resolve `package.module:attr` to a Linen module instance (CliError otherwise)."""
  from flax import linen, nnx

  obj = _resolve(target, what)
  where = f"{target!r}"
  if isinstance(obj, linen.Module):
    return obj
  if isinstance(obj, type) and issubclass(obj, linen.Module):
    missing = _required_fields(obj)
    if missing:
      raise CliError(
        f"{where} is the Linen module class {obj.__name__}, which has required fields "
        f"({', '.join(missing)}); point TARGET at an instance or at a function taking no "
        "arguments that builds one"
      )
    try:
      return obj()
    except Exception as e:
      raise CliError(
        f"{where}: {obj.__name__}() failed: {type(e).__name__}: {_first_line(e)}"
      ) from e
  if isinstance(obj, nnx.Module) or (isinstance(obj, type) and issubclass(obj, nnx.Module)):
    raise CliError(
      f"{where} is an NNX module; loopbridge {command} takes a Linen module"
      + (" (the model it wraps with lb.ToNNX)" if command == "inspect" else f" as {what}")
    )
  if callable(obj) and not isinstance(obj, type):
    try:
      signature = pyinspect.signature(obj)
    except (TypeError, ValueError):
      signature = None
    if signature is not None:
      required = [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
      ]
      if required:
        raise CliError(
          f"{where} is a function with required parameters ({', '.join(required)}); "
          "TARGET must be a Linen module, a Linen module class, or a function taking no "
          "arguments"
        )
    try:
      result = obj()
    except Exception as e:
      raise CliError(f"{where}: calling it failed: {type(e).__name__}: {_first_line(e)}") from e
    if not isinstance(result, linen.Module):
      raise CliError(f"{where} returned a {type(result).__name__}, not a Linen module")
    return result
  raise CliError(
    f"{where} is a {type(obj).__name__}, not a Linen module, a Linen module class or a "
    "function taking no arguments"
  )


def _first_line(error: BaseException, limit: int = 300) -> str:
  text = str(error).strip().splitlines()
  line = text[0] if text else ""
  return line if len(line) <= limit else line[: limit - 3] + "..."


# ----------------------------------------------------------------------------- progress
@contextlib.contextmanager
def progress(
  label: str, stream: tp.TextIO | None = None, delay: float | None = None
) -> tp.Iterator[None]:
  """Note on stderr what is running if it takes longer than `delay` seconds.

  On a terminal the note is a live timer erased when done; otherwise one line.
  """
  out = stream if stream is not None else sys.stderr
  delay = PROGRESS_DELAY if delay is None else delay
  done = threading.Event()
  start = time.perf_counter()
  tty = hasattr(out, "isatty") and out.isatty()
  shown = []

  def run():
    if done.wait(delay):
      return
    if not tty:
      out.write(f"loopbridge: {label}...\n")
      out.flush()
      return
    while not done.wait(0.1):
      text = f"\rloopbridge: {label}... {time.perf_counter() - start:.1f}s"
      shown.append(len(text))
      out.write(text)
      out.flush()

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()
    if shown:
      out.write("\r" + " " * max(shown) + "\r")
      out.flush()


# ----------------------------------------------------------------------------- inspection
def _parameter_sizes(model: tp.Any) -> dict[str, dict[str, int]]:
  """Arrays, values and bytes per Linen collection (buffers, counts and RNG state excluded)."""
  from flax import nnx

  from .. import _compat
  from .._core import buffers

  sizes: dict[str, dict[str, int]] = {}
  seen: set[int] = set()
  for _, node in _compat.iter_graph(model):
    if not isinstance(node, nnx.Variable) or id(node) in seen:
      continue
    seen.add(id(node))
    if isinstance(node, (buffers.Buffer, buffers.Count, nnx.RngState)):
      continue
    value = _compat.variable_value(node)
    if not hasattr(value, "shape"):
      continue
    entry = sizes.setdefault(
      _compat.collection_name(type(node)), {"arrays": 0, "values": 0, "bytes": 0}
    )
    entry["arrays"] += 1
    entry["values"] += int(math.prod(value.shape))
    entry["bytes"] += int(math.prod(value.shape)) * value.dtype.itemsize
  return dict(sorted(sizes.items()))


def _loop_runner(steps: int, call: tp.Callable[[tp.Any, tp.Sequence[tp.Any]], tp.Any]):
  """A jitted `nnx.while_loop` of `steps` calls; returns (body, run)."""
  import jax.numpy as jnp
  from flax import nnx

  def make_body(inputs):
    def body(carry):
      model, i = carry
      call(model, inputs)
      return model, i + 1

    return body

  # Donated as the README recommends: the buffers are written in place, so the "next call"
  # timing shows what a user following it gets (without donation each call copies them).
  @nnx.jit(donate_argnums=0)
  def run(model, *inputs):
    def cond(carry):
      return carry[1] < steps

    return nnx.while_loop(cond, make_body(inputs), (model, jnp.asarray(0, jnp.int32)))

  return make_body, run


def _stock_check(
  module: tp.Any,
  inputs: list[tp.Any],
  call_kwargs: dict[str, tp.Any],
  steps: int,
  seed: int,
  sows: bool,
) -> dict[str, tp.Any]:
  """Stock `flax.nnx.bridge.ToNNX` in the loop, called the way a user calls it for this model.

  A user passes `mutable=True` when the model sows (stock drops sows otherwise) or keeps
  other collections it updates (`batch_stats`, a cache); a model with only
  params is called plainly, and then the stock wrapper runs in the loop as well.
  """
  import jax.numpy as jnp
  from flax import nnx
  from flax.nnx import bridge

  import loopbridge as lb

  from .._core import linen_vars

  result: dict[str, tp.Any] = {
    "wrapper": "flax.nnx.bridge.ToNNX",
    "ok": False,
    "error": None,
    "explain": None,
    "explain_text": None,
    "model_sows": sows,
    "mutable": None,
  }
  try:
    stock = bridge.ToNNX(module, rngs=nnx.Rngs(seed))
    bridge.lazy_init(stock, *inputs, **call_kwargs)
  except Exception as e:
    result["error"] = f"lazy_init failed: {type(e).__name__}: {_first_line(e, 240)}"
    return result
  state_collections = sorted(c for c in linen_vars.linen_variables(stock) if c != "params")
  mutable = sows or bool(state_collections)
  result["mutable"] = mutable

  def call(model, args):
    if mutable:
      return model(*args, mutable=True, **call_kwargs)
    return model(*args, **call_kwargs)

  make_body, run = _loop_runner(steps, call)
  # Explain first, on the untouched model (explain copies the carry; it runs no FLOPs).
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      report = lb.explain(make_body(inputs), (stock, jnp.asarray(0, jnp.int32)))
    result.update(explain=report.to_dict(), explain_text=str(report))
  except Exception as e:  # keep the rest of the report
    result["explain_text"] = f"lb.explain failed: {type(e).__name__}: {_first_line(e, 240)}"
  try:
    with progress("compiling the loop with stock flax.nnx.bridge.ToNNX"):
      _, count = run(stock, *inputs)
      result["steps_run"] = int(count)
    result["ok"] = True
  except Exception as e:  # the expected failure: structure change inside the loop
    result["error"] = f"{type(e).__name__}: {_first_line(e, 240)}"
  return result


def _loopbridge_check(
  model: tp.Any, inputs: list[tp.Any], call_kwargs: dict[str, tp.Any], steps: int
) -> dict[str, tp.Any]:
  """`lb.ToNNX` in the same loop: timings and what each site recorded."""
  import jax

  import loopbridge as lb

  def call(m, args):
    # mutable=True as for the stock wrapper: other collections (batch_stats, a cache) update.
    return m(*args, mutable=True, **call_kwargs)

  _, run = _loop_runner(steps, call)
  result: dict[str, tp.Any] = {"wrapper": "lb.ToNNX", "ok": False, "error": None}
  try:
    with progress("compiling the loop with lb.ToNNX"):
      start = time.perf_counter()
      _, count = run(model, *inputs)
      int(count)  # waits for the device
      first = time.perf_counter() - start
    lb.reset(model)
    start = time.perf_counter()
    _, count = run(model, *inputs)
    steps_run = int(count)
    again = time.perf_counter() - start
  except Exception as e:
    result["error"] = f"{type(e).__name__}: {_first_line(e, 240)}"
    return result
  recorded = {}
  counts = lb.counts(model)
  for site in lb.sow_sites(model):
    n = _nested(counts, (site.collection, *site.path))
    if site.treedef is not None:  # one leaf of a sown pytree: counts are shaped alike
      n = jax.tree.leaves(n)[site.leaf_index]
    n = int(n)
    assert site.capacity is not None  # every site of a declared model has its capacity
    recorded[f"{site.collection}/{site.label}"] = {
      "sown": n,
      "kept": min(n, site.capacity),
      "capacity": site.capacity,
      "value_shape": list(site.shape),
    }
  result.update(
    ok=True, steps_run=steps_run, first_call_s=first, next_call_s=again, recorded=recorded
  )
  return result


def _nested(tree: tp.Any, path: tp.Sequence[str]) -> tp.Any:
  for key in path:
    tree = tree[key]
  return tree


class CaptureFilter:
  """`--capture`: Linen's `capture_intermediates` filter for `all` or module class names.

  Like Linen's `capture_intermediates=True`, it captures `__call__` outputs only. It remembers
  which module classes ran and which (path, method) it captured, so the report can tell a
  model's own sows from captures and say when a class name matched nothing.
  """

  def __init__(self, text: str):
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or not all(n.isidentifier() for n in names):
      raise CliError(
        f"--capture {text!r}: expected 'all' or module class names separated by "
        "commas, e.g. --capture EncoderBlock,Dense",
        code=USAGE_ERROR,
      )
    self.text = text
    self.names = None if names == ["all"] else set(names)
    self.seen: set[str] = set()
    self.captured: set[tuple[str, ...]] = set()

  def __call__(self, module: tp.Any, method_name: str) -> bool:
    kind = type(module).__name__
    self.seen.add(kind)
    take = method_name == "__call__" and (self.names is None or kind in self.names)
    if take and module.scope is not None:
      self.captured.add(("intermediates", *module.scope.path, method_name))
    return take

  def check_matched(self) -> None:
    if self.names is None:
      return
    missing = sorted(self.names - self.seen)
    if missing:
      raise CliError(
        f"--capture {self.text!r}: no module of class {', '.join(missing)} runs in this call, "
        f"so nothing would be captured; the module classes that run are: "
        f"{', '.join(sorted(self.seen)) or 'none'}. Fix: name one of them, or --capture all",
        code=USAGE_ERROR,
      )


def inspect_model(
  module: tp.Any,
  specs: tp.Sequence[ArgSpec],
  *,
  method: str | None,
  capacity: int,
  steps: int,
  seed: int,
  target: str | None,
  description: str | None,
  capture: str | None = None,
) -> dict[str, tp.Any]:
  """Everything `loopbridge inspect` reports, as one JSON-ready dict."""
  from flax import nnx

  import loopbridge as lb

  from .. import _compat

  if method is not None and not callable(getattr(module, method, None)):
    raise CliError(f"{type(module).__name__} has no method {method!r} (--method)")
  call_kwargs: dict[str, tp.Any] = {"method": method} if method is not None else {}
  inputs = sample_inputs(specs, seed)
  capture_filter = CaptureFilter(capture) if capture is not None else None
  model = lb.ToNNX(
    module, rngs=nnx.Rngs(seed), capture_intermediates=capture_filter if capture_filter else False
  )
  try:
    with progress("initializing the model"), warnings.catch_warnings():
      # Dropped sows are listed in the report itself.
      warnings.simplefilter("ignore", lb.DroppedSowWarning)
      lb.lazy_init(model, *inputs, capacity=capacity, **call_kwargs)
  except Exception as e:
    given = " ".join(f"--arg {s}" for s in specs) or "no inputs"
    raise CliError(
      f"{type(module).__name__} cannot run on the given inputs ({given}"
      f"{f', --method {method}' if method else ''}): {type(e).__name__}: {_first_line(e)}"
      + ("" if specs else "; pass its inputs with --arg, e.g. --arg 'float32[1,16]'")
    ) from e
  sites = lb.sow_sites(model)
  captured: set[tuple[str, ...]] = set()
  if capture_filter is not None:
    capture_filter.check_matched()
    captured = capture_filter.captured
  model_sows = any(s.sow_key not in captured for s in sites) or bool(sites.dropped)
  counts_bytes = 4 * len(sites)
  doc: dict[str, tp.Any] = {
    "target": target,
    "description": description,
    "model": type(module).__name__,
    "inputs": [str(s) for s in specs],
    "method": method,
    "capture": capture,
    "capacity": capacity,
    "steps": steps,
    "versions": _compat.installed_versions(),
    "sow_sites": sites.to_dict(),
    "buffer_memory": {
      "buffers_bytes": sites.buffer_bytes,
      "counts_bytes": counts_bytes,
      "total_bytes": sites.buffer_bytes + counts_bytes,
    },
    "parameters": _parameter_sizes(model),
  }
  doc["live_check"] = {
    "stock": _stock_check(module, inputs, call_kwargs, steps, seed, model_sows),
    "loopbridge": _loopbridge_check(model, inputs, call_kwargs, steps),
  }
  doc["sow_sites_table"] = sites.table()
  return doc


# ----------------------------------------------------------------------------- rendering
def render_text(doc: dict[str, tp.Any]) -> str:
  from .._diagnostics.sow_sites import format_bytes, format_table

  out = []
  what = doc["target"] or "(default)"
  out.append(
    f"loopbridge inspect {what}: {doc['model']}"
    + (f" — {doc['description']}" if doc["description"] else "")
  )
  out.append(
    f"inputs: {', '.join(doc['inputs']) or 'none'}"
    + (f"; method: {doc['method']}" if doc["method"] else "")
    + (f"; capture: {doc['capture']}" if doc.get("capture") else "")
    + f"; capacity {doc['capacity']}; flax {doc['versions']['flax']}, "
    f"jax {doc['versions']['jax']}"
  )
  out.append("")
  out.append("Sow sites")
  out.extend(
    "  " + line if i == 0 else line for i, line in enumerate(doc["sow_sites_table"].splitlines())
  )
  if not doc["sow_sites"]["dropped"]:
    out.append("  dropped sows: none")
  mem = doc["buffer_memory"]
  n = len(doc["sow_sites"]["sites"])
  out.append("")
  out.append(
    f"Buffer memory at capacity {doc['capacity']}: {format_bytes(mem['total_bytes'])} "
    f"({n} buffer(s) {format_bytes(mem['buffers_bytes'])} + counts "
    f"{format_bytes(mem['counts_bytes'])})"
  )
  out.append("")
  out.append("Parameters and other variables")
  rows = [
    (col, str(v["arrays"]), f"{v['values']:,}", format_bytes(v["bytes"]))
    for col, v in doc["parameters"].items()
  ]
  out.append(format_table(("collection", "arrays", "values", "bytes"), rows) if rows else "  none")
  live = doc["live_check"]
  out.append("")
  out.append(
    f"Live check: {doc['steps']} steps of a jitted nnx.while_loop calling the model "
    "on the sample inputs"
  )
  stock = live["stock"]
  if stock["ok"] and not stock.get("model_sows"):
    out.append(
      f"  stock flax.nnx.bridge.ToNNX: ran {stock.get('steps_run')} steps (the model "
      "does not sow) — stock bridge works; loopbridge adds recording"
    )
  elif stock["ok"]:
    out.append(f"  stock flax.nnx.bridge.ToNNX: ran {stock.get('steps_run')} steps")
  else:
    out.append(f"  stock flax.nnx.bridge.ToNNX: FAILED  {stock['error']}")
  explained = stock["explain"]
  if stock["explain_text"] and (not stock["ok"] or (explained and not explained["ok"])):
    out.append("  why (lb.explain of one loop step):")
    out.extend("    " + line for line in stock["explain_text"].splitlines())
  ours = live["loopbridge"]
  if ours["ok"]:
    out.append(
      f"  lb.ToNNX: ran {ours['steps_run']} steps; first call "
      f"{ours['first_call_s']:.2f} s (trace + compile + run), next call "
      f"{ours['next_call_s'] * 1e3:.1f} ms (run)"
    )
    rows = [
      (
        path,
        str(r["sown"]),
        str(r["kept"]),
        str(r["capacity"]),
        "(" + ", ".join(map(str, r["value_shape"])) + ")",
      )
      for path, r in ours["recorded"].items()
    ]
    if rows:
      out.append(
        format_table(
          ("recorded site", "sown", "kept", "capacity", "value shape"), rows, indent="    "
        )
      )
      if any(r["sown"] > r["kept"] for r in ours["recorded"].values()):
        out.append(
          "    some sites sowed more than their capacity; raise --capacity to keep every value"
        )
    else:
      out.append(
        "    (the model sows nothing; record submodule outputs with --capture all or "
        "--capture CLASS)"
      )
  else:
    out.append(f"  lb.ToNNX: FAILED  {ours['error']}")
  return "\n".join(out)


# ----------------------------------------------------------------------------- compare
def load_nnx_target(target: str, seed: int) -> tp.Any:
  """Resolve NEW_TARGET to an NNX module instance, building it with `rngs` if needed."""
  from flax import linen, nnx

  obj = _resolve(target, "NEW_TARGET")
  where = f"NEW_TARGET {target!r}"
  if isinstance(obj, nnx.Module):
    return obj
  if isinstance(obj, linen.Module) or (isinstance(obj, type) and issubclass(obj, linen.Module)):
    raise CliError(
      f"{where} is a Linen module; loopbridge compare takes the NNX port as "
      "NEW_TARGET (the Linen original is OLD_TARGET)"
    )
  if not callable(obj):
    raise CliError(
      f"{where} is a {type(obj).__name__}, not an NNX module, an NNX module class "
      "or a function building one"
    )
  try:
    # NNX module classes construct through a metaclass taking (*args, **kwargs): read __init__.
    signature = pyinspect.signature(obj.__init__ if isinstance(obj, type) else obj)
  except (TypeError, ValueError):
    signature = None
  required = (
    []
    if signature is None
    else [
      p.name
      for p in signature.parameters.values()
      if p.default is p.empty
      and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
  )
  if isinstance(obj, type) and required[:1] == ["self"]:
    required = required[1:]
  if required and required != ["rngs"]:
    raise CliError(
      f"{where} needs arguments ({', '.join(required)}); point NEW_TARGET at an "
      "instance, or at a class or function taking no arguments or only `rngs`"
    )
  try:
    result = obj(rngs=nnx.Rngs(seed)) if required else obj()
  except Exception as e:
    raise CliError(f"{where}: building it failed: {type(e).__name__}: {_first_line(e)}") from e
  if not isinstance(result, nnx.Module):
    raise CliError(f"{where} returned a {type(result).__name__}, not an NNX module")
  return result


def _linen_flat(tree: tp.Any, prefix: tuple[str, ...] = ()) -> dict[str, tp.Any]:
  from flax.linen import meta

  flat: dict[str, tp.Any] = {}
  for key, value in meta.unbox(tree).items():
    if isinstance(value, tp.Mapping):
      flat.update(_linen_flat(value, (*prefix, str(key))))
    else:
      flat["/".join((*prefix, str(key)))] = value
  return flat


def _split_scanned(flat: dict[str, tp.Any], wanted: tp.Iterable[str]) -> None:
  """Add per-layer entries for a port holding a list where Linen used `nn.scan`, in place.

  Linen stores an `nn.scan` of layers as one subtree with a leading layer axis
  (`cells/Dense_0/kernel`: (L, i, o)); a port holding a list `self.cells[i]` wants
  `cells_i/Dense_0/kernel` (`lb.layers.unstack_params` layout). The scanned entries that were
  split are removed, so they are not reported as params the port lacks.
  """
  import numpy as np

  used: dict[str, set[int]] = {}
  for key in wanted:
    if key in flat:
      continue
    parts = key.split("/")
    for at, part in enumerate(parts):
      match = re.fullmatch(r"(.+)_(\d+)", part)
      if match is None:
        continue
      scanned = "/".join([*parts[:at], match.group(1), *parts[at + 1 :]])
      index = int(match.group(2))
      value = flat.get(scanned)
      if value is not None and np.ndim(value) >= 1 and index < np.shape(value)[0]:
        flat[key] = value[index]
        used.setdefault(scanned, set()).add(index)
        break
  for key, indices in used.items():
    depth = np.shape(flat[key])[0]
    if len(indices) != depth:
      raise CliError(
        f"cannot load the Linen params into NEW_TARGET: the Linen param {key!r} stacks "
        f"{depth} layers (nn.scan) but the port's list has {len(indices)}; build the port "
        "with as many layers"
      )
    del flat[key]


def _sibling(key: str, keys: tp.Iterable[str]) -> bool:
  """Whether another param of the same layer as `key` ('Dense_1/bias') is among `keys`."""
  layer = key.rpartition("/")[0]
  return any(k != key and k.rpartition("/")[0] == layer for k in keys)


def _layer_lacks(key: str, lacking: str, having: str, side: str, add: bool = False) -> str:
  """Why a param exists on one side only when its layer exists on both: the layer's options.

  `side` is the side to rebuild; `add`: give it the param (else: drop it).
  """
  layer, _, name = key.rpartition("/")
  option = {"bias": "use_bias", "scale": "use_scale"}.get(name)
  why = f" (built with {option}=False?)" if option and add else ""
  fix = (
    f"build the {side}'s layer {layer!r} with {option}={add}"
    if option
    else f"build the {side}'s layer {layer!r} with the same options as the Linen layer"
  )
  return (
    f"Why: {lacking} {layer!r} has no {name!r}{why}, while {having} has one; the names "
    f"match. Fix: {fix}."
  )


def load_linen_params(port: tp.Any, variables: tp.Mapping[str, tp.Any]) -> int:
  """Write the Linen variables into the port's Variables at the same paths; returns how many.

  Paths correspond when the port's attributes are named like the Linen submodules, an NNX
  list index `layers/0` standing for Linen's `layers_0` (or for layer 0 of an `nn.scan` named
  `layers`). Every `nnx.Param` must find its value; other collections (batch statistics, ...)
  are loaded where present.
  """
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from .. import _compat
  from .._diagnostics import compare

  reference = {
    name: _linen_flat(tree) for name, tree in variables.items() if isinstance(tree, tp.Mapping)
  }
  hint = (
    "Name the port's attributes like the Linen submodules (self.Dense_0 = "
    "nnx.Linear(...); a list self.layers[0] for Linen's layers_0), or run with --weights "
    "random to compare structure and shapes only."
  )
  seen: set[int] = set()
  targets: dict[tuple[str, str], tuple[str, tp.Any]] = {}
  for path, node in _compat.iter_graph(port):
    if not isinstance(node, nnx.Variable) or id(node) in seen:
      continue
    seen.add(id(node))
    collection = _compat.collection_name(type(node))
    if collection not in reference:
      continue
    shown, key = compare.path_strings(path)
    if _compat.variable_value(node) is None:
      continue  # flax 0.10 keeps a disabled bias as a Param holding None
    targets[(collection, key)] = (shown, node)
  for collection, flat in reference.items():
    _split_scanned(flat, [key for col, key in targets if col == collection])
  params = reference.get("params", {})
  missing = [
    shown for (col, key), (shown, _) in targets.items() if col == "params" and key not in params
  ]
  port_keys = [key for col, key in targets if col == "params"]
  if missing:
    key = next(k for (col, k), (shown, _) in targets.items() if shown == missing[0])
    raise CliError(
      f"cannot load the Linen params into NEW_TARGET: the port has a Param at "
      f"{missing[0]!r} that the Linen model lacks ({len(missing)} such; Linen params: "
      f"{', '.join(sorted(params)[:8])}{', ...' if len(params) > 8 else ''}). "
      + (
        _layer_lacks(key, "the Linen layer", "the port's layer", "port")
        if _sibling(key, params)
        else hint
      )
    )
  extra = [k for k in params if ("params", k) not in targets]
  if extra:
    if _sibling(extra[0], port_keys):
      raise CliError(
        f"cannot load the Linen params into NEW_TARGET: the Linen param {extra[0]!r} has no "
        f"Param in the port ({len(extra)} such), though the port's layer at that path exists. "
        + _layer_lacks(extra[0], "the port's layer", "the Linen layer", "port", add=True)
      )
    raise CliError(
      f"cannot load the Linen params into NEW_TARGET: the Linen param {extra[0]!r} has no "
      f"Param in the port ({len(extra)} such). {hint}"
    )
  loaded = 0
  for (collection, key), (shown, variable) in targets.items():
    if key not in reference[collection]:
      continue
    old, new = _compat.variable_value(variable), reference[collection][key]
    if np.shape(old) != np.shape(new):
      raise CliError(
        f"cannot load the Linen params into NEW_TARGET: {collection} {key!r} is "
        f"{list(np.shape(new))} in the Linen model but {shown!r} is {list(np.shape(old))} in "
        "the port; build the port with the same widths and depths (a transposed layout, "
        "such as a kernel stored (out, in), has to be converted by hand)."
      )
    _compat.set_variable_value(variable, jnp.asarray(new, getattr(old, "dtype", None)))
    loaded += 1
  return loaded


def run_compare(ns: argparse.Namespace) -> int:
  import jax

  import loopbridge as lb

  specs = [parse_arg_spec(t) for t in (ns.args or [])]
  with progress("importing the models"):
    module = load_target(ns.old, command="compare", what="OLD_TARGET")
    port = load_nnx_target(ns.new, ns.seed)
  inputs = sample_inputs(specs, ns.seed)
  given = " ".join(f"--arg {s}" for s in specs) or "no inputs"
  try:
    with progress("initializing the Linen model"):
      variables = module.init(jax.random.key(ns.seed), *inputs)
  except Exception as e:
    raise CliError(
      f"OLD_TARGET {type(module).__name__} cannot run on the given inputs ({given}): "
      f"{type(e).__name__}: {_first_line(e)}"
      + ("" if specs else "; pass its inputs with --arg, e.g. --arg 'float32[1,16]'")
    ) from e
  if ns.weights == "linen":
    load_linen_params(port, variables)
  try:
    with progress("running both models"):
      # Each model keeps its own random weights: their values cannot agree, so only the
      # structure, shapes and dtypes are compared (an infinite atol compares no values).
      atol = math.inf if ns.weights == "random" else ns.atol
      report = lb.compare((module, variables), port, *inputs, rtol=ns.rtol, atol=atol)
  except lb.CompareError as e:
    raise CliError(str(e).removeprefix("lb.compare: ")) from e
  if ns.json:
    print(json.dumps(report.to_dict(), indent=2))
  else:
    print(str(report))
  return 0 if report.ok else FAILURE


# ----------------------------------------------------------------------------- entry point
@contextlib.contextmanager
def _stdout_to_stderr() -> tp.Iterator[None]:
  """Send what the model prints (Python `print`, `jax.debug.print`, C extensions writing to
  file descriptor 1) to stderr, so stdout holds only the `--json` document."""
  sys.stdout.flush()
  real_out, real_err = sys.__stdout__, sys.__stderr__
  fd = saved = None
  if real_out is not None and real_err is not None:  # None in an embedded interpreter
    try:
      fd, saved = real_out.fileno(), os.dup(real_out.fileno())
    except (AttributeError, OSError, ValueError):  # no real stdout (captured)
      fd, saved = None, None
    else:
      real_out.flush()
      os.dup2(real_err.fileno(), fd)
  try:
    with contextlib.redirect_stdout(sys.stderr):
      yield
  finally:
    sys.stderr.flush()
    if fd is not None and saved is not None:
      os.dup2(saved, fd)
      os.close(saved)


def run_inspect(ns: argparse.Namespace) -> int:
  from . import default_model

  if ns.target is None:
    target, description = None, default_model.DESCRIPTION
    arg_texts = ns.args if ns.args else list(default_model.DEFAULT_ARGS)
  else:
    target, description = ns.target, None
    arg_texts = ns.args or []
  specs = [parse_arg_spec(t) for t in arg_texts]
  with _stdout_to_stderr() if ns.json else contextlib.nullcontext():
    with progress("importing the model"):
      module = default_model.default_model() if target is None else load_target(target)
    capacity = ns.capacity if ns.capacity is not None else ns.steps
    doc = inspect_model(
      module,
      specs,
      method=ns.method,
      capacity=capacity,
      steps=ns.steps,
      seed=ns.seed,
      target=target,
      description=description,
      capture=ns.capture,
    )
  if ns.json:
    doc = {k: v for k, v in doc.items() if k != "sow_sites_table"}
    print(json.dumps(doc, indent=2))
  else:
    print(render_text(doc))
  return 0 if doc["live_check"]["loopbridge"]["ok"] else FAILURE


def main(argv: tp.Sequence[str] | None = None) -> int:
  """Run the `loopbridge` command line; returns the exit status."""
  parser = build_parser()
  ns = parser.parse_args(argv)
  try:
    if ns.command == "inspect":
      return run_inspect(ns)
    if ns.command == "compare":
      return run_compare(ns)
    parser.error(f"unknown command {ns.command!r}")
  except CliError as e:
    if ns.debug:
      traceback.print_exc()
    print(f"loopbridge {ns.command}: error: {e}", file=sys.stderr)
    return e.code
  except KeyboardInterrupt:
    print(f"loopbridge {ns.command}: interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # a bug or an unforeseen failure: still one line unless --debug
    if ns.debug:
      raise
    print(
      f"loopbridge {ns.command}: error: unexpected {type(e).__name__}: {_first_line(e)} "
      "(run again with --debug for the traceback)",
      file=sys.stderr,
    )
    return FAILURE
  return 0
