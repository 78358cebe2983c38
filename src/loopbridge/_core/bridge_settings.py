"""`lb.ToNNX`'s constructor options, and the one test of "is this an `lb.ToNNX`".

`lb.ToNNX` (`to_nnx.py`, at the bottom of the core) marks its class and keeps its
`BridgeSettings` as a static attribute of each instance. Every module that must tell an
`lb.ToNNX` from another module (the pipeline, the native `sow` hook and call log, `lb.explain`)
asks `is_bridge` / `is_bridge_class` here, so none of them imports the class itself.
"""

from __future__ import annotations

import dataclasses
import typing as tp

from flax import linen
from flax.nnx import bridge

from .capacity import DeclarationSpec

SETTINGS_ATTR = "loopbridge__settings"  # on every lb.ToNNX (its constructor's options)
# A class attribute of lb.ToNNX (and so of its subclasses): True.
BRIDGE_MARK = "loopbridge__bridge"

# Linen's `apply(capture_intermediates=...)`: all, none, or a filter (module, method name).
CaptureFilter = bool | tp.Callable[[linen.Module, str], bool]


@dataclasses.dataclass(frozen=True)
class BridgeSettings:
  """An `lb.ToNNX`'s constructor options (static and hashable: they sit in the GraphDef)."""

  spec: DeclarationSpec  # capacity and overflow given to the constructor
  capture_intermediates: CaptureFilter = False


def is_bridge_class(cls: type) -> bool:
  """Whether `cls` is `lb.ToNNX` or a subclass of it."""
  return getattr(cls, BRIDGE_MARK, False) is True


def is_bridge(node: object) -> tp.TypeGuard[bridge.ToNNX]:
  """Whether `node` is an `lb.ToNNX` (never true of a stock `flax.nnx.bridge.ToNNX`)."""
  return is_bridge_class(type(node))


def settings_of(node: object) -> BridgeSettings | None:
  """The settings of an `lb.ToNNX` (None for any other node)."""
  return vars(node).get(SETTINGS_ATTR) if is_bridge(node) else None


def bridge_settings(node: object) -> BridgeSettings:
  """The settings of a node known to be an `lb.ToNNX` (its constructor stores them)."""
  settings = settings_of(node)
  assert settings is not None, f"{type(node).__name__} is not an lb.ToNNX"
  return settings
