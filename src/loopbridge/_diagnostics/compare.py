"""`lb.compare`: where a ported model first diverges from its original, module call by call.

The entry: validate the arguments, record both runs (`compare_capture`), align their calls
(`compare_align`), compare each aligned pair (`compare_values`) into a `ParityReport`
(`compare_report`).
"""

from __future__ import annotations

import typing as tp

from .._core.errors import CompareError
from .compare_align import align, call_list, prepare
from .compare_capture import describe, has_tracer, path_strings, record, subject
from .compare_report import BY_POSITION, ParityReport, UnmatchedCall
from .compare_tolerance import HIGHEST, check_context, check_precision, default_tolerance
from .compare_values import compare_pair, tree_text

__all__ = ["ParityReport", "compare", "path_strings"]


def compare(
  reference: tp.Any,
  candidate: tp.Any,
  *args: tp.Any,
  rtol: float | None = None,
  atol: float | None = None,
  mapping: tp.Mapping[str, str | None] | None = None,
  precision: tp.Literal["highest", "model"] = HIGHEST,
  method: str | None = None,
  **kwargs: tp.Any,
) -> ParityReport:
  """Run two implementations of a model on the same inputs and find where they first diverge.

  Every module call's output is recorded on both sides, in call order (a module is recorded
  when it returns, so layers come before the block holding them). Calls are aligned by the
  `mapping` you give, then by equal paths (an NNX list path `layers/0` also matches Linen's
  `layers_0`), then in call order where output shapes agree. Each pair is compared leaf by
  leaf; the first reference call whose counterpart differs is `report.first_divergence`.
  Both models run eagerly; the user's models and their Variables are left untouched. By
  default both run under `jax.default_matmul_precision('highest')`, so a TPU (one bfloat16
  pass per float32 matmul by default) or a GPU (TensorFloat-32) checks as exactly as a CPU.

  Calls inside `nn.scan`, `nn.remat`, `nnx.scan` and vmap bodies are recorded once per layer
  (through `jax.debug.callback`): a layer of a scanned stack reads `layers[2]/Dense_1`, and
  every pair names its layer stack and layer (a scanned stack, an NNX list `blocks/2/...`, or
  Linen modules named `layers_0`, `layers_1`, ...), so a scanned stack aligns with a list of
  blocks or an `nnx.vmap`-stacked one run by `nnx.scan`, and the other way round.

  Args:
    reference: the original: a Linen module with its variables as `(module, variables)`, or
      an initialized `lb.ToNNX` (any `flax.nnx.bridge.ToNNX`), or an NNX module.
    candidate: the port: an NNX module (bridged Linen parts inside it are recorded too), an
      `lb.ToNNX`, or `(linen_module, variables)`.
    *args: positional inputs, passed to both models.
    rtol: relative tolerance; None picks one per dtype, backend and `precision`: float32 1e-5
      where float32 matmuls run in float32 (the default `precision='highest'`, or a CPU), 1e-4
      on a TPU at 'highest' (its transcendentals), and at `precision='model'` 5e-3 where they
      run in TensorFloat-32 (NVIDIA GPUs by default), 3e-2 in one bfloat16 pass (TPUs by
      default); bfloat16 1e-2, float64 1e-9, integers and bools exact.
      `report.default_tolerance` says which was used and why.
    atol: absolute tolerance; None picks one per dtype and backend (the same values as
      `rtol`), as a fraction of each output's scale (the 99th percentile of the reference's
      finite magnitudes, mask values such as `finfo.min`, -1e9 or infinities equal on both
      sides left out and matched exactly: a mask cannot widen it); a number given is absolute;
      `math.inf` compares structure, shapes and dtypes only (e.g. models with their own
      random weights).
    mapping: `{reference_path: candidate_path}` pairs to align explicitly ('/'-joined module
      paths as the report prints them, '' for the top level); a value None marks a reference
      call that has no counterpart. Repeated calls of one path (the layers of a scanned
      stack) pair up in order; `layers[2]/Dense_1` names one layer.
    precision: 'highest' (the default) runs both models under
      `jax.default_matmul_precision('highest')`; 'model' runs them at their own precision (the
      current `jax_default_matmul_precision`), with the looser default tolerance that goes
      with it (what a TPU computes by default, say).
    method: the method both models run (Linen's `apply(..., method=)`, the port's method of
      the same name); None for `__call__`.
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
  check_precision(precision, "lb.compare", CompareError)
  if mapping is not None and not isinstance(mapping, tp.Mapping):
    raise CompareError(
      f"lb.compare: mapping={describe(mapping)} must be a dict "
      "{reference_path: candidate_path}, e.g. {'Block_0/Dense_0': 'blocks/0/linear'}."
    )
  if has_tracer((args, kwargs)):
    raise CompareError(
      "lb.compare: the inputs are JAX tracers (compare is called inside jax.jit, a loop or "
      "another transform). It reads the value of every module call, so it runs eagerly: "
      "call it outside any transform, on concrete arrays."
    )
  ref_kind, ref_subject = subject(reference, "reference")
  cand_kind, cand_subject = subject(candidate, "candidate")
  if method is not None:
    for role, kind, side in (
      ("reference", ref_kind, ref_subject),
      ("candidate", cand_kind, cand_subject),
    ):
      model = side[0] if kind == "linen" else side
      if not isinstance(method, str) or not callable(getattr(model, method, None)):
        raise CompareError(
          f"lb.compare: method={method!r}: the {role} {type(model).__name__} has no such "
          "method. Fix: name a method both models define (the port keeps the Linen name)."
        )
  with check_context(precision):
    ref, not_recorded_r = record("reference", ref_kind, ref_subject, args, kwargs, method)
    cand, not_recorded_c = record("candidate", cand_kind, cand_subject, args, kwargs, method)
    # after the runs: the backend they started is the one used; inside: the precision they ran
    default = default_tolerance(precision=precision)
  prepare(ref)
  prepare(cand)
  aligned = align(ref, cand, mapping)
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
      f"models share neither. Reference calls: {call_list(inner_r)}. Candidate calls: "
      f"{call_list(inner_c)}. Check that the candidate is a port of the reference and "
      "takes the same inputs, or pair calls with mapping={reference_path: candidate_path}."
    )
  pairs = tuple(compare_pair(ref[i], cand[j], how, rtol, atol, default) for i, j, how in aligned)
  used_r = {i for i, _, _ in aligned}
  used_c = {j for _, j, _ in aligned}

  def unmatched(calls, used):
    return tuple(
      UnmatchedCall(c.shown, c.index, tree_text(c.output, 60)) for c in calls if c.index not in used
    )

  return ParityReport(
    pairs=pairs,
    unmatched_reference=unmatched(ref, used_r),
    unmatched_candidate=unmatched(cand, used_c),
    not_recorded_reference=tuple(not_recorded_r),
    not_recorded_candidate=tuple(not_recorded_c),
    rtol=rtol,
    atol=atol,
    default_tolerance=default,
  )
