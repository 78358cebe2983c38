"""Append stage guard: refuse to record from a JAX trace that is not the model's own.

A model closed over by a `jax.lax.while_loop`/`fori_loop` body (or by a jit wrapper that merges
a copy and then loops over it) is called inside a newer trace than the one its Variables belong
to. Writing a record there cannot work: on flax 0.12 flax itself raises `TraceContextError`
from deep inside the write, on flax 0.10 the write goes through and the values vanish with the
trace (0 entries recorded, no error). Both are caught here before anything is written, with the
fix. The check compares Python objects while tracing: nothing of it is in the compiled program.
"""

from __future__ import annotations

import typing as tp

from flax import nnx

from .. import _compat
from .errors import ForeignTraceError

FOREIGN_TRACE = (
  "{who} was called inside a traced function (a jax.lax loop body, jax.jit, ...) that closed "
  "over the model instead of carrying it: its Variables belong to an outer trace, so the "
  "values it records (and any state it updates) could not leave this one. Why: JAX keeps "
  "only what a traced function returns; flax 0.10 would drop the records silently and flax "
  "0.12 raises TraceContextError. Fix: carry the model through the loop. Use an NNX loop, "
  "which passes it for you:\n"
  "    model, x = nnx.fori_loop(0, n, lambda i, c: (c[0], c[0](c[1])), (model, x))\n"
  "(or lb.fori_loop / lb.while_loop / nnx.while_loop), or split it and merge it in the body, "
  "returning its state:\n"
  "    graphdef, state = nnx.split(model)\n"
  "    def body(i, carry):\n"
  "      state, x = carry\n"
  "      m = nnx.merge(graphdef, state)\n"
  "      x = m(x)\n"
  "      return nnx.state(m), x\n"
  "    state, x = jax.lax.fori_loop(0, n, body, (state, x))\n"
  "    nnx.update(model, state)\n"
  "A jit wrapper that merges a copy of the model (e.g. one that freezes the state and "
  "discards changes) must also return nnx.state(copy) and nnx.update the model with it, or "
  "the records stay inside the jit."
)


def check(variables: tp.Iterable[nnx.Variable | None], who: str) -> None:
  """Raise `ForeignTraceError` if any of `variables` belongs to another trace than this one."""
  trace = None
  for variable in variables:
    if variable is None:
      continue
    if trace is None:
      trace = _compat.current_trace()
    if _compat.written_in_another_trace(variable, trace):
      raise ForeignTraceError(FOREIGN_TRACE.format(who=who))
