"""`PortError` and the error texts the port wing raises (each written once)."""

from __future__ import annotations

import numpy as np
from flax import nnx

from .._core.errors import LoopbridgeError


class PortError(LoopbridgeError, ValueError):
  """An input `lb.port.draft` cannot draft from (what, why and the fix are in the message)."""

  __module__ = "loopbridge.port"  # its public name (tracebacks and reprs show it)


NO_LIBCST = (
  "lb.port.draft needs libcst to read and rewrite the Linen source, and it is not installed. "
  "Fix: pip install 'loopbridge[port]'."
)


def not_a_linen_module(obj: object) -> str:
  kind = f"the class {obj.__name__}" if isinstance(obj, type) else type(obj).__name__
  return (
    f"lb.port.draft: the model must be a flax.linen Module instance (e.g. `MLP()`), got {kind}. "
    "Fix: pass the Linen module you want ported, built with its fields, then its sample inputs."
  )


def flax_layer(cls: type, counterpart: str | None) -> str:
  use = f"nnx.{counterpart}" if counterpart else "its NNX counterpart"
  return (
    f"lb.port.draft: {cls.__module__}.{cls.__qualname__} is flax's own layer, not code to port: "
    f"use {use} directly (lb.checkpoint.linen_to_nnx moves its variables). Drafting ports the "
    "classes you wrote; pass the module of yours that uses this layer."
  )


def no_source(cls: type, why: str) -> str:
  return (
    f"lb.port.draft: the source of the Linen class {cls.__qualname__} cannot be read ({why}). "
    "Drafting rewrites the class's own source, so it must live in a file Python can read "
    "(not a REPL, a notebook cell without a file, or exec'd text). Fix: move the class into a "
    ".py module, import it from there, and draft again."
  )


def bad_call(what: object) -> str:
  return (
    f"lb.port.draft: calls= must hold lb.port.Call records, got {type(what).__name__}. "
    "Fix: calls=(lb.port.Call(x, train=False), lb.port.Call(z, method='decode'))."
  )


def bad_method(cls: type, method: object) -> str:
  return (
    f"lb.port.draft: method={method!r} is not a method of {cls.__qualname__}. "
    "Fix: name a method of the Linen class (as in Module.apply(..., method='encode')), or "
    "None for __call__."
  )


def trace_failed(cls: type, error: BaseException) -> str:
  return (
    f"lb.port.draft: running the Linen module {cls.__qualname__} on the sample call failed "
    f"({type(error).__name__}: {error}). Drafting reads input widths from one call of the "
    "model. Fix: pass the arguments a forward call takes (e.g. one batch, train=False)."
  )


def bad_config(cls: type, what: object) -> str:
  got = type(what).__qualname__
  return (
    f"lb.port.draft: configs= must hold other instances of {cls.__qualname__} (the same class "
    f"at other field values, to tell a width of the class from a number of one instance), got "
    f"{got}. Fix: configs=({cls.__qualname__}(...other fields...),)."
  )


def bad_configs(cls: type, what: object) -> str:
  return (
    f"lb.port.draft: configs= must be a sequence of other instances of {cls.__qualname__}, "
    f"got one {type(what).__qualname__}. Fix: configs=[{cls.__qualname__}(...)] (a list, "
    "even of one), or leave it out for the configurations the draft derives."
  )


def config_failed(index: int, shown: str, error: BaseException) -> str:
  return (
    f"lb.port.draft: configs[{index}] ({shown}) cannot run the sample call "
    f"({type(error).__name__}: {error}); the drafted module itself runs it. Why: each "
    "configs= instance is traced on the sample call, to tell a width of the class from a "
    "number of one instance. Fix: give that instance fields at which the sample call runs "
    "(e.g. a length at least the sample's), or leave it out of configs=."
  )


def bad_calls(what: object) -> str:
  return (
    f"lb.port.draft: calls= must be a sequence of lb.port.Call records, got "
    f"{type(what).__name__}. Fix: calls=(lb.port.Call(x, train=True),), or leave it out."
  )


def bad_variables(what: object) -> str:
  return (
    f"lb.port.draft: variables= must be the Linen variables mapping that Module.init returns "
    f"(e.g. {{'params': ...}}), got {type(what).__name__}. Fix: pass model.init(key, x) or "
    "the loaded checkpoint's variables, or leave it out to check with a fresh init."
  )


def trace_defect(cls: type, error: BaseException) -> str:
  return (
    f"lb.port.draft: recording the sample call of {cls.__qualname__} failed inside the drafter "
    f"({type(error).__name__}: {error}); the model itself ran. This is a defect of "
    "lb.port.draft: please report it with the model's call arguments. Workaround: pass the "
    "non-array arguments (a mesh, a config) as fields of the module instead of at the call."
  )


def check_build_arguments(rngs: object, config: object, configs: int) -> None:
  """`Draft.build`'s arguments, refused with what to pass instead."""
  if rngs is not None and not isinstance(rngs, nnx.Rngs):
    raise PortError(
      f"Draft.build: rngs= must be an nnx.Rngs (the port's random streams), got "
      f"{type(rngs).__name__} {rngs!r}. Fix: draft.build(rngs=nnx.Rngs({rngs!r})), or leave "
      "it out for nnx.Rngs(0)."
    )
  if isinstance(config, bool) or not isinstance(config, (int, np.integer)):
    raise PortError(
      f"Draft.build: config= must be an int, got {type(config).__name__} {config!r}. Fix: 0 "
      f"for the drafted module, or k in 1..{configs} for draft.configs[k - 1]."
    )
  if not 0 <= config <= configs:
    which = (
      f"0 (the drafted module) or 1..{configs} (draft.configs[k - 1])"
      if configs
      else "0 (the drafted module; this draft traced no other configuration)"
    )
    raise PortError(f"Draft.build: config={config} is not one of the draft's: pass {which}.")
