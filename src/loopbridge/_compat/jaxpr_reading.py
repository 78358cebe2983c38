"""Reading jaxprs: which outputs of a traced function equal an input, and which inputs it needs.

Jaxprs are JAX internals. Equation params are named by each primitive's implementation and
change between minors: jax 0.11.0 describes `scan`'s operands with FlatTree `ft_in`/`ft_out`
instead of `num_consts`/`num_carry` and made `jit`'s `inline` an enum; jax 0.11.1 hoists
closed-over constants into `jaxpr.invars`. So every read here checks the name, the type and
the arity it relies on, and has one fallback, the conservative answer, instead of raising:

- `forwarded_inputs`: an output is "not provably forwarded" (None). `lb.compile_step` then
  donates that leaf and stores what the step returned for it: still correct, it only costs a
  donation (and invalidates arrays read from that Variable before the call).
- `used_inputs`: "unknown" (None). `lb.compile_step` then passes every leaf on every call.
- `eval_jaxpr`: evaluates through `jax.extend.core.jaxpr_as_fun`, the public entry.

Nothing in this module raises on a jaxpr it does not understand.
"""

from __future__ import annotations

import typing as tp

from jax.extend import core as jex_core

# jax's `dce_jaxpr(jaxpr, used_outputs) -> (pruned jaxpr, used inputs)`.
DceJaxpr = tp.Callable[..., tuple[object, list[bool]]]

# Primitives whose equation runs one inner jaxpr on its inputs, in order, under the param named
# here (jax 0.5 names a jit `pjit`, jax 0.7 on `jit`).
_CALLS = {
  "pjit": "jaxpr",
  "jit": "jaxpr",
  "closed_call": "call_jaxpr",
  "core_call": "call_jaxpr",
  "remat": "jaxpr",
  "checkpoint": "jaxpr",
}
# Reading a jaxpr we do not understand can fail in any of these ways; each means "unknown".
_UNREADABLE = (AttributeError, IndexError, KeyError, NotImplementedError, TypeError, ValueError)


def _count(params: tp.Mapping[str, object], name: str) -> int | None:
  """A non-negative int param, or None (missing, renamed, or of another type such as an enum)."""
  value = params.get(name)
  if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
    return value
  return None


def _vars(jaxpr: object, name: str) -> list[object] | None:
  value = getattr(jaxpr, name, None)
  return list(value) if isinstance(value, (list, tuple)) else None


def _body(params: tp.Mapping[str, object], name: str) -> tp.Any:
  """A jaxpr-valued param (a ClosedJaxpr's Jaxpr; jax 0.11 merged the two), or None."""
  value = params.get(name)
  inner = getattr(value, "jaxpr", value)  # a ClosedJaxpr's Jaxpr; a merged Jaxpr returns itself
  if all(_vars(inner, a) is not None for a in ("invars", "outvars", "eqns")):
    return inner
  return None


def _links(eqn: tp.Any) -> list[int | None] | None:
  """For each output of `eqn`, the index of the equation input it provably equals (or None).

  None as a whole: nothing is known (an unknown primitive, or params it cannot read).
  """
  primitive = getattr(eqn, "primitive", None)
  name = getattr(primitive, "name", None)
  params = getattr(eqn, "params", None)
  ins, outs = _vars(eqn, "invars"), _vars(eqn, "outvars")
  if not isinstance(name, str) or not isinstance(params, tp.Mapping) or ins is None or not outs:
    return None
  if name in _CALLS:
    body = _body(params, _CALLS[name])
    if body is None or len(body.invars) != len(ins) or len(body.outvars) != len(outs):
      return None
    return _forwarded(body)
  if name == "while":
    # inputs: cond consts, body consts, carry; outputs: carry.
    body = _body(params, "body_jaxpr")
    cond_consts, body_consts = _count(params, "cond_nconsts"), _count(params, "body_nconsts")
    if body is None or cond_consts is None or body_consts is None:
      return None
    if (
      len(body.invars) != body_consts + len(outs)
      or len(body.outvars) != len(outs)
      or len(ins) != cond_consts + len(body.invars)
    ):
      return None
    first = cond_consts + body_consts  # the carry starts here among the equation's inputs
    return [first + j if f == body_consts + j else None for j, f in enumerate(_forwarded(body))]
  if name == "scan":
    # inputs: consts, carry, scanned; outputs: carry, stacked per-step outputs.
    body = _body(params, "jaxpr")
    consts, carry = _count(params, "num_consts"), _count(params, "num_carry")
    if body is None or consts is None or carry is None:
      return None
    if (
      len(body.invars) != len(ins)
      or len(body.outvars) != len(outs)
      or consts + carry > len(ins)
      or carry > len(outs)
    ):
      return None
    return [
      consts + j if j < carry and f == consts + j else None for j, f in enumerate(_forwarded(body))
    ]
  if name == "copy" and len(ins) == 1 and len(outs) == 1:
    return [0]
  return None


def _forwarded(jaxpr: tp.Any) -> list[int | None]:
  source: dict[object, int] = {v: i for i, v in enumerate(jaxpr.invars)}

  def origin(var: object) -> int | None:
    # A Literal (a constant, `.val`) is no input; `jax.core.Var` moved between jax versions.
    return None if hasattr(var, "val") else source.get(var)

  for eqn in jaxpr.eqns:
    links = _links(eqn)
    if links is None:
      continue
    ins = eqn.invars
    for out, link in zip(eqn.outvars, links):
      if link is not None and 0 <= link < len(ins):
        found = origin(ins[link])
        if found is not None:
          source[out] = found
  return [origin(v) for v in jaxpr.outvars]


def forwarded_inputs(jaxpr: tp.Any, n_inputs: int | None = None) -> list[int | None]:
  """For each output of `jaxpr`, the index of the input it provably equals, or None.

  Args:
    jaxpr: a `Jaxpr` (`jax.make_jaxpr(f)(...).jaxpr`).
    n_inputs: how many flat arguments `f` was traced with. When the jaxpr has another number
      of inputs (closed-over constants hoisted among them, jax 0.11.1) an input's position no
      longer says which argument it is, so nothing counts as forwarded.

  Returns:
    One entry per output; None where forwarding is not proven (the conservative answer, also
    for every equation whose primitive or params this module does not know).
  """
  outs = _vars(jaxpr, "outvars")
  if outs is None:
    return []
  unknown: list[int | None] = [None] * len(outs)
  ins = _vars(jaxpr, "invars")
  if ins is None or _vars(jaxpr, "eqns") is None:
    return unknown
  if n_inputs is not None and len(ins) != n_inputs:
    return unknown
  try:
    return _forwarded(jaxpr)
  except _UNREADABLE:  # a structure none of the checks above foresaw: prove nothing
    return unknown


def _find_dce_jaxpr() -> DceJaxpr | None:
  # Dead-code elimination of a jaxpr (which inputs its outputs need): a jax internal, at the
  # same place from jax 0.5.3 through 0.10.2; a jax that moves it loses only that optimization.
  try:
    from jax._src.interpreters.partial_eval import dce_jaxpr
  except ImportError:  # pragma: no cover - then every leaf is passed on every call
    return None
  return dce_jaxpr


dce_jaxpr: DceJaxpr | None = _find_dce_jaxpr()


def used_inputs(jaxpr: tp.Any, used_outputs: tp.Sequence[bool], n_inputs: int) -> list[bool] | None:
  """Which of the `n_inputs` inputs the `used_outputs` of `jaxpr` depend on; None if unknown.

  Unknown (the caller then passes every input): jax has no `dce_jaxpr` where we look, the
  jaxpr has another number of inputs or outputs than expected (hoisted constants), or jax's
  own pass cannot read it.
  """
  if dce_jaxpr is None:
    return None
  ins, outs = _vars(jaxpr, "invars"), _vars(jaxpr, "outvars")
  if ins is None or outs is None or len(ins) != n_inputs or len(outs) != len(used_outputs):
    return None
  try:
    _, used = dce_jaxpr(jaxpr, list(used_outputs))
  except _UNREADABLE:  # its rules read the same params by name: same fallback
    return None
  if not isinstance(used, (list, tuple)) or len(used) != n_inputs:
    return None
  return [bool(u) for u in used]


def eval_jaxpr(closed: tp.Any, *args: object) -> list[tp.Any]:
  """Evaluate a `ClosedJaxpr` (`jax.make_jaxpr(f)(...)`) on flat arguments (or tracers).

  Through `jax.extend.core.jaxpr_as_fun`, which pairs the jaxpr with its constants however
  the installed jax stores them; a jax without it evaluates the jaxpr with its `consts`.
  """
  as_fun = getattr(jex_core, "jaxpr_as_fun", None)
  if as_fun is not None:
    return list(as_fun(closed)(*args))
  import jax.core  # pylint: disable=import-outside-toplevel

  return list(jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args))
