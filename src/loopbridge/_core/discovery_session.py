"""Discover stage: the discovery session that bridged parts report into.

`lb.lazy_init` / `lb.preallocate` open one session per root and run one call of the root (the
initializing call, or one abstract `apply`). Every `lb.ToNNX` the call reaches finds the open
session in a `ContextVar` and reports what its Linen call sowed; it is our own class, so nothing
needs to be intercepted. Being a `ContextVar`, the session is private to the thread (and task)
that opened it: concurrent `lazy_init`s in other threads never see it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import typing as tp

from flax import nnx

from .site import DroppedSow, SowSite


@dataclasses.dataclass
class BridgeReport:
  """What one `lb.ToNNX` call sowed during a session."""

  # The lb.ToNNX that ran (the model's own node, or its clone in an abstract run); None once
  # `lb.preallocate` has taken the clone's path and lets nothing of the trace out.
  node: nnx.Module | None
  label: str  # the wrapped Linen module's class name, for messages
  sites: list[SowSite]
  dropped: list[DroppedSow]
  # Custom-reduce accumulators this call would create: site -> (init_fn, abstract value).
  new_accumulators: dict[tuple[str, ...], tuple[tp.Callable[[], object], object]]
  # Sown inside jax.vmap/nnx.vmap: one value per member, which one buffer of the node cannot
  # hold when the node itself is shared (broadcast) by the transform.
  batched: bool = False
  # The call's signature label (`_signature.label`): the sites are declared for it.
  signature: str = ""
  # Linen variables (not records, not accumulators) this call creates that the node lacks:
  # (collection, *path) -> value (e.g. a decode cache made by `init_cache=True`).
  new_variables: dict[tuple[str, ...], object] = dataclasses.field(default_factory=dict)
  # The node that ran was one layer of a stack of this many (`lb.layers.stack`, `nnx.vmap`)
  # at the report's path: its sites are declared with the layer axis in front.
  layers: int | None = None


@dataclasses.dataclass
class Session:
  """One discovery run over one root. `mode` is "init" (lazy_init) or "apply" (preallocate)."""

  mode: str
  reports: list[BridgeReport] = dataclasses.field(default_factory=list)
  # ids of the bridged nodes of the root's own graph: a node not among them is a copy made
  # inside an NNX transform, which must leave probes to be found after the call.
  graph_ids: frozenset[int] = frozenset()


_CURRENT: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
  "loopbridge_discovery_session", default=None
)


def current() -> Session | None:
  """The session open in this context, if any."""
  return _CURRENT.get()


@contextlib.contextmanager
def open_session(mode: str, graph_ids: tp.Iterable[int] = ()) -> tp.Iterator[Session]:
  session = Session(mode, graph_ids=frozenset(graph_ids))
  token = _CURRENT.set(session)
  try:
    yield session
  finally:
    _CURRENT.reset(token)


@contextlib.contextmanager
def suspended() -> tp.Iterator[None]:
  """No session inside the block (e.g. a nested, self-contained lazy_init)."""
  token = _CURRENT.set(None)
  try:
    yield
  finally:
    _CURRENT.reset(token)
