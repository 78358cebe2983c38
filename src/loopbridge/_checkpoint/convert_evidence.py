"""Deciding by running: every candidate pairing is checked against the source model's outputs.

The source side (Linen for `linen_to_nnx`, the port for `nnx_to_linen`) runs once on the
sample arguments with its real values, recording each module's first concrete call (inputs
and output; calls inside `nn.scan` / `nnx.scan` see tracers and are not recorded). Then:
1. A pair with several candidates (leaves of equal shapes under other names, a group that
   several leaf transforms fit) is decided where its modules were called concretely: the
   target module alone is applied, with each candidate's values, to the inputs the source
   module saw; the candidate whose output agrees is kept.
2. What stays open (pairs inside stacks, a Linen stack whose layer axis is ambiguous because
   its depth equals a width) is decided on the whole model: the target runs with each
   combination; the one whose output agrees is kept. None or several agreeing is an error
   naming the candidates.
3. The target runs once more with the kept conversion (or the decisive run is reused); every
   pair whose modules both ran concretely is compared call against call, the rest through the
   model's output. A conversion that returns is one whose output agrees.

Agreement is `|target - source| <= atol * max|source| + rtol * |source|` with `lb.compare`'s
default tolerance for the dtype, backend and check precision (both models run under
`jax.default_matmul_precision('highest')` by default; `convert.py` sets it). Candidates that
produce identical arrays (e.g. two zero biases swapped) are one conversion.
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import math
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from .. import _compat
from .._core.buffers import is_traced
from .._core.errors import CheckpointError
from .._diagnostics.compare_tolerance import HIGHEST, ToleranceChoice, default_tolerance, is_float
from .convert_align import Key, Value, nnx_variables, unflatten
from .convert_match import MAX_OPTIONS, Pair
from .convert_moves import Axes, to_linen, to_nnx

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Record:
  """One concrete module call: its inputs and output."""

  args: tuple[object, ...]
  kwargs: dict[str, object]
  out: object


def _concrete(tree: object) -> bool:
  return not any(is_traced(x) for x in jax.tree.leaves(tree))


_RNG_HELP = (
  "If a model draws random numbers on these sample arguments (dropout in training mode), "
  "make the sample call deterministic (e.g. sample_kwargs={'train': False}) so both models "
  "compute the same."
)


def _rngs() -> dict[str, jax.Array]:
  key = jax.random.key(0)
  return {"params": key, "dropout": key}


# --- running each side ----------------------------------------------------------------------


def linen_run(
  module: nn.Module,
  variables: tp.Mapping[Key, Value],
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> tuple[object, dict[Path, Record]]:
  """Linen `apply` on flat variables, recording each module's first concrete `__call__`."""
  records: dict[Path, Record] = {}

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    scope = context.module.scope
    if scope is not None and context.method_name == "__call__":
      path = tuple(str(p) for p in scope.path)
      if path not in records and _concrete((args, kwargs, out)):
        records[path] = Record(tuple(args), dict(kwargs), out)
    return out

  try:
    with nn.intercept_methods(interceptor):
      out, _ = module.apply(
        tp.cast(dict, unflatten(variables)),
        *sample_args,
        method=method,
        mutable=True,
        rngs=_rngs(),
        **(sample_kwargs or {}),
      )
  except Exception as e:
    raise CheckpointError(
      f"running the Linen module {type(module).__name__} with the converted variables failed "
      f"({type(e).__name__}: {e})."
    ) from e
  return out, records


_RECORDS: contextvars.ContextVar[dict[Path, Record] | None] = contextvars.ContextVar(
  "loopbridge_convert_records", default=None
)
_PATH_ATTR = "_loopbridge_evidence_path"
_RECORDING_CLASSES: dict[type, type] = {}


def _recording_class(cls: type) -> type:
  """A subclass of `cls` whose `__call__` records its first concrete call (made once)."""
  if cls not in _RECORDING_CLASSES:

    def __call__(self, *args, **kwargs):
      out = cls.__call__(self, *args, **kwargs)
      records = _RECORDS.get()
      path = getattr(self, _PATH_ATTR, None)
      fresh = records is not None and path is not None and path not in records
      if fresh and _concrete((args, kwargs, out)):
        tp.cast(dict, records)[path] = Record(tuple(args), dict(kwargs), out)
      return out

    _RECORDING_CLASSES[cls] = type(
      cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__}
    )
  return _RECORDING_CLASSES[cls]


def _copy_with(node: nnx.Module, values: tp.Mapping[Key, Value] | None, prefix: Path) -> nnx.Module:
  """A copy of an NNX graph (new Variables, arrays shared) holding `values` (keys below
  `prefix`); the original is left as it is, whatever the copy's call updates."""
  copy = _compat.clone_graph(node)
  if values:
    for key, variable in nnx_variables(copy).items():
      full = (key[0], *prefix, *key[1:])
      if full in values:
        _compat.set_variable_value(variable, values[full])
  return copy


def nnx_run(
  port: nnx.Module,
  values: tp.Mapping[Key, Value] | None,
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
  method: str | None = None,
) -> tuple[object, dict[Path, Record]]:
  """A copy of the port holding `values` (None: its own) called once, recording each module's
  first concrete `__call__`."""
  copy = _copy_with(port, values, ())
  for path, node in _compat.iter_graph(copy):
    if isinstance(node, nnx.Module) and callable(type(node)) and "__call__" in dir(type(node)):
      node.__class__ = _recording_class(type(node))
      setattr(node, _PATH_ATTR, tuple(str(p) for p in path))
  records: dict[Path, Record] = {}
  token = _RECORDS.set(records)
  try:
    out = getattr(copy, method or "__call__")(*sample_args, **(sample_kwargs or {}))
  except Exception as e:
    raise CheckpointError(
      f"running the NNX port {type(port).__name__} with the converted values failed "
      f"({type(e).__name__}: {e})."
    ) from e
  finally:
    _RECORDS.reset(token)
  return out, records


def _node_at(root: object, path: Path) -> object | None:
  for p, node in _compat.iter_graph(root):
    if tuple(str(x) for x in p) == path:
      return node
  return None


# --- agreement ------------------------------------------------------------------------------


def _as_numpy(leaf: object) -> np.ndarray:
  dtype = getattr(leaf, "dtype", None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(tp.cast(jax.Array, leaf))
  return np.asarray(leaf)


def agreement(reference: object, candidate: object, tol: ToleranceChoice) -> float | None:
  """The max abs difference when `candidate` agrees with `reference` within tolerance;
  None when it does not (or the two have other structures or shapes)."""
  ref, cand = jax.tree.leaves(reference), jax.tree.leaves(candidate)
  if len(ref) != len(cand):
    return None
  worst = 0.0
  for a, b in zip(ref, cand):
    x, y = _as_numpy(a), _as_numpy(b)
    if x.shape != y.shape:
      return None
    if not (is_float(x.dtype) or is_float(y.dtype)):
      if not np.array_equal(x, y):
        return None
      continue
    rtol, atol = tol.for_values(x)  # atol relative to the source output's scale
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(invalid="ignore"):
      same = (x64 == y64) | (np.isnan(x64) & np.isnan(y64))
      diff = np.where(same, 0.0, np.abs(y64 - x64))
    diff = np.where(np.isnan(diff), np.inf, diff)
    if not bool(np.all(diff <= atol + rtol * np.abs(np.nan_to_num(x64)))):
      return None
    worst = max(worst, float(diff.max()) if diff.size else 0.0)
  return worst


# --- deciding -------------------------------------------------------------------------------


class OutputMismatch(CheckpointError):
  """The kept conversion's output differs from the source model's."""


@dataclasses.dataclass
class Check:
  """How one pair was decided and checked."""

  decided: str  # "unique" (one candidate), "module" or "model" (evidence chose among several)
  candidates: int
  checked: str  # "module": its own call; "model": through the model's output
  max_abs_error: float


@dataclasses.dataclass
class Verdict:
  """The evidence's outcome: the checks per pair (by index), the kept layer axes, and the
  checked target values (written as they are: no second conversion, no second copy)."""

  checks: list[Check]
  axes: dict[tuple[Path, str], int]
  output_error: float
  values: dict[Key, Value]


class Sides:
  """The two models and the direction: which side is the source, how the target runs."""

  def __init__(
    self,
    linen_module: nn.Module,
    linen_modules: tp.Mapping[Path, nn.Module],
    port: nnx.Module,
    sample_args: tuple[object, ...],
    source: tp.Mapping[Key, Value],
    to_nnx_direction: bool,
    sample_kwargs: tp.Mapping[str, tp.Any] | None = None,
    method: str | None = None,
    precision: str = HIGHEST,
  ):
    self.linen_module = linen_module
    self.linen_modules = linen_modules
    self.port = port
    self.sample_args = sample_args
    # The sample call's keywords and method (as in Linen's `apply`): every run of either model.
    self.sample_kwargs = dict(sample_kwargs or {})
    self.method = method
    self.source = source
    self.forward = to_nnx_direction
    self.tol = default_tolerance(precision=precision)  # the runs are under check_context
    self._source_run: tuple[object, dict[Path, Record]] | None = None

  def convert(self, pairs: tp.Sequence[Pair], axes: Axes) -> dict[Key, Value]:
    return (to_nnx if self.forward else to_linen)(pairs, self.source, None, axes)

  def run_source(self) -> tuple[object, dict[Path, Record]]:
    """The source model on the sample arguments (run once, then remembered)."""
    if self._source_run is None:
      if self.forward:
        self._source_run = linen_run(
          self.linen_module, self.source, self.sample_args, self.sample_kwargs, self.method
        )
      else:
        self._source_run = nnx_run(
          self.port, None, self.sample_args, self.sample_kwargs, self.method
        )
    return self._source_run

  def run_target(self, values: tp.Mapping[Key, Value]) -> tuple[object, dict[Path, Record]]:
    if self.forward:
      return nnx_run(self.port, values, self.sample_args, self.sample_kwargs, self.method)
    return linen_run(self.linen_module, values, self.sample_args, self.sample_kwargs, self.method)

  def source_path(self, pair: Pair) -> Path:
    return pair.linen_at if self.forward else pair.nnx_at

  def target_path(self, pair: Pair) -> Path:
    return pair.nnx_at if self.forward else pair.linen_at

  def apply_target(self, path: Path, values: tp.Mapping[Key, Value], record: Record) -> object:
    """The target module at `path` alone, holding `values`, on a recorded call's inputs."""
    if self.forward:
      module = _node_at(self.port, path)
      if not isinstance(module, nnx.Module):
        raise LookupError(path)
      copy = _copy_with(module, values, path)
      return copy(*record.args, **record.kwargs)  # pyright: ignore[reportCallIssue]
    module = self.linen_modules[path]
    below = {
      (k[0], *k[1 + len(path) :]): v for k, v in values.items() if k[1 : 1 + len(path)] == path
    }

    # The recorded call's own keywords go to the module's `__call__`, not to `apply`.
    def call(module: nn.Module) -> object:
      return module(*record.args, **record.kwargs)

    out, _ = module.apply(tp.cast(dict, unflatten(below)), method=call, mutable=True, rngs=_rngs())
    return out


def _under(key: Key, path: Path) -> bool:
  return key[1 : 1 + len(path)] == path


def _same_values(a: tp.Mapping[Key, Value], b: tp.Mapping[Key, Value]) -> bool:
  return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


Groups = dict[tuple[object, ...], list[int]]
AxisOptions = dict[tuple[Path, str], tuple[int, ...]]
# The target's output and records, the layer axes and the values it ran with.
Run = tuple[object, dict[Path, Record], dict[tuple[Path, str], int], dict[Key, Value]]


def decide(pairs: list[Pair], sides: Sides, axis_options: AxisOptions) -> Verdict:
  """Choose every open candidate by running; check the whole conversion; raise if in doubt."""
  ref_out, ref_records = sides.run_source()
  groups: Groups = {}
  for i, pair in enumerate(pairs):
    groups.setdefault(pair.key, []).append(i)
  open_keys = [k for k, idx in groups.items() if len(pairs[idx[0]].options) > 1]
  decided_by = _by_module(pairs, groups, open_keys, sides, ref_records)
  open_keys = [k for k in open_keys if k not in decided_by]
  final = _by_model(pairs, groups, open_keys, sides, axis_options, ref_out, decided_by)
  return _final_check(pairs, sides, ref_out, ref_records, final, decided_by)


def _by_module(
  pairs: list[Pair],
  groups: Groups,
  open_keys: list[tuple[object, ...]],
  sides: Sides,
  ref_records: dict[Path, Record],
) -> dict[tuple[object, ...], str]:
  """Open pairs whose modules ran concretely: the target module alone, with each candidate,
  on the inputs the source module saw (deepest modules first). Returns what it decided."""
  decided_by: dict[tuple[object, ...], str] = {}
  for key in sorted(open_keys, key=lambda k: -len(sides.target_path(pairs[groups[k][0]]))):
    idx = groups[key]
    pair = pairs[idx[0]]
    record = ref_records.get(sides.source_path(pair))
    if len(idx) != 1 or record is None:
      continue
    target = sides.target_path(pair)
    nearby = [
      p for p in pairs if any(_in(u.path, target) for u in (p.nnx if sides.forward else p.linen))
    ]
    agreeing: list[tuple[int, dict[Key, Value]]] = []
    try:
      for option in range(len(pair.options)):
        pair.chosen = option
        values = {k: v for k, v in sides.convert(nearby, {}).items() if _under(k, target)}
        out = sides.apply_target(target, values, record)
        if agreement(record.out, out, sides.tol) is not None and not any(
          _same_values(values, v) for _, v in agreeing
        ):
          agreeing.append((option, values))
    except Exception:  # the module does not run alone on these inputs: the model decides
      agreeing = []
    pair.chosen = agreeing[0][0] if len(agreeing) == 1 else 0
    if len(agreeing) == 1:
      decided_by[key] = "module"
  return decided_by


def _by_model(
  pairs: list[Pair],
  groups: Groups,
  open_keys: list[tuple[object, ...]],
  sides: Sides,
  axis_options: AxisOptions,
  ref_out: object,
  decided_by: dict[tuple[object, ...], str],
) -> Run | None:
  """What stays open, on the whole model: every combination of open pairs and layer axes.
  Returns the decisive run (None when nothing was open)."""
  axis_keys = sorted(axis_options)
  choices = [len(pairs[groups[k][0]].options) for k in open_keys]
  choices += [len(axis_options[k]) for k in axis_keys]
  total = math.prod(choices)
  lines = _open_lines(pairs, groups, open_keys, axis_options, axis_keys)
  if total > MAX_OPTIONS:
    raise CheckpointError(
      f"{total} combinations of candidates stay open after checking each module alone, too "
      f"many to run the model on each:\n{lines}\nFix: pass rules=[...] or mapping= entries "
      "for these (each line lists its candidates)."
    )
  if total == 1:
    return None
  agreeing: list[tuple[tuple[int, ...], dict[Key, Value], Run]] = []
  for combo in itertools.product(*(range(c) for c in choices)):
    for key, option in zip(open_keys, combo):
      for i in groups[key]:
        pairs[i].chosen = option
    axes = {k: axis_options[k][o] for k, o in zip(axis_keys, combo[len(open_keys) :])}
    values = sides.convert(pairs, axes)
    out, records = sides.run_target(values)
    if agreement(ref_out, out, sides.tol) is not None and not any(
      _same_values(values, v) for _, v, _ in agreeing
    ):
      agreeing.append((combo, values, (out, records, axes, values)))
  if not agreeing:
    raise CheckpointError(
      f"no candidate conversion reproduces the {_source_name(sides)} model's output on the "
      f"sample arguments ({total} tried). The open choices:\n{lines}\nFix: check that the "
      f"port computes what the Linen model computes (lb.compare), then pass rules=[...] or "
      f"mapping= for the leaves it stores otherwise. {_RNG_HELP}"
    )
  if len(agreeing) > 1:
    raise CheckpointError(
      f"{len(agreeing)} different conversions reproduce the {_source_name(sides)} "
      f"model's output on the sample arguments, so the sample cannot tell them apart:\n"
      f"{lines}\nFix: pass the intended one as rules=[...] or mapping= (ready to paste "
      "above), or sample arguments that exercise every layer."
    )
  combo, _, run = agreeing[0]
  for key, option in zip(open_keys, combo):
    for i in groups[key]:
      pairs[i].chosen = option
    decided_by[key] = "model"
  return run


def _final_check(
  pairs: list[Pair],
  sides: Sides,
  ref_out: object,
  ref_records: dict[Path, Record],
  final: Run | None,
  decided_by: dict[tuple[object, ...], str],
) -> Verdict:
  """The kept conversion against the source: the model's output, and each pair's own call."""
  if final is None:
    axes = {}
    values = sides.convert(pairs, axes)
    out, records = sides.run_target(values)
  else:
    out, records, axes, values = final
  output_error = agreement(ref_out, out, sides.tol)
  checks: list[Check] = []
  first_bad: Pair | None = None
  for pair in pairs:
    ref = ref_records.get(sides.source_path(pair))
    got = records.get(sides.target_path(pair))
    err = None if ref is None or got is None else agreement(ref.out, got.out, sides.tol)
    if ref is not None and got is not None and err is None and first_bad is None:
      first_bad = pair
    n = len(pair.options)
    checks.append(
      Check(
        decided_by.get(pair.key, "unique") if n > 1 else "unique",
        n,
        "module" if err is not None else "model",
        err if err is not None else (output_error if output_error is not None else math.inf),
      )
    )
  if output_error is None:
    where = (
      f" The first module pair whose outputs differ: Linen `{_name(first_bad.linen_at)}` "
      f"and NNX `{_name(first_bad.nnx_at)}` "
      f"({', '.join(str(m.rule) for m in first_bad.moves)})."
      if first_bad is not None
      else ""
    )
    raise OutputMismatch(
      f"the converted {'port' if sides.forward else 'Linen model'} does not reproduce the "
      f"{_source_name(sides)} model's output on the sample arguments.{where} Fix: check the "
      "port with lb.compare; if it stores arrays otherwise (split, fused, reshaped, "
      "transposed, renamed), pass rules=[...]; if modules pair wrongly, pass mapping=. " + _RNG_HELP
    )
  return Verdict(checks, dict(axes), output_error, values)


def _name(path: Path) -> str:
  return "/".join(path) or "<root>"


def _in(path: Path, prefix: Path) -> bool:
  return path[: len(prefix)] == prefix


def _source_name(sides: Sides) -> str:
  return "Linen" if sides.forward else "NNX"


def _open_lines(
  pairs: tp.Sequence[Pair],
  groups: tp.Mapping[tuple[object, ...], list[int]],
  open_keys: tp.Sequence[tuple[object, ...]],
  axis_options: tp.Mapping[tuple[Path, str], tuple[int, ...]],
  axis_keys: tp.Sequence[tuple[Path, str]],
) -> str:
  lines = []
  for key in open_keys:
    pair = pairs[groups[key][0]]
    lines.append(f"  Linen `{_name(pair.linen_at)}` -> NNX `{_name(pair.nnx_at)}`:")
    for option in range(len(pair.options)):
      rules = ", ".join(str(m.rule) for m in pair.options[option])
      lines.append(f"    candidate {option + 1}: rules=[{rules}]")
  for stack, col in axis_keys:
    lines.append(
      f"  Linen stack `{'/'.join(stack)}` stores `{col}` along one of the axes "
      f"{list(axis_options[(stack, col)])} (its depth equals a width)"
    )
  return "\n".join(lines)
