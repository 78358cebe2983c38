"""`lb.compare`: where a ported model first diverges from its original, module call by call.

Both models run eagerly on the same inputs while every module call's output is recorded in
call order. A call is recorded when it returns, so a block comes after the layers inside it and
the first recorded difference is the innermost module whose output changed.

* Linen modules are recorded through `flax.linen.intercept_methods`, Flax's own method hook:
  active only for the duration of one run and only on the calling thread, chained to any
  interceptor the user installed.
* NNX modules are recorded on a copy of the model (`_compat.clone_graph`) whose module
  instances each get a recording subclass of their own class (`obj.__class__ = ...`). No
  function or class attribute is replaced for the process; the user's model, its Variables
  and its classes are untouched. A bridged Linen part inside an NNX model (a `ToNNX`
  submodule) is recorded through the same Linen hook, under the bridge's path.

The recorder travels in a ContextVar, so compares in other threads never see it. Calls made
inside a JAX transform (`nn.scan`, `nn.remat`, `nnx.scan`, ...) return tracers, not values:
they are listed as not recorded, and their enclosing module's output is still compared.

Alignment pairs the two call lists: first a user mapping, then equal paths (an NNX list path
`layers/0` also matches Linen's `layers_0`), then the remaining calls in order where their
output shapes agree (a weighted longest common subsequence), and last, calls left over
between two aligned pairs in equal numbers, in order (these differ in shape). Outputs are
compared leaf by leaf: `|candidate - reference| <= atol + rtol * |reference|`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import math
import typing as tp

import flax.linen as nn
import jax
import jax.core
import numpy as np
from flax import nnx
from flax.nnx import bridge
from flax.nnx.bridge import variables as bridge_variables

from .. import _compat
from .._core import linen_vars
from .._core.errors import CompareError

# Per-pair and per-leaf statuses, mildest first (a pair takes the worst of its leaves).
OK, DTYPE, VALUES, SHAPE, STRUCTURE = "ok", "dtype", "values", "shape", "structure"
_SEVERITY = {OK: 0, DTYPE: 1, VALUES: 2, SHAPE: 3, STRUCTURE: 4}

# How a pair was aligned.
BY_MAPPING, BY_NAME, BY_ORDER, BY_POSITION = "mapping", "name", "order", "position"

# Default (rtol, atol) per floating dtype size in bytes: two implementations of the same math
# differ by a few ulps of the reassociated sums; a porting bug is far above that.
_FLOAT_TOLERANCES = {1: (1e-1, 1e-1), 2: (1e-2, 1e-2), 4: (1e-5, 1e-5), 8: (1e-9, 1e-9)}
_BFLOAT16_TOLERANCES = (1e-2, 1e-2)
_FLOAT16_TOLERANCES = (1e-3, 1e-3)

_MAX_LISTED = 12  # calls listed in an error message before "... and N more"

# Among calls with equal output shapes, order alignment prefers pairs whose outputs also agree
# on a sample of values (loosely: a tie-break, not the comparison).
_SAMPLE_SIZE = 32
_SAMPLE_RTOL, _SAMPLE_ATOL = 1e-3, 1e-3
# Linen layers whose NNX counterpart has another class name (a weaker tie-break than values).
_SAME_LAYER = {
  "Dense": "Linear",
  "DenseGeneral": "LinearGeneral",
  "MultiHeadDotProductAttention": "MultiHeadAttention",
  "SelfAttention": "MultiHeadAttention",
  "MultiHeadAttention": "MultiHeadAttention",
}

_RECORDER: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar(
  "loopbridge_compare_recorder", default=None
)


# ----------------------------------------------------------------------------- the report
@dataclasses.dataclass(frozen=True)
class LeafDiff:
  """One leaf of a call's output pytree, compared."""

  leaf: str  # the leaf's key path inside the output ('' for a single array)
  reference: str  # dtype[shape], e.g. 'float32[2,16]'
  candidate: str
  status: str  # ok | dtype | values | shape
  max_abs_err: float | None = None
  max_rel_err: float | None = None


@dataclasses.dataclass(frozen=True)
class CallPair:
  """A reference call and the candidate call it was aligned with, compared."""

  reference_path: str  # '/'-joined module path; '' is the top-level module
  candidate_path: str
  reference_call: int  # position in the reference's call order, from 0
  candidate_call: int
  aligned_by: str  # mapping | name | order | position
  status: str  # ok | dtype | values | shape | structure
  max_abs_err: float | None
  max_rel_err: float | None
  leaves: tuple[LeafDiff, ...]
  note: str = ""  # for a structure mismatch: how the output trees differ

  @property
  def output(self) -> str:
    """The reference output, as `dtype[shape]` for one array or a count of leaves."""
    if len(self.leaves) == 1:
      return self.leaves[0].reference
    return f"{len(self.leaves)} leaves" if self.leaves else "-"

  @property
  def worst_leaf(self) -> LeafDiff | None:
    """The first leaf with the pair's status (None when the pair is ok or has no leaves)."""
    return next((d for d in self.leaves if d.status == self.status and d.status != OK), None)


@dataclasses.dataclass(frozen=True)
class Divergence:
  """The first reference call (in call order) whose aligned candidate output differs."""

  reference_path: str
  candidate_path: str
  kind: str  # values | dtype | shape | structure
  max_abs_err: float | None
  max_rel_err: float | None
  leaf: str  # the first differing leaf of the output ('' for a single array)
  reference: str  # dtype[shape] of that leaf on each side
  candidate: str


@dataclasses.dataclass(frozen=True)
class UnmatchedCall:
  """A call that has no counterpart on the other side."""

  path: str
  call: int
  output: str


@dataclasses.dataclass(frozen=True)
class ParityReport:
  """Where a candidate model's module outputs agree with a reference model's, call by call.

  `str(report)` is a table of every aligned pair in reference call order with the first
  divergence marked; `report.to_dict()` is the same as JSON-ready data.

  Attributes:
    pairs: every aligned pair, in reference call order (`CallPair`: paths, how they were
      aligned, status, max abs/rel errors, per-leaf details).
    unmatched_reference: reference calls with no candidate counterpart (`UnmatchedCall`).
    unmatched_candidate: candidate calls with no reference counterpart.
    not_recorded_reference: paths of reference calls made inside a JAX transform (their
      outputs are tracers); their enclosing module's output is compared instead.
    not_recorded_candidate: the same for the candidate.
    rtol: the relative tolerance given, or None for the per-dtype default.
    atol: the absolute tolerance given, or None for the per-dtype default.

  Examples:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from flax import nnx
    >>> import loopbridge as lb
    >>> linen = nn.Dense(3)
    >>> x = jnp.ones((1, 2))
    >>> variables = linen.init(jax.random.key(0), x)
    >>> port = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    >>> _ = lb.layers.load_params([variables['params']], [port])  # load Linen params by path
    >>> report = lb.compare((linen, variables), port, x)
    >>> report.ok, report.first_divergence
    (True, None)
  """

  pairs: tuple[CallPair, ...]
  unmatched_reference: tuple[UnmatchedCall, ...]
  unmatched_candidate: tuple[UnmatchedCall, ...]
  not_recorded_reference: tuple[str, ...]
  not_recorded_candidate: tuple[str, ...]
  rtol: float | None
  atol: float | None

  @property
  def ok(self) -> bool:
    """True when every aligned pair agrees (values within tolerance, same shapes and dtypes)."""
    return all(p.status == OK for p in self.pairs)

  @property
  def first_divergence(self) -> Divergence | None:
    """The first reference call in call order whose candidate output differs, or None."""
    for pair in self.pairs:
      if pair.status == OK:
        continue
      leaf = pair.worst_leaf
      return Divergence(
        reference_path=pair.reference_path,
        candidate_path=pair.candidate_path,
        kind=pair.status,
        max_abs_err=pair.max_abs_err,
        max_rel_err=pair.max_rel_err,
        leaf=leaf.leaf if leaf else "",
        reference=leaf.reference if leaf else pair.note,
        candidate=leaf.candidate if leaf else "",
      )
    return None

  @property
  def mismatches(self) -> tuple[CallPair, ...]:
    """Pairs whose outputs differ in shape, dtype or tree structure (not only in values)."""
    return tuple(
      p
      for p in self.pairs
      if p.status == STRUCTURE or any(d.reference != d.candidate for d in p.leaves)
    )

  def to_dict(self) -> dict[str, tp.Any]:
    """Everything in the report as JSON-ready data (non-finite errors as strings)."""
    divergence = self.first_divergence
    return _json_ready(
      {
        "ok": self.ok,
        "rtol": self.rtol,
        "atol": self.atol,
        "first_divergence": None if divergence is None else dataclasses.asdict(divergence),
        "pairs": [dataclasses.asdict(p) for p in self.pairs],
        "unmatched_reference": [dataclasses.asdict(c) for c in self.unmatched_reference],
        "unmatched_candidate": [dataclasses.asdict(c) for c in self.unmatched_candidate],
        "not_recorded_reference": list(self.not_recorded_reference),
        "not_recorded_candidate": list(self.not_recorded_candidate),
      }
    )

  def __str__(self) -> str:
    return _render(self)


def _json_ready(value: tp.Any) -> tp.Any:
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  if isinstance(value, dict):
    return {k: _json_ready(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_ready(v) for v in value]
  return value


def _err(value: float | None) -> str:
  if value is None:
    return "-"
  return "0" if value == 0 else f"{value:.2e}"


def _shown(path: str) -> str:
  return path if path else "(top)"


_KIND_TEXT = {
  VALUES: "values differ",
  DTYPE: "dtypes differ (values agree)",
  SHAPE: "output shapes differ",
  STRUCTURE: "output trees differ",
}


def _render(report: ParityReport) -> str:
  from .sow_sites import format_table

  out = []
  divergence = report.first_divergence
  n = len(report.pairs)
  if divergence is None:
    out.append(f"lb.compare: OK, all {n} aligned module calls agree")
  else:
    where = (
      f"reference {_shown(divergence.reference_path)} ~ candidate "
      f"{_shown(divergence.candidate_path)}"
    )
    leaf = f" at leaf {divergence.leaf}" if divergence.leaf else ""
    detail = ""
    if divergence.kind in (VALUES, DTYPE):
      detail = (
        f", max abs err {_err(divergence.max_abs_err)}, max rel err {_err(divergence.max_rel_err)}"
      )
    if divergence.kind in (SHAPE, DTYPE):
      detail += f" ({divergence.reference} vs {divergence.candidate})"
    if divergence.kind == STRUCTURE:
      detail += f" ({divergence.reference})"
    out.append(
      f"lb.compare: DIVERGES, first at {where}: {_KIND_TEXT[divergence.kind]}{leaf}{detail}"
    )
  if report.atol == math.inf:
    out.append(
      "tolerance: atol inf, so values are not compared: only the module structure, output "
      "shapes and dtypes (the errors below are shown for information)"
    )
  elif report.rtol is None and report.atol is None:
    out.append(
      "tolerance: |candidate - reference| <= atol + rtol * |reference|, per dtype "
      "(float32: rtol 1e-05, atol 1e-05; bfloat16: 1e-02; integers exact)"
    )
  else:
    out.append(
      f"tolerance: |candidate - reference| <= atol + rtol * |reference|, rtol "
      f"{report.rtol if report.rtol is not None else 'per dtype'}, atol "
      f"{report.atol if report.atol is not None else 'per dtype'}"
    )
  rows = []
  first_marked = False
  for pair in report.pairs:
    mark = ""
    status = pair.status.upper() if pair.status != OK else OK
    if pair.status != OK:
      leaf = pair.worst_leaf
      if leaf is not None and leaf.leaf:
        status += f" at {leaf.leaf}"
      if not first_marked:
        mark, first_marked = ">>", True
        status += "  <- first divergence"
    rows.append(
      (
        mark,
        str(pair.reference_call),
        _shown(pair.reference_path),
        _shown(pair.candidate_path),
        pair.aligned_by,
        pair.output,
        _err(pair.max_abs_err),
        _err(pair.max_rel_err),
        status,
      )
    )
  out.append("")
  out.append(
    format_table(
      (
        "",
        "#",
        "reference",
        "candidate",
        "aligned by",
        "output",
        "max abs err",
        "max rel err",
        "status",
      ),
      rows,
      indent="",
    )
  )
  mismatches = report.mismatches
  if mismatches:
    out.append("")
    out.append("shape/dtype mismatches:")
    for pair in mismatches:
      if pair.status == STRUCTURE:
        out.append(f"  {_shown(pair.reference_path)} ~ {_shown(pair.candidate_path)}: {pair.note}")
        continue
      for leaf in pair.leaves:
        if leaf.reference != leaf.candidate:
          at = f" {leaf.leaf}" if leaf.leaf else ""
          out.append(
            f"  {_shown(pair.reference_path)}{at}: {leaf.reference} vs "
            f"{_shown(pair.candidate_path)}{at}: {leaf.candidate}"
          )
  for title, calls in (
    ("reference calls with no candidate counterpart", report.unmatched_reference),
    ("candidate calls with no reference counterpart", report.unmatched_candidate),
  ):
    if calls:
      out.append("")
      out.append(f"{title}:")
      out.extend(f"  #{c.call} {_shown(c.path)}  {c.output}" for c in calls)
  for side, paths in (
    ("reference", report.not_recorded_reference),
    ("candidate", report.not_recorded_candidate),
  ):
    if paths:
      unique = list(dict.fromkeys(paths))
      out.append("")
      out.append(
        f"not recorded in the {side} (called inside a JAX transform such as nn.scan, "
        "nn.remat or nnx.scan; compared through the enclosing module): "
        + ", ".join(_shown(p) for p in unique)
      )
  if divergence is not None and divergence.kind == VALUES:
    out.append("")
    out.append(
      f"Every aligned call before it agrees: look at {_shown(divergence.candidate_path)}"
      " and at what runs between the previous call and it (activations, residuals, "
      "parameters loaded into it)."
    )
  if report.unmatched_reference or report.unmatched_candidate:
    out.append("")
    out.append(
      "Unmatched calls are compared only through the modules around them; to pair "
      "them, pass mapping={reference_path: candidate_path}."
    )
  return "\n".join(out)


# ----------------------------------------------------------------------------- recording
@dataclasses.dataclass
class _Call:
  path: str  # display path: '/'-joined, '' for the top level
  key: str  # the same with list indices written Linen-style: layers/0 -> layers_0
  output: tp.Any
  index: int = 0  # position in this side's call order
  leaves: list[tuple[str, tp.Any]] = dataclasses.field(default_factory=list)
  signature: tuple[tuple[int, ...], ...] = ()
  # A few values at fixed positions (alignment tie-break); `_prepare` fills it.
  sample: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
  kind: str = ""  # the module's class name, Linen names mapped to their NNX counterparts


def _join(*parts: str) -> str:
  return "/".join(p for p in parts if p)


def path_strings(path: tp.Sequence[tp.Any]) -> tuple[str, str]:
  """(display path, Linen-style match key) of an NNX graph path."""
  shown, key = [], []
  for part in path:
    shown.append(str(part))
    if isinstance(part, int) and key:
      key[-1] = f"{key[-1]}_{part}"
    else:
      key.append(str(part))
  return "/".join(shown), "/".join(key)


def _has_tracer(tree: tp.Any) -> bool:
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree))


class _Recorder:
  """The module calls of one run, in the order they return."""

  def __init__(self, nnx_paths: dict[int, tuple[str, str]]):
    self.calls: list[_Call] = []
    self.not_recorded: list[str] = []
    self._nnx_paths = nnx_paths
    self._stack: list[tuple[str, str]] = []  # NNX modules being called, innermost last

  def add(self, path: str, key: str, output: tp.Any, module: tp.Any) -> None:
    if _has_tracer(output):
      self.not_recorded.append(path)
    else:
      name = type(module).__name__
      self.calls.append(_Call(path, key, output, kind=_SAME_LAYER.get(name, name)))

  def enter(self, module: tp.Any) -> tuple[str, str]:
    where = self._nnx_paths.get(id(module))
    if where is None:  # a module built during the call (e.g. by a transform): no graph path
      name = f"<{type(module).__name__}>"
      where = (name, name)
    self._stack.append(where)
    return where

  def exit(self) -> None:
    self._stack.pop()

  def linen_call(self, module: nn.Module, output: tp.Any) -> None:
    names = tuple(module.scope.path) if module.scope is not None else ()
    if not names and self._stack:
      return  # a bridge's top-level Linen call: recorded as the bridge module's own call
    shown, key = self._stack[-1] if self._stack else ("", "")
    self.add(_join(shown, *names), _join(key, *names), output, module)


def _linen_interceptor(next_fun, args, kwargs, context):
  output = next_fun(*args, **kwargs)
  recorder = _RECORDER.get()
  if recorder is not None and context.method_name == "__call__":
    recorder.linen_call(context.module, output)
  return output


# One recording subclass per user class, made on first use: a new class, so nothing the user
# or flax defined is modified; cached so repeated compares do not register new graph types.
_RECORDING_TYPES: dict[type, type] = {}


def _defines_call(cls: type) -> bool:
  return any("__call__" in vars(base) for base in cls.__mro__ if base is not object)


def _recording_type(cls: type) -> type:
  if cls in _RECORDING_TYPES:
    return _RECORDING_TYPES[cls]

  def __call__(self, *args, **kwargs):
    recorder = _RECORDER.get()
    if recorder is None:  # the copy escaped the compare (it never should): behave as cls
      return cls.__call__(self, *args, **kwargs)
    where = recorder.enter(self)
    try:
      output = cls.__call__(self, *args, **kwargs)
    finally:
      recorder.exit()
    recorder.add(*where, output, self)
    return output

  namespace = {
    "__call__": __call__,
    "__slots__": (),
    "__module__": cls.__module__,
    "__qualname__": cls.__qualname__,
    "__doc__": cls.__doc__,
  }
  # flax 0.12 Pytrees take `pytree=` at subclassing; keep the user's choice.
  options = _compat.subclass_options(cls)
  recording = type(cls)(cls.__name__, (cls,), namespace, **options)
  _RECORDING_TYPES[cls] = recording
  return recording


def _instrumented_copy(model: nnx.Module) -> tuple[nnx.Module, dict[int, tuple[str, str]]]:
  """A copy of `model` whose callable modules record their calls, and each module's path."""
  copy = _compat.clone_graph(model)
  paths: dict[int, tuple[str, str]] = {}
  for path, node in _compat.iter_graph(copy):
    if isinstance(node, nnx.Module) and id(node) not in paths:
      paths[id(node)] = path_strings(path)
      if _defines_call(type(node)):
        object.__setattr__(node, "__class__", _recording_type(type(node)))
  return copy, paths


def bridged_linen(model: bridge.ToNNX) -> tuple[nn.Module, dict[str, tp.Any]]:
  """The Linen module a bridge wraps and its variables as a Linen variables dict."""
  return _compat.linen_module_of(model), bridge_variables.nnx_attrs_to_linen_vars(
    linen_vars.attrs(model)
  )


_LINEN, _NNX = "linen", "nnx"

_KINDS_HELP = (
  "a Linen module with its variables as `(module, variables)` (e.g. "
  "`(module, module.init(key, *args))`), an initialized `lb.ToNNX`, or an NNX module"
)


def _describe(obj: tp.Any) -> str:
  if isinstance(obj, type):
    return f"the class {obj.__name__}"
  if isinstance(obj, tuple):
    return f"a tuple of {len(obj)} ({', '.join(type(o).__name__ for o in obj)})"
  return f"a {type(obj).__name__}"


def _subject(obj: tp.Any, role: str) -> tuple[str, tp.Any]:
  """('linen', (module, variables)) or ('nnx', module); CompareError for anything else."""
  if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], nn.Module):
    module, variables = obj
    if not isinstance(variables, tp.Mapping):
      raise CompareError(
        f"lb.compare: the {role} is (Linen module, {type(variables).__name__}), but the "
        "second item must be the module's variables, a dict like `module.init(key, *args)` "
        "returns ({'params': ...})."
      )
    return _LINEN, (module, dict(variables))
  if isinstance(obj, bridge.ToNNX):
    return _LINEN, bridged_linen(obj)
  if isinstance(obj, nnx.Module):
    return _NNX, obj
  if isinstance(obj, nn.Module):
    raise CompareError(
      f"lb.compare: the {role} is a Linen module without its variables, so it cannot run. "
      f"Pass `({type(obj).__name__}(...), variables)` with the variables from "
      "`module.init(key, *args)` or a checkpoint, or an initialized lb.ToNNX."
    )
  if isinstance(obj, type) and issubclass(obj, (nn.Module, nnx.Module)):
    raise CompareError(
      f"lb.compare: the {role} is {_describe(obj)}, not a model: build an instance (and "
      f"initialize it). The {role} must be {_KINDS_HELP}."
    )
  raise CompareError(f"lb.compare: the {role} is {_describe(obj)}; it must be {_KINDS_HELP}.")


def _record(role: str, kind: str, subject: tp.Any, args: tuple, kwargs: dict) -> _Recorder:
  """Run one side on the inputs and return its recorded calls."""
  if kind == _LINEN:
    module, variables = subject
    # Sows and captured values from earlier calls (a stock bridge keeps them) would be
    # appended to, not replaced; no run needs them.
    variables = {k: v for k, v in variables.items() if k != "intermediates"}
    # Every collection but params is mutable (batch statistics, caches, sows update as the
    # model wants); params stay immutable so a missing one is an error, not a fresh init.
    mutable = sorted((set(variables) - {"params"}) | {"intermediates"})
    recorder = _Recorder({})

    def run():
      return module.apply(variables, *args, mutable=mutable, **kwargs)
  else:
    copy, paths = _instrumented_copy(subject)
    recorder = _Recorder(paths)

    def run():
      return copy(*args, **kwargs)

  token = _RECORDER.set(recorder)
  try:
    with nn.intercept_methods(_linen_interceptor):
      run()
  except Exception as e:
    hint = ""
    if kind == _LINEN and not subject[1]:
      hint = (
        " It has no variables: initialize an lb.ToNNX with lb.lazy_init(model, *args) "
        "(or pass (module, module.init(key, *args)))."
      )
    elif kind == _LINEN and "params" not in subject[1]:
      hint = (
        f" Its variables have no 'params' collection (keys: {sorted(subject[1])}): pass "
        "the whole dict `module.init` returns, {'params': ...}, not the params alone."
      )
    raise CompareError(
      f"lb.compare: running the {role} on the given inputs failed: {type(e).__name__}: "
      f"{_first_line(e).rstrip('.')}.{hint} Both models are called with the same *args and "
      "**kwargs; check that the inputs fit both."
    ) from e
  finally:
    _RECORDER.reset(token)
  return recorder


def _first_line(error: BaseException, limit: int = 400) -> str:
  lines = str(error).strip().splitlines()
  line = lines[0] if lines else ""
  return line if len(line) <= limit else line[: limit - 3] + "..."


# ----------------------------------------------------------------------------- comparing
def _as_numpy(leaf: tp.Any) -> np.ndarray:
  if hasattr(leaf, "dtype") and jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  return np.asarray(leaf)


def _desc(array: np.ndarray) -> str:
  return f"{array.dtype}[{','.join(map(str, array.shape))}]"


def _is_float(dtype: np.dtype) -> bool:
  # bfloat16 and the float8 types come from ml_dtypes with kind 'V'; their names say it.
  return dtype.kind in "fc" or dtype.name.startswith(("float", "bfloat"))


def _numeric(array: np.ndarray) -> bool:
  return (
    array.dtype.kind in "biu"
    or _is_float(array.dtype)
    or (array.dtype.name.startswith(("int", "uint")))
  )


def _default_tolerance(dtype: np.dtype) -> tuple[float, float]:
  if not _is_float(dtype):
    return (0.0, 0.0)  # integers and bools: exact
  if dtype.name == "bfloat16":
    return _BFLOAT16_TOLERANCES
  if dtype.name == "float16":
    return _FLOAT16_TOLERANCES
  size = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
  return _FLOAT_TOLERANCES.get(size, _FLOAT_TOLERANCES[1])


def _leaf_diff(
  leaf: str, ref: tp.Any, cand: tp.Any, rtol: float | None, atol: float | None
) -> LeafDiff:
  a, b = _as_numpy(ref), _as_numpy(cand)
  da, db = _desc(a), _desc(b)
  if a.shape != b.shape:
    return LeafDiff(leaf, da, db, SHAPE)
  if not (_numeric(a) and _numeric(b)):
    same = bool(np.all(a == b))
    return LeafDiff(
      leaf, da, db, OK if same and a.dtype == b.dtype else (DTYPE if same else VALUES)
    )
  (rt_a, at_a), (rt_b, at_b) = _default_tolerance(a.dtype), _default_tolerance(b.dtype)
  rt = rtol if rtol is not None else max(rt_a, rt_b)
  at = atol if atol is not None else max(at_a, at_b)
  wide = np.complex128 if "c" in (a.dtype.kind, b.dtype.kind) else np.float64
  x, y = a.astype(wide), b.astype(wide)
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    same = (x == y) | (np.isnan(x) & np.isnan(y))  # equal infinities and NaN where NaN
    diff = np.where(same, 0.0, np.abs(y - x))
    diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
    scale = np.abs(x)
    rel = np.where(
      scale > 0, diff / np.where(scale > 0, scale, 1.0), np.where(diff > 0, np.inf, 0.0)
    )
    # `same` first: NaN in the same places is equal, though NaN fails every `<=`. An infinite
    # atol compares no values at all (structure, shapes and dtypes only).
    within = at == math.inf or bool(np.all(same | (diff <= at + rt * scale)))
  max_abs = float(diff.max()) if diff.size else 0.0
  max_rel = float(rel.max()) if rel.size else 0.0
  if not within:
    status = VALUES
  else:
    status = OK if a.dtype == b.dtype else DTYPE
  return LeafDiff(leaf, da, db, status, max_abs, max_rel)


def _compare_pair(
  ref: _Call, cand: _Call, aligned_by: str, rtol: float | None, atol: float | None
) -> CallPair:
  common: dict[str, tp.Any] = dict(
    reference_path=ref.path,
    candidate_path=cand.path,
    reference_call=ref.index,
    candidate_call=cand.index,
    aligned_by=aligned_by,
  )
  if len(ref.leaves) != len(cand.leaves):
    note = (
      f"the reference returns {len(ref.leaves)} array(s), the candidate "
      f"{len(cand.leaves)}: {_tree_text(ref.output)} vs {_tree_text(cand.output)}"
    )
    return CallPair(
      **common, status=STRUCTURE, max_abs_err=None, max_rel_err=None, leaves=(), note=note
    )
  leaves = tuple(
    _leaf_diff(name, a, b, rtol, atol) for (name, a), (_, b) in zip(ref.leaves, cand.leaves)
  )
  status = max((d.status for d in leaves), key=_SEVERITY.__getitem__, default=OK)
  errors_abs = [d.max_abs_err for d in leaves if d.max_abs_err is not None]
  errors_rel = [d.max_rel_err for d in leaves if d.max_rel_err is not None]
  return CallPair(
    **common,
    status=status,
    max_abs_err=max(errors_abs, default=None),
    max_rel_err=max(errors_rel, default=None),
    leaves=leaves,
  )


def _tree_text(tree: tp.Any, limit: int = 120) -> str:
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  text = (
    ", ".join(f"{jax.tree_util.keystr(k) or 'out'}: {_desc(_as_numpy(v))}" for k, v in leaves)
    or "no arrays"
  )
  return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------- aligning
def _prepare(calls: list[_Call]) -> None:
  for index, call in enumerate(calls):
    call.index = index
    call.leaves = [
      (jax.tree_util.keystr(k), v) for k, v in jax.tree_util.tree_leaves_with_path(call.output)
    ]
    call.signature = tuple(tuple(np.shape(v)) for _, v in call.leaves)
    call.sample = _sample(call.leaves)


def _sample(leaves: list[tuple[str, tp.Any]]) -> np.ndarray:
  """Up to `_SAMPLE_SIZE` values per leaf at evenly spaced positions (same shapes, same places)."""
  parts = []
  for _, leaf in leaves:
    array = _as_numpy(leaf)
    if not _numeric(array) or array.dtype.kind == "c" or array.size == 0:
      continue
    flat = array.reshape(-1)
    positions = np.linspace(0, flat.size - 1, min(_SAMPLE_SIZE, flat.size)).astype(np.int64)
    parts.append(flat[positions].astype(np.float64))
  return np.concatenate(parts) if parts else np.zeros(0)


def _call_list(calls: tp.Sequence[_Call]) -> str:
  shown = [f"{_shown(c.path)} {_tree_text(c.output, 60)}" for c in calls[:_MAX_LISTED]]
  more = f", ... and {len(calls) - _MAX_LISTED} more" if len(calls) > _MAX_LISTED else ""
  return "; ".join(shown) + more if shown else "none"


def _forced_partners(
  ref: list[_Call], cand: list[_Call], mapping: tp.Mapping[str, str | None] | None
) -> tuple[dict[int, tuple[int, str]], set[int], set[int]]:
  """Pairs fixed by the mapping and by equal paths; reference and candidate calls mapped away."""
  by_path_r: dict[str, list[int]] = {}
  by_path_c: dict[str, list[int]] = {}
  by_key_c: dict[str, list[int]] = {}
  for c in ref:
    by_path_r.setdefault(c.path, []).append(c.index)
  for c in cand:
    by_path_c.setdefault(c.path, []).append(c.index)
    by_key_c.setdefault(c.key, []).append(c.index)
  partners: dict[int, tuple[int, str]] = {}
  excluded_r: set[int] = set()
  claimed_c: set[int] = set()
  mapping = dict(mapping or {})
  for ref_path, cand_path in mapping.items():
    if not isinstance(ref_path, str) or not (cand_path is None or isinstance(cand_path, str)):
      raise CompareError(
        f"lb.compare: mapping entry {ref_path!r}: {cand_path!r} is not a pair of paths: "
        "write {'Block_0/Dense_0': 'blocks/0/linear'} ('/'-joined module paths as the "
        "report shows them, '' for the top level; None for a reference call with no "
        "counterpart)."
      )
    if ref_path not in by_path_r:
      raise CompareError(
        f"lb.compare: mapping key {ref_path!r} names no module call of the reference, so it "
        f"cannot be paired. The reference called: {_call_list(ref)}. Use these paths "
        "('/'-joined, as the report shows them)."
      )
    if cand_path is None:
      excluded_r.update(by_path_r[ref_path])
      continue
    if cand_path not in by_path_c:
      raise CompareError(
        f"lb.compare: mapping value {cand_path!r} (for {ref_path!r}) names no module call of "
        f"the candidate, so it cannot be paired. The candidate called: {_call_list(cand)}. "
        "Use these paths ('/'-joined, as the report shows them)."
      )
    claimed_c.update(by_path_c[cand_path])
    for i, j in zip(by_path_r[ref_path], by_path_c[cand_path]):
      partners[i] = (j, BY_MAPPING)
  for path, indices in by_path_r.items():
    if path in mapping:
      continue
    ref_key = ref[indices[0]].key
    others = [j for j in by_key_c.get(ref_key, ()) if j not in claimed_c]
    for i, j in zip(indices, others):
      partners[i] = (j, BY_NAME)
  return partners, excluded_r, claimed_c


def _align(
  ref: list[_Call], cand: list[_Call], mapping: tp.Mapping[str, str | None] | None
) -> list[tuple[int, int, str]]:
  """(reference index, candidate index, how) for every aligned pair."""
  partners, excluded_r, claimed_c = _forced_partners(ref, cand, mapping)
  n, m = len(ref), len(cand)
  partnered_c = {j for j, _ in partners.values()}
  free_c = np.array([j not in partnered_c and j not in claimed_c for j in range(m)], bool)
  signature_ids: dict[tuple, int] = {}
  sig_c = np.array(
    [signature_ids.setdefault(c.signature, len(signature_ids)) for c in cand], np.int64
  )
  # Weights: a pair by shape counts `unit`, plus 2 when sampled values agree and 1 when the
  # layer types agree (bonuses only break ties between equally long alignments); a forced
  # pair outweighs them all.
  unit = 3 * (n + m) + 1
  kind_c = np.array([c.kind for c in cand], object)
  big = unit * (n + m + 1)
  groups: dict[int, tuple[np.ndarray, np.ndarray]] = {}
  for sid in set(sig_c.tolist()):
    members = np.flatnonzero((sig_c == sid) & free_c)
    if members.size:
      groups[sid] = (members, np.stack([cand[j].sample for j in members]))

  def weights(i: int) -> np.ndarray:
    w = np.zeros(m, np.int64)
    if i in partners:
      w[partners[i][0]] = big
    elif i not in excluded_r:
      sid = signature_ids.get(ref[i].signature)
      if sid in groups:
        members, samples = groups[sid]
        x = ref[i].sample
        with np.errstate(invalid="ignore"):
          agree = np.all(np.abs(samples - x) <= _SAMPLE_ATOL + _SAMPLE_RTOL * np.abs(x), axis=1)
        same_kind = kind_c[members] == ref[i].kind
        w[members] = unit + 2 * agree.astype(np.int64) + same_kind.astype(np.int64)
    return w

  # Weighted longest common subsequence, one row at a time: row[j] is the best total weight
  # aligning ref[:i] with cand[:j]; the prefix maximum carries "skip a candidate call".
  table = np.zeros((n + 1, m + 1), np.int64)
  rows_w = []
  for i in range(n):
    w = weights(i)
    rows_w.append(w)
    prev = table[i]
    step = np.maximum(prev[1:], np.where(w > 0, prev[:-1] + w, 0))
    table[i + 1, 1:] = np.maximum.accumulate(step)
  chain: list[tuple[int, int]] = []
  i, j = n, m
  while i > 0 and j > 0:
    w = rows_w[i - 1][j - 1]
    if w > 0 and table[i, j] == table[i - 1, j - 1] + w:
      chain.append((i - 1, j - 1))
      i, j = i - 1, j - 1
    elif table[i, j] == table[i - 1, j]:
      i -= 1
    else:
      j -= 1
  chain.reverse()
  pairs: dict[int, tuple[int, str]] = {}
  for i, j in chain:
    pairs[i] = (j, partners[i][1] if i in partners else BY_ORDER)
  # Forced pairs the chain could not hold (the two sides call them in another order).
  for i, (j, how) in partners.items():
    if i not in pairs and j not in {jj for jj, _ in pairs.values()}:
      pairs[i] = (j, how)
  # Calls left over between two consecutive chain pairs, as many on each side: the same
  # modules with outputs of another shape (a port that changed a width).
  used_c = {j for j, _ in pairs.values()}
  bounds = [(-1, -1), *chain, (n, m)]
  for (i0, j0), (i1, j1) in itertools.pairwise(bounds):
    left_r = [i for i in range(i0 + 1, i1) if i not in pairs and i not in excluded_r]
    left_c = [j for j in range(j0 + 1, j1) if j not in used_c and j not in claimed_c]
    if left_r and len(left_r) == len(left_c):
      for i, j in zip(left_r, left_c):
        pairs[i] = (j, BY_POSITION)
  return sorted((i, j, how) for i, (j, how) in pairs.items())


# ----------------------------------------------------------------------------- entry point
def compare(
  reference: tp.Any,
  candidate: tp.Any,
  *args: tp.Any,
  rtol: float | None = None,
  atol: float | None = None,
  mapping: tp.Mapping[str, str | None] | None = None,
  **kwargs: tp.Any,
) -> ParityReport:
  """Run two implementations of a model on the same inputs and find where they first diverge.

  Every module call's output is recorded on both sides, in call order (a module is recorded
  when it returns, so layers come before the block holding them). Calls are aligned by the
  `mapping` you give, then by equal paths (an NNX list path `layers/0` also matches Linen's
  `layers_0`), then in call order where output shapes agree. Each pair is compared leaf by
  leaf; the first reference call whose counterpart differs is `report.first_divergence`.
  Both models run eagerly; the user's models and their Variables are left untouched.

  Args:
    reference: the original: a Linen module with its variables as `(module, variables)`, or
      an initialized `lb.ToNNX` (any `flax.nnx.bridge.ToNNX`), or an NNX module.
    candidate: the port: an NNX module (bridged Linen parts inside it are recorded too), an
      `lb.ToNNX`, or `(linen_module, variables)`.
    *args: positional inputs, passed to both models.
    rtol: relative tolerance; None picks one per dtype (float32 1e-5, bfloat16 1e-2, float64
      1e-9, integers and bools exact).
    atol: absolute tolerance; None picks one per dtype (the same values as `rtol`);
      `math.inf` compares structure, shapes and dtypes only (e.g. models with their own
      random weights).
    mapping: `{reference_path: candidate_path}` pairs to align explicitly ('/'-joined module
      paths as the report prints them, '' for the top level); a value None marks a reference
      call that has no counterpart. Repeated calls of one path pair up in order.
    **kwargs: keyword inputs, passed to both models (e.g. `deterministic=True`).

  Returns:
    A `ParityReport`: `.ok`, `.first_divergence` (reference path, candidate path, max abs and
    rel error) or None, `.pairs`, unmatched calls, `.to_dict()`, and a table as `str()`.

  Raises:
    CompareError: a reference or candidate of another kind (a Linen module without its
      variables, a class, ...), inputs under a JAX trace, a model that fails on the inputs, a
      mapping path that names no call, or two models of which no module call but the top
      level can be aligned.

  Examples:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from flax import nnx
    >>> import loopbridge as lb
    >>> class MLP(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     h = nn.Dense(4)(x)
    ...     return nn.Dense(2)(nn.relu(h))
    >>> class Port(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.Dense_0 = nnx.Linear(3, 4, rngs=rngs)
    ...     self.Dense_1 = nnx.Linear(4, 2, rngs=rngs)
    ...   def __call__(self, x):
    ...     return self.Dense_1(nnx.gelu(self.Dense_0(x)))  # planted bug: gelu, not relu
    >>> x = jax.random.normal(jax.random.key(1), (2, 3))
    >>> variables = MLP().init(jax.random.key(0), x)
    >>> port = Port(nnx.Rngs(0))
    >>> _ = lb.layers.load_params([variables['params']], [port])  # NNX names = Linen names
    >>> report = lb.compare((MLP(), variables), port, x)
    >>> report.ok, report.first_divergence.candidate_path
    (False, 'Dense_1')
  """
  for name, value in (("rtol", rtol), ("atol", atol)):
    if value is not None and (
      isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
    ):
      raise CompareError(
        f"lb.compare: {name}={value!r} must be a number >= 0 (or None for the per-dtype default)."
      )
  if mapping is not None and not isinstance(mapping, tp.Mapping):
    raise CompareError(
      f"lb.compare: mapping={_describe(mapping)} must be a dict "
      "{reference_path: candidate_path}, e.g. {'Block_0/Dense_0': 'blocks/0/linear'}."
    )
  if _has_tracer((args, kwargs)):
    raise CompareError(
      "lb.compare: the inputs are JAX tracers (compare is called inside jax.jit, a loop or "
      "another transform). It reads the value of every module call, so it runs eagerly: "
      "call it outside any transform, on concrete arrays."
    )
  ref_kind, ref_subject = _subject(reference, "reference")
  cand_kind, cand_subject = _subject(candidate, "candidate")
  ref_run = _record("reference", ref_kind, ref_subject, args, kwargs)
  cand_run = _record("candidate", cand_kind, cand_subject, args, kwargs)
  ref, cand = ref_run.calls, cand_run.calls
  _prepare(ref)
  _prepare(cand)
  aligned = _align(ref, cand, mapping)
  inner_r = [c for c in ref if c.path]
  inner_c = [c for c in cand if c.path]
  if (
    inner_r
    and inner_c
    and not any(ref[i].path and cand[j].path and how != BY_POSITION for i, j, how in aligned)
  ):
    raise CompareError(
      "lb.compare: no module call of the reference could be aligned with one of the "
      "candidate (beyond the top level), so there is nothing to localize a divergence with. "
      "Calls are aligned by equal paths or, in call order, by equal output shapes; these "
      f"models share neither. Reference calls: {_call_list(inner_r)}. Candidate calls: "
      f"{_call_list(inner_c)}. Check that the candidate is a port of the reference and "
      "takes the same inputs, or pair calls with mapping={reference_path: candidate_path}."
    )
  pairs = tuple(_compare_pair(ref[i], cand[j], how, rtol, atol) for i, j, how in aligned)
  used_r = {i for i, _, _ in aligned}
  used_c = {j for _, j, _ in aligned}

  def unmatched(calls, used):
    return tuple(
      UnmatchedCall(c.path, c.index, _tree_text(c.output, 60)) for c in calls if c.index not in used
    )

  return ParityReport(
    pairs=pairs,
    unmatched_reference=unmatched(ref, used_r),
    unmatched_candidate=unmatched(cand, used_c),
    not_recorded_reference=tuple(ref_run.not_recorded),
    not_recorded_candidate=tuple(cand_run.not_recorded),
    rtol=rtol,
    atol=atol,
  )
