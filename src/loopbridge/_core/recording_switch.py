"""`lb.recording`: a scope in which calls record nothing (a warm-up, a prompt left out).

Decided when a call is traced, like every Python-level choice under `jax.jit`: a jitted
function traced inside the block keeps leaving its sows out when called later, outside it.
"""

from __future__ import annotations

import contextlib
import contextvars
import typing as tp

_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("loopbridge_recording", default=True)


def is_on() -> bool:
  """Whether calls traced now record their sows."""
  return _ON.get()


@contextlib.contextmanager
def recording(enabled: bool) -> tp.Iterator[None]:
  """Record (`True`) or leave out (`False`) the sows of every call traced inside the block.

  Calls inside `with lb.recording(False):` run as usual (outputs, caches, `batch_stats` and
  custom-reduce accumulators are updated) but write nothing into the sow buffers; their
  counts do not move. The choice is made while tracing: a function jitted inside the block
  stays unrecorded when its compiled version is called again elsewhere.

  Args:
    enabled: whether calls record.

  Raises:
    TypeError: `enabled` is not a bool.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn
    >>> class Net(nn.Module):
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> model = lb.lazy_init(lb.ToNNX(Net()), jnp.ones(2), capacity=3)
    >>> with lb.recording(False):
    ...   _ = model(jnp.ones(2))  # a warm-up: not recorded
    >>> _ = model(jnp.ones(2))
    >>> int(lb.counts(model)["intermediates"]["x"])
    1
  """
  if not isinstance(enabled, bool):
    raise TypeError(
      f"lb.recording(enabled) takes a bool, got {type(enabled).__name__}. Why: it switches "
      "recording on or off for the calls traced inside the block. Fix: "
      "`with lb.recording(False):` to leave calls unrecorded."
    )
  token = _ON.set(enabled)
  try:
    yield
  finally:
    _ON.reset(token)
