"""Deciding by running: every candidate pairing is checked against the source model's outputs.

The source side (Linen for `linen_to_nnx`, the port for `nnx_to_linen`) runs with its real
values on every input (`convert_probes`: the sample arguments and probes made from their
shapes and dtypes, because a degenerate sample lets wrong candidates agree), recording each
module's first concrete call (inputs and output; calls inside `nn.scan` / `nnx.scan` see
tracers and are not recorded). A candidate agrees only if it agrees on every input. Then:
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

Each decision notes which inputs ruled the other candidates out (the report's `probes`).
Agreement is `|target - source| <= atol * max|source| + rtol * |source|` with `lb.compare`'s
default tolerance for the dtype, backend and check precision (both models run under
`jax.default_matmul_precision('highest')` by default; `convert.py` sets it). Candidates that
produce identical arrays (e.g. two zero biases swapped) are one conversion. Running each side
(compiled, recording its modules' calls) and comparing two outputs is `convert_runs`' job.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import typing as tp

import numpy as np
from flax import linen as nn
from flax import nnx

from .._core.errors import CheckpointError
from .._diagnostics.compare_tolerance import HIGHEST, default_tolerance
from .convert_align import Key, Value, unflatten
from .convert_classes import MAX_ASSIGNMENTS, unit_mapping
from .convert_enclosing import by_enclosing
from .convert_moves import Axes, to_linen, to_nnx
from .convert_pairs import Pair
from .convert_probes import PROBES, SAMPLE, Input, make_inputs, probes_only_message, same_array
from .convert_runs import (
  RNG_HELP,
  Path,
  Ran,
  Record,
  agreement,
  copy_with,
  fixed_rngs,
  linen_run,
  nnx_run,
  node_at,
)

# The most combinations of open candidates the model is run on (each: the model on every
# input): as many as the assignments among six modules of equal shapes, which the docs
# promise are tried.
MAX_MODEL_RUNS = MAX_ASSIGNMENTS

# --- deciding -------------------------------------------------------------------------------


class OutputMismatch(CheckpointError):
  """The kept conversion's output differs from the source model's."""


# How to load weights into a port that is not yet right, to find where it differs.
LOAD_ANYWAY = (
  "To load the weights anyway for checking (nothing is proven then): "
  "lb.checkpoint.linen_to_nnx(..., check=False) fills the port with this pairing, or "
  "lb.layers.load_params([variables['params']], [port]) by name (a list `blocks[0]` takes "
  "Linen's `blocks_0`); then lb.compare((linen_module, variables), port, *sample_args) names "
  "the first module that differs. From the shell, `loopbridge compare LINEN_TARGET "
  "NNX_TARGET --arg ... --kwarg ...` does both. "
)


@dataclasses.dataclass
class Check:
  """How one pair was decided and checked."""

  decided: str  # "unique" (one candidate), "module" or "model" (evidence chose among several)
  candidates: int
  checked: str  # "module": its own call; "model": through the model's output
  max_abs_error: float
  # The inputs ("sample", "probe 1", ...) that ruled the other candidates out.
  probes: tuple[str, ...] = ()


@dataclasses.dataclass
class Verdict:
  """The evidence's outcome: the checks per pair (by index), the kept layer axes, and the
  checked target values (written as they are: no second conversion, no second copy)."""

  checks: list[Check]
  axes: dict[tuple[Path, str], int]
  output_error: float
  values: dict[Key, Value]
  # Unproven (`prove=False`, loading for checking) only: the first module pair whose outputs
  # differ, as (source path, target path); None when the outputs agree.
  differing: tuple[Path, Path] | None = None


class Sides:
  """The two models and the direction: which side is the source, how the target runs, and
  the inputs both run on (the sample and probes made from it)."""

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
    prove: bool = True,
  ):
    self.linen_module = linen_module
    # False: load for checking a port that is not right yet; what the evidence cannot decide
    # takes its first candidate, said so as "unproven", and a differing output is reported,
    # not refused.
    self.prove = prove
    self.linen_modules = linen_modules
    self.port = port
    self.sample_args = sample_args
    # The sample call's keywords and method (as in Linen's `apply`): every run of either model.
    self.sample_kwargs = dict(sample_kwargs or {})
    self.method = method
    self.source = source
    self.forward = to_nnx_direction
    self.tol = default_tolerance(precision=precision)  # the runs are under check_context
    # `probes=` checked: a count to draw, or the user's inputs (`convert_probes`).
    self.probes: int | list[tuple[tuple[object, ...], dict[str, object]]] = PROBES
    self._inputs: list[Input] | None = None
    # Modules (source paths) whose candidates reproduced the sample but none a probe.
    self.off_sample: list[tuple[Path, Input]] = []
    self._source_runs: list[Ran] | None = None

  def convert(self, pairs: tp.Sequence[Pair], axes: Axes) -> dict[Key, Value]:
    return (to_nnx if self.forward else to_linen)(pairs, self.source, None, axes)

  def _run(self, linen: bool, values: tp.Mapping[Key, Value] | None, given: Input) -> Ran:
    if linen:
      return linen_run(
        self.linen_module, tp.cast(tp.Mapping, values), given.args, given.kwargs, self.method
      )
    return nnx_run(self.port, values, given.args, given.kwargs, self.method)

  @property
  def inputs(self) -> list[Input]:
    """The sample, then the probes (made once, from the source's run on the sample)."""
    self.run_source()
    return tp.cast(list[Input], self._inputs)

  def run_source(self) -> list[Ran]:
    """The source model on every input (run once, then remembered)."""
    if self._source_runs is None:
      sample = Input("sample", tuple(self.sample_args), dict(self.sample_kwargs))
      first = self._run(self.forward, self.source if self.forward else None, sample)
      self._inputs = make_inputs(
        self.sample_args, self.sample_kwargs, self._vocabulary(first), self.probes
      )
      self._source_runs = [first] + [
        self._run(self.forward, self.source if self.forward else None, given)
        for given in self._inputs[1:]
      ]
    return self._source_runs

  def _vocabulary(self, sample_run: Ran) -> tp.Callable[[object], int | None]:
    """An integer sample leaf -> the vocabulary of the embedding whose recorded call took
    it (`num_embeddings` of flax's `nn.Embed` / `nnx.Embed`, or a look-alike's `vocab_size`)."""
    found: list[tuple[object, int]] = []
    for path, record in sample_run[1].items():
      module = self.linen_modules.get(path) if self.forward else node_at(self.port, path)
      size = getattr(module, "num_embeddings", getattr(module, "vocab_size", None))
      if isinstance(size, int) and size > 1 and record.args:
        found.append((record.args[0], size))
    return lambda leaf: min((n for a, n in found if same_array(a, leaf)), default=None)

  def note_off_sample(self, path: Path, rejected: tp.Iterable[str]) -> None:
    """Note a module none of whose candidates agreed, where one failed only on a probe."""
    probe = next((i for i in self.inputs if i.name != SAMPLE and i.name in set(rejected)), None)
    if probe is not None:
      self.off_sample.append((path, probe))

  def run_target(self, values: tp.Mapping[Key, Value], given: Input) -> Ran:
    return self._run(not self.forward, values, given)

  def source_path(self, pair: Pair) -> Path:
    return pair.linen_at if self.forward else pair.nnx_at

  def target_path(self, pair: Pair) -> Path:
    return pair.nnx_at if self.forward else pair.linen_at

  def apply_target(self, path: Path, values: tp.Mapping[Key, Value], record: Record) -> object:
    """The target module at `path` alone, holding `values`, on a recorded call's inputs."""
    if self.forward:
      module = node_at(self.port, path)
      if not isinstance(module, nnx.Module):
        raise LookupError(path)
      copy = copy_with(module, values, path)
      return copy(*record.args, **record.kwargs)  # pyright: ignore[reportCallIssue]
    module = self.linen_modules[path]
    below = {
      (k[0], *k[1 + len(path) :]): v for k, v in values.items() if k[1 : 1 + len(path)] == path
    }

    # The recorded call's own keywords go to the module's `__call__`, not to `apply`.
    def call(module: nn.Module) -> object:
      return module(*record.args, **record.kwargs)

    out, _ = nn.Module.apply(
      module, tp.cast(dict, unflatten(below)), method=call, mutable=True, rngs=fixed_rngs()
    )
    return out


def _under(key: Key, path: Path) -> bool:
  return key[1 : 1 + len(path)] == path


def _same_values(a: tp.Mapping[Key, Value], b: tp.Mapping[Key, Value]) -> bool:
  return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


Groups = dict[tuple[object, ...], list[int]]
AxisOptions = dict[tuple[Path, str], tuple[int, ...]]
# The target's runs (one per input), the layer axes and the values it ran with.
Run = tuple[list[Ran], dict[tuple[Path, str], int], dict[Key, Value]]
# Per open key: how it was decided and the inputs that ruled the other candidates out.
Decided = dict[tuple[object, ...], tuple[str, tuple[str, ...]]]


def _ruled_out(names: tp.Iterable[str], inputs: tp.Sequence[Input]) -> tuple[str, ...]:
  found = set(names)
  return tuple(i.name for i in inputs if i.name in found)


def decide(pairs: list[Pair], sides: Sides, axis_options: AxisOptions) -> Verdict:
  """Choose every open candidate by running; check the whole conversion; raise if in doubt."""
  refs = sides.run_source()
  groups: Groups = {}
  for i, pair in enumerate(pairs):
    groups.setdefault(pair.key, []).append(i)
  open_keys = [k for k, idx in groups.items() if len(pairs[idx[0]].options) > 1]
  decided_by, narrowed = _by_module(pairs, groups, open_keys, sides, refs)
  # What its own module could not decide, the module around it may, layer by layer.
  agrees = lambda ref, got: agreement(ref, got, sides.tol) is not None  # noqa: E731
  by_enclosing(pairs, groups, open_keys, sides, refs, decided_by, narrowed, agrees)
  open_keys = [k for k in open_keys if k not in decided_by]
  final = _by_model(pairs, groups, open_keys, sides, axis_options, refs, decided_by, narrowed)
  return _final_check(pairs, sides, refs, final, decided_by)


def _by_module(
  pairs: list[Pair],
  groups: Groups,
  open_keys: list[tuple[object, ...]],
  sides: Sides,
  refs: list[Ran],
) -> tuple[Decided, dict[tuple[object, ...], list[int]]]:
  """Open pairs whose modules ran concretely: the target module alone, with each candidate,
  on the inputs the source module saw on every input (deepest modules first). Returns what
  it decided, and for what stays open the candidates that agreed here (the model's runs
  need try only those)."""
  decided_by: Decided = {}
  narrowed: dict[tuple[object, ...], list[int]] = {}
  for key in sorted(open_keys, key=lambda k: -len(sides.target_path(pairs[groups[k][0]]))):
    idx = groups[key]
    pair = pairs[idx[0]]
    records = [ran[1].get(sides.source_path(pair)) for ran in refs]
    if len(idx) != 1 or any(r is None for r in records):
      continue
    target = sides.target_path(pair)
    nearby = [
      p for p in pairs if any(_in(u.path, target) for u in (p.nnx if sides.forward else p.linen))
    ]
    agreeing: list[tuple[int, dict[Key, Value]]] = []
    rejected: list[str] = []
    try:
      for option in range(len(pair.options)):
        pair.chosen = option
        values = {k: v for k, v in sides.convert(nearby, {}).items() if _under(k, target)}
        for given, record in zip(sides.inputs, records):
          record = tp.cast(Record, record)
          if agreement(record.out, sides.apply_target(target, values, record), sides.tol) is None:
            rejected.append(given.name)
            break
        else:
          if not any(_same_values(values, v) for _, v in agreeing):
            agreeing.append((option, values))
    except Exception:  # the module does not run alone on these inputs: the model decides
      agreeing, rejected = [], []
    if not agreeing:
      sides.note_off_sample(sides.source_path(pair), rejected)
    pair.chosen = agreeing[0][0] if len(agreeing) == 1 else 0
    if len(agreeing) == 1:
      decided_by[key] = ("module", _ruled_out(rejected, sides.inputs))
    elif agreeing:
      narrowed[key] = [option for option, _ in agreeing]
      pair.chosen = narrowed[key][0]
  return decided_by, narrowed


def _run_all(sides: Sides, values: dict[Key, Value], refs: list[Ran]) -> tuple[list[Ran], str]:
  """The target on every input, stopping at the first whose output disagrees (named)."""
  runs: list[Ran] = []
  for given, (ref_out, _) in zip(sides.inputs, refs):
    ran = sides.run_target(values, given)
    runs.append(ran)
    if agreement(ref_out, ran[0], sides.tol) is None:
      return runs, given.name
  return runs, ""


def _by_model(
  pairs: list[Pair],
  groups: Groups,
  open_keys: list[tuple[object, ...]],
  sides: Sides,
  axis_options: AxisOptions,
  refs: list[Ran],
  decided_by: Decided,
  narrowed: dict[tuple[object, ...], list[int]],
) -> Run | None:
  """What stays open, on the whole model: every combination of open pairs and layer axes.
  Returns the decisive run (None when nothing was open)."""
  axis_keys = sorted(axis_options)
  choices = [narrowed.get(k, list(range(len(pairs[groups[k][0]].options)))) for k in open_keys]
  choices += [list(range(len(axis_options[k]))) for k in axis_keys]
  total = math.prod(len(c) for c in choices)
  lines = _open_lines(pairs, groups, open_keys, axis_options, axis_keys, choices)
  if total > MAX_MODEL_RUNS and sides.off_sample:  # the probes, not the candidates, disagree
    path, probe = sides.off_sample[0]
    message = probes_only_message(_source_name(sides), 0, 0, [probe], module=_name(path))
    raise CheckpointError(message)
  if total > MAX_MODEL_RUNS:
    raise CheckpointError(
      f"{total} combinations of candidates stay open after checking each module alone, more "
      f"than the {MAX_MODEL_RUNS} the converter runs the model on:\n{lines}\nFix: pass "
      "rules=[...] or mapping= entries for these (each line lists its first candidates, "
      "ready to paste; check them against your port)."
    )
  if total == 1:
    for key, (option,) in zip(open_keys, choices):
      for i in groups[key]:
        pairs[i].chosen = option
    return None
  agreeing: list[tuple[tuple[int, ...], dict[Key, Value], Run]] = []
  rejected: list[str] = []
  for combo in itertools.product(*choices):
    for key, option in zip(open_keys, combo):
      for i in groups[key]:
        pairs[i].chosen = option
    axes = {k: axis_options[k][o] for k, o in zip(axis_keys, combo[len(open_keys) :])}
    values = sides.convert(pairs, axes)
    runs, failed = _run_all(sides, values, refs)
    if failed:
      rejected.append(failed)
    elif not any(_same_values(values, v) for _, v, _ in agreeing):
      agreeing.append((combo, values, (runs, axes, values)))
  names = ", ".join(i.name for i in sides.inputs)
  if (not agreeing or len(agreeing) > 1) and not sides.prove:
    # Loading for checking: the first agreeing combination, else the first of each choice.
    combo = agreeing[0][0] if agreeing else tuple(c[0] for c in choices)
    for key, option in zip(open_keys, combo):
      for i in groups[key]:
        pairs[i].chosen = option
      decided_by[key] = ("unproven", ())
    axes = {k: axis_options[k][o] for k, o in zip(axis_keys, combo[len(open_keys) :])}
    values = sides.convert(pairs, axes)
    return _run_all(sides, values, refs)[0], axes, values
  on_probes = [i for name in rejected for i in sides.inputs if i.name == name != SAMPLE]
  if not agreeing and on_probes:
    source = _source_name(sides)
    detail = f"The open choices:\n{lines}\n"
    raise CheckpointError(probes_only_message(source, len(on_probes), total, on_probes, detail))
  if not agreeing:
    raise CheckpointError(
      f"no candidate conversion reproduces the {_source_name(sides)} model's output on the "
      f"inputs ({names}; {total} tried). The open choices:\n{lines}\nFix: check that the "
      f"port computes what the Linen model computes (lb.compare), then pass rules=[...] or "
      f"mapping= for the leaves it stores otherwise. {RNG_HELP}"
    )
  if len(agreeing) > 1:
    found = _open_lines(
      pairs,
      groups,
      open_keys,
      axis_options,
      axis_keys,
      [sorted(set(c)) for c in zip(*(a[0] for a in agreeing))],
    )
    raise CheckpointError(ambiguous_message(len(agreeing), _source_name(sides), names, found))
  combo, _, run = agreeing[0]
  for key, option in zip(open_keys, combo):
    for i in groups[key]:
      pairs[i].chosen = option
    decided_by[key] = ("model", _ruled_out(rejected, sides.inputs))
  return run


def ambiguous_message(count: int, source: str, inputs: str, lines: str) -> str:
  """The error of several candidates agreeing on every input."""
  return (
    f"{count} different conversions reproduce the {source} model's output on every input "
    f"({inputs}), so the evidence cannot tell them apart:\n{lines}\nFix: pass the intended "
    "one as rules=[...] or mapping= (ready to paste above), or sample arguments that "
    "exercise every layer (e.g. more than one token, rows that differ)."
  )


def _final_check(
  pairs: list[Pair],
  sides: Sides,
  refs: list[Ran],
  final: Run | None,
  decided_by: Decided,
) -> Verdict:
  """The kept conversion against the source on every input: the model's output, and each
  pair's own call."""
  if final is None:
    axes: dict[tuple[Path, str], int] = {}
    values = sides.convert(pairs, axes)
    runs, failed = _run_all(sides, values, refs)
  else:
    runs, axes, values = final
    failed = next(
      (
        given.name
        for given, ref, ran in zip(sides.inputs, refs, runs)
        if agreement(ref[0], ran[0], sides.tol) is None
      ),
      "",
    )
  errors = [agreement(ref[0], ran[0], sides.tol) for ref, ran in zip(refs, runs)]
  output_error = None if failed else max(tp.cast(list[float], errors))
  checks: list[Check] = []
  differs: list[int] = []  # the pairs whose own calls differ on some input
  for index, pair in enumerate(pairs):
    err: float | None = 0.0
    for ref_run, ran in zip(refs, runs):
      ref = ref_run[1].get(sides.source_path(pair))
      got = ran[1].get(sides.target_path(pair))
      one = None if ref is None or got is None else agreement(ref.out, got.out, sides.tol)
      if ref is not None and got is not None and one is None and index not in differs:
        differs.append(index)
      err = None if one is None or err is None else max(err, one)
    if len(runs) < len(refs):
      err = None
    n = len(pair.options)
    how, probes = decided_by.get(pair.key, ("unique", ()))
    checks.append(
      Check(
        how if n > 1 else "unique",
        n,
        "module" if err is not None else "model",
        err if err is not None else (output_error if output_error is not None else math.inf),
        probes if n > 1 else (),
      )
    )
  first_bad = _first_differing(pairs, differs, sides)
  if output_error is None and not sides.prove:
    where = (
      None if first_bad is None else (sides.source_path(first_bad), sides.target_path(first_bad))
    )
    return Verdict(checks, dict(axes), math.inf, values, where)
  if output_error is None:
    where = (
      f" The first module pair whose outputs differ: Linen `{_name(first_bad.linen_at)}` "
      f"and NNX `{_name(first_bad.nnx_at)}` (paired by {first_bad.how})."
      if first_bad is not None
      else ""
    )
    given = next(i for i in sides.inputs if i.name == (failed or SAMPLE))
    if given.name != SAMPLE:
      raise OutputMismatch(probes_only_message(_source_name(sides), 1, 1, [given], where))
    raise OutputMismatch(
      f"the converted {'port' if sides.forward else 'Linen model'} does not reproduce the "
      f"{_source_name(sides)} model's output on the sample arguments.{where} Fix: check the "
      "port with lb.compare; if it stores arrays otherwise (split, fused, reshaped, "
      "transposed, renamed), pass rules=[...]; if modules pair wrongly, pass mapping=. "
      + (LOAD_ANYWAY if sides.forward else "")
      + RNG_HELP
    )
  return Verdict(checks, dict(axes), output_error, values)


def _first_differing(pairs: list[Pair], differs: list[int], sides: Sides) -> Pair | None:
  """The pair whose module computes otherwise first: among the differing pairs (in the order
  modules are entered), the first with no differing module inside it. An enclosing module
  (the root, most of all) differs whenever anything inside it does, so it is named only when
  nothing inside it differs; this is the first differing call in the order calls return, as
  lb.compare reports them."""
  paths = {i: sides.source_path(pairs[i]) for i in differs}
  for i in differs:
    path = paths[i]
    if not any(len(p) > len(path) and p[: len(path)] == path for p in paths.values()):
      return pairs[i]
  return None


def _name(path: Path) -> str:
  return "/".join(path) or "<root>"


def _in(path: Path, prefix: Path) -> bool:
  return path[: len(prefix)] == prefix


def _source_name(sides: Sides) -> str:
  return "Linen" if sides.forward else "NNX"


# The most candidates an error lists for one open choice, each a mapping= to paste: the 120
# assignments among 5 modules would bury the fix.
LISTED_CANDIDATES = 3


def _open_lines(
  pairs: tp.Sequence[Pair],
  groups: tp.Mapping[tuple[object, ...], list[int]],
  open_keys: tp.Sequence[tuple[object, ...]],
  axis_options: tp.Mapping[tuple[Path, str], tuple[int, ...]],
  axis_keys: tp.Sequence[tuple[Path, str]],
  choices: tp.Sequence[tp.Sequence[int]] | None = None,
) -> str:
  """The open choices, each candidate as the rules or mapping that declare it."""
  lines = []
  for n, key in enumerate(open_keys):
    pair = pairs[groups[key][0]]
    lines.append(f"  Linen `{_name(pair.linen_at)}` -> NNX `{_name(pair.nnx_at)}`:")
    options = list(range(len(pair.options)) if choices is None else choices[n])
    if len(options) > LISTED_CANDIDATES:  # an assignment among 5 modules has 120
      lines.append(f"    ({len(options)} candidates; the first {LISTED_CANDIDATES}:)")
    for option in options[:LISTED_CANDIDATES]:
      mapping = unit_mapping(pair, option)
      if mapping is not None:
        lines.append(f"    candidate {option + 1}: mapping={mapping!r}")
        continue
      rules = ", ".join(str(m.rule) for m in pair.options[option])
      lines.append(f"    candidate {option + 1}: rules=[{rules}]")
  for n, (stack, col) in enumerate(axis_keys):
    fitting = list(axis_options[(stack, col)])
    if choices is not None:
      fitting = [fitting[o] for o in choices[len(open_keys) + n]]
    lines.append(
      f"  Linen stack `{'/'.join(stack)}` stores `{col}` along one of the axes "
      f"{fitting} (its depth equals a width)"
    )
  return "\n".join(lines)
