"""What every declaration entry shares: opening it (`_Entry`: the call, its spec, the
`lb.capacity` default), declaring its parts, noting which module raised, and declaring an
`lb.ToNNX` initialized without an entry."""

from __future__ import annotations

import dataclasses

from flax import nnx

from . import cache_length, declare, discovery_session, user_errors
from . import capacity as _capacity
from .bridge_settings import bridge_settings
from .call_target import Call, model_name, target
from .discovered_parts import _for_signature


@dataclasses.dataclass(frozen=True)
class _Entry:
  """What every entry starts from: the call, the spec it was given, the `lb.capacity` default."""

  name: str  # "lazy_init" or "preallocate"
  root: nnx.Module
  call: Call
  spec: _capacity.DeclarationSpec
  scoped: _capacity.CapacitySpec | None  # the lowest precedence (see lb.capacity)

  @classmethod
  def open(
    cls,
    name: str,
    model: object,
    method: object,
    capacity: object,
    overflow: object,
    memory: object = None,
  ) -> _Entry:
    """Validate what the entry was given, in the order a user reads the arguments."""
    spec = _capacity.DeclarationSpec.checked(capacity, overflow, memory)
    scoped = _capacity.scoped_capacity()
    root, call = target(model, method, f"lb.{name}")
    return cls(name, root, call, spec, scoped)

  def declare_parts(self, parts: list[declare.Part], args: tuple, kwargs: dict) -> None:
    """Declare every part's buffers, then warn of caches shorter than the declared loop."""
    declare.declare(
      parts,
      spec=self.spec,
      shardings_from=(args, kwargs),
      model_name=model_name(self.root),
      entry=self.name,
      scoped_capacity=self.scoped,
    )
    cache_length.warn_short_caches(self.root, parts, self.name)


def _note_running(
  error: BaseException, entry: str, root: nnx.Module, path_of: dict[int, tuple]
) -> None:
  """Say which module of the model was running when its own code raised `error`."""
  if not user_errors.is_users(error):
    return
  where = user_errors.running_nnx_module(error, path_of)
  user_errors.add_note(
    error,
    f"raised by the model's own code while {entry} ran "
    f"{model_name(root)}" + (f"; NNX module {where} was running." if where else "."),
  )


def declare_alone(
  node: nnx.Module, report: discovery_session.BridgeReport, args: tuple, kwargs: dict
) -> None:
  """Declare one `lb.ToNNX` initialized without a loopbridge entry (stock `bridge.lazy_init`),
  with the capacity and overflow given to its constructor."""
  part = declare.Part((), node, _for_signature(report), bridge_settings(node).spec, report.dropped)
  declare.declare(
    [part],
    spec=_capacity.DeclarationSpec(),
    shardings_from=(args, kwargs),
    model_name=model_name(node),
    scoped_capacity=_capacity.scoped_capacity(),
  )
