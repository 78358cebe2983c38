"""`inspect`'s live check: the model in a jitted `nnx.while_loop`, stock bridge and `lb.ToNNX`.

Errors are kept whole (`--json` shows them as raised); the text report shortens them.
"""

from __future__ import annotations

import time
import typing as tp
import warnings

import jax
import jax.numpy as jnp
from flax import linen, nnx
from flax.nnx import bridge
from typing_extensions import NotRequired

import loopbridge as lb

from .._core import linen_vars
from .output import progress

_M = tp.TypeVar("_M", bound=nnx.Module)
Call = tp.Callable[[_M, tp.Sequence[jax.Array]], object]


class StockCheck(tp.TypedDict):
  """Stock `flax.nnx.bridge.ToNNX` in the loop, and `lb.explain` of one step."""

  wrapper: str
  ok: bool
  error: str | None  # the whole message, as raised
  explain: dict[str, object] | None  # `StructureReport.to_dict()`
  explain_text: str | None
  model_sows: bool
  mutable: bool | None  # called with mutable=True, as a user of this model would
  steps_run: NotRequired[int]


class RecordedSite(tp.TypedDict):
  """What one site recorded in the loop: values sown, kept (at most `capacity`)."""

  sown: int
  kept: int
  capacity: int
  value_shape: list[int]


class LoopbridgeCheck(tp.TypedDict):
  """`lb.ToNNX` in the same loop: timings and what each site recorded."""

  wrapper: str
  ok: bool
  error: str | None  # the whole message, as raised
  steps_run: NotRequired[int]
  first_call_s: NotRequired[float]
  next_call_s: NotRequired[float]
  recorded: NotRequired[dict[str, RecordedSite]]


def _error_text(error: BaseException) -> str:
  return f"{type(error).__name__}: {str(error).strip()}"


def _loop_runner(steps: int, call: Call[_M]):
  """A jitted `nnx.while_loop` of `steps` calls; returns (make_body, run)."""

  def make_body(inputs: tp.Sequence[jax.Array]):
    def body(carry: tuple[_M, jax.Array]) -> tuple[_M, jax.Array]:
      model, i = carry
      call(model, inputs)
      return model, i + 1

    return body

  # Donated as the README recommends: the buffers are written in place, so the "next call"
  # timing shows what a user following it gets (without donation each call copies them).
  @nnx.jit(donate_argnums=0)
  def run(model: _M, *inputs: jax.Array) -> tuple[_M, jax.Array]:
    def cond(carry: tuple[_M, jax.Array]) -> jax.Array:
      return carry[1] < steps

    return nnx.while_loop(cond, make_body(inputs), (model, jnp.asarray(0, jnp.int32)))

  return make_body, run


def stock_check(
  module: linen.Module,
  inputs: list[jax.Array],
  method: str | None,
  steps: int,
  seed: int,
  sows: bool,
  kwargs: tp.Mapping[str, tp.Any] | None = None,
) -> StockCheck:
  """Stock `flax.nnx.bridge.ToNNX` in the loop, called the way a user calls it for this model.

  A user passes `mutable=True` when the model sows (stock drops sows otherwise) or keeps
  other collections it updates (`batch_stats`, a cache); a model with only
  params is called plainly, and then the stock wrapper runs in the loop as well. `kwargs`
  are the sample call's keyword inputs (`--kwarg`), closed over by the loop body.
  """
  kw = dict(kwargs or {})
  result: StockCheck = {
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
    bridge.lazy_init(stock, *inputs, method=method, **kw)
  except Exception as e:
    result["error"] = f"lazy_init failed: {_error_text(e)}"
    return result
  state_collections = sorted(c for c in linen_vars.linen_variables(stock) if c != "params")
  mutable = sows or bool(state_collections)
  result["mutable"] = mutable

  def call(model: bridge.ToNNX, args: tp.Sequence[jax.Array]) -> object:
    if mutable:
      return model(*args, method=method, mutable=True, **kw)
    return model(*args, method=method, **kw)

  make_body, run = _loop_runner(steps, call)
  # Explain first, on the untouched model (explain copies the carry; it runs no FLOPs).
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      report = lb.explain(make_body(inputs), (stock, jnp.asarray(0, jnp.int32)))
    result.update(explain=report.to_dict(), explain_text=str(report))
  except Exception as e:  # keep the rest of the report
    result["explain_text"] = f"lb.explain failed: {_error_text(e)}"
  try:
    with progress("compiling the loop with stock flax.nnx.bridge.ToNNX"):
      _, count = run(stock, *inputs)
      result["steps_run"] = int(count)
    result["ok"] = True
  except Exception as e:  # the expected failure: structure change inside the loop
    result["error"] = _error_text(e)
  return result


def loopbridge_check(
  model: lb.ToNNX,
  inputs: list[jax.Array],
  method: str | None,
  steps: int,
  kwargs: tp.Mapping[str, tp.Any] | None = None,
) -> LoopbridgeCheck:
  """`lb.ToNNX` in the same loop: timings and what each site recorded."""
  kw = dict(kwargs or {})

  def call(m: lb.ToNNX, args: tp.Sequence[jax.Array]) -> object:
    # mutable=True as for the stock wrapper: other collections (batch_stats, a cache) update.
    return m(*args, method=method, mutable=True, **kw)

  _, run = _loop_runner(steps, call)
  result: LoopbridgeCheck = {"wrapper": "lb.ToNNX", "ok": False, "error": None}
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
    result["error"] = _error_text(e)
    return result
  recorded: dict[str, RecordedSite] = {}
  counts = lb.counts(model)
  for site in lb.sow_sites(model):
    n = counts[site.collection]
    for key in site.path:
      n = n[key]
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
  result.update(ok=True, steps_run=steps_run, first_call_s=first, next_call_s=again)
  result["recorded"] = recorded
  return result
