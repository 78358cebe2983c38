"""`lb.explain`: what one step of a loop body changes in the loop carry, in words.

A JAX loop carries exactly the same pytree through every step; NNX loops add that the carry's
graph (its Variables, modules and shared references) must come out of the body as it went in.
When it does not, flax reports a GraphDef or pytree mismatch. `explain` runs one step
abstractly (`jax.eval_shape`: shapes only, no FLOPs, the caller's objects untouched), takes a
snapshot of the carry before and after the step, and names each difference with its fix:
paths added or removed, shape and dtype changes, Variables or modules replaced by new objects,
shared references split or joined, plain attributes changed, and sow tuples that grow.
"""

from __future__ import annotations

import typing as tp

import jax
from flax import nnx

from .. import _compat
from .._core.errors import StructureChangeError
from .explain_diff import diff as diff
from .explain_report import Change as Change
from .explain_report import StructureReport as StructureReport
from .explain_snapshot import is_array_like as is_array_like
from .explain_snapshot import is_graph_object as is_graph_object
from .explain_snapshot import snapshot as snapshot


def _body_name(body_fn: tp.Callable[..., object]) -> str:
  return getattr(body_fn, "__name__", None) or type(body_fn).__name__


def explain_step(
  body_fn: tp.Callable[..., object],
  carry: object,
  extra_args: tuple[object, ...] = (),
  name: str | None = None,
) -> StructureReport:
  """`explain` without the raise: the report of one abstract step of `body_fn(carry, *extra)`."""
  everything = (carry, extra_args)
  leaves, treedef = jax.tree_util.tree_flatten(everything, is_leaf=is_graph_object)
  node_mask = [is_graph_object(leaf) for leaf in leaves]
  dyn_mask = [not n and is_array_like(leaf) for n, leaf in zip(node_mask, leaves)]
  nodes = [leaf for leaf, n in zip(leaves, node_mask) if n]
  graphdef, state = _compat.split_graph(nodes)
  dynamic = [leaf for leaf, d in zip(leaves, dyn_mask) if d]
  result: dict[str, StructureReport] = {}

  def step(state: nnx.State, dynamic: list[object]) -> None:
    fresh = iter(nnx.merge(graphdef, state))
    values = iter(dynamic)
    rebuilt = [
      next(fresh) if n else next(values) if d else leaf
      for leaf, n, d in zip(leaves, node_mask, dyn_mask)
    ]
    carry_in, extra_in = treedef.unflatten(rebuilt)
    before = snapshot(carry_in)
    carry_out = body_fn(carry_in, *extra_in)
    after = snapshot(carry_out)
    result["report"] = StructureReport(
      diff(before, after), before.counts(), name or _body_name(body_fn)
    )

  jax.eval_shape(step, state, dynamic)
  return result["report"]


def explain(
  body_fn: tp.Callable[..., object],
  carry: object,
  *extra_args: object,
  raise_on_change: bool = False,
) -> StructureReport:
  """Run one loop step abstractly and report what it changes in the loop carry.

  Calls `body_fn(carry, *extra_args)` under `jax.eval_shape` (no FLOPs; the caller's modules
  are not modified) on a copy of `carry`, and compares the carry before and after the step:
  paths added or removed, shape and dtype changes, Variables or modules replaced by new
  objects, shared references split or joined, plain attributes changed, sow tuples growing.
  `carry` may mix NNX modules (`lb.ToNNX`, stock `flax.nnx.bridge.ToNNX`, native ones),
  Variables, arrays, Python scalars and nested tuples/lists/dicts of them. For a `fori_loop`
  body `f(i, carry)` pass `lambda c: f(0, c)`.

  Args:
    body_fn: one loop step, `carry -> carry` (extra arguments follow the carry).
    carry: the loop carry as the loop would receive it.
    *extra_args: further arguments of `body_fn`, after the carry (not compared).
    raise_on_change: raise `StructureChangeError` (with the report's text) if anything changed.

  Returns:
    A `StructureReport`: `.ok`, `.changes` (each with kind, path, message), `.to_dict()`, and
    `str(report)`, the readable text with the fix for each kind of change.

  Raises:
    StructureChangeError: `raise_on_change=True` and the step changes the carry's structure.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import nnx
    >>> def step(carry):  # keeps a growing history: its shape changes every step
    ...   model, history = carry
    ...   return model, jnp.concatenate([history, model(history[-1:])])
    >>> report = lb.explain(step, (nnx.Linear(2, 2, rngs=nnx.Rngs(0)), jnp.ones((1, 2))))
    >>> report.ok
    False
    >>> print(report.changes[0].message)
    carry[1]: shape (1, 2) became (2, 2) (float32)
  """
  if not callable(body_fn):
    raise TypeError(
      f"lb.explain: body_fn must be the loop step, a function carry -> carry, got "
      f"{type(body_fn).__name__}. Note the order: lb.explain(body_fn, carry, *extra_args)."
    )
  report = explain_step(body_fn, carry, tuple(extra_args))
  if raise_on_change and not report.ok:
    raise StructureChangeError(str(report))
  return report
