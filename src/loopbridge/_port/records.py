"""The records a draft is made of: extra calls, TODOs, changes and the check's verdict."""

from __future__ import annotations

import dataclasses
import typing as tp


class Call:
  """One extra call to check the port on, e.g. `Call(x, train=False)` or `Call(t, method='decode')`.

  Args:
    *args: positional inputs of the call.
    method: the Linen method name (as in `Module.apply(..., method=...)`); None for `__call__`.
    **kwargs: keyword inputs of the call.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> lb.port.Call(jnp.ones((1, 3)), train=False).kwargs
    {'train': False}
  """

  __slots__ = ("args", "kwargs", "method")

  def __init__(self, *args: tp.Any, method: str | None = None, **kwargs: tp.Any):
    self.args = args
    self.method = method
    self.kwargs = kwargs

  def __setattr__(self, name: str, value: object) -> None:
    if hasattr(self, name):
      raise AttributeError(f"lb.port.Call is frozen: {name} cannot be set again.")
    object.__setattr__(self, name, value)

  def label(self) -> str:
    parts = [f"{type(a).__name__}{list(getattr(a, 'shape', []))}" for a in self.args]
    parts += [f"{k}={v!r}" for k, v in self.kwargs.items()]
    return f"{self.method or '__call__'}({', '.join(parts)})"

  def __repr__(self) -> str:
    return f"Call<{self.label()}>"


@dataclasses.dataclass(frozen=True)
class Todo:
  """A place the draft could not translate: kept as the original lines in a TODO block.

  Attributes:
    file: the Linen source file.
    line: the line in that file where the untranslated code starts.
    reason: why it was not translated, and what to do by hand.
    original: the original source lines.
  """

  file: str
  line: int
  reason: str
  original: str


@dataclasses.dataclass(frozen=True)
class Change:
  """One change the draft made, as a report row.

  Attributes:
    file: the Linen source file.
    line: the line of the original code.
    old: the original code (one line, shortened).
    new: what it became.
    why: the reason, in a few words.
  """

  file: str
  line: int
  old: str
  new: str
  why: str


@dataclasses.dataclass(frozen=True)
class Check:
  """The measured verdict of a draft: its port run against the Linen model, call by call.

  Attributes:
    equal: every call ran and every aligned module call agreed within tolerance.
    reports: one `lb.ParityReport` per checked call (sample call first).
    first_divergence: where the first unequal call first diverged (call, module path, the
      drafted line the module was built on), or None.
    error: why the check could not run to the end (building, converting or running), or None.
    checked: what the port was checked at besides the given calls, in order (random inputs,
      another configuration, an input of another size).
  """

  equal: bool
  reports: tuple[tp.Any, ...]
  first_divergence: str | None
  error: str | None
  checked: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class PortOf:
  """A constructor argument that is itself a drafted port, in `Draft.init_kwargs`.

  A Linen module handed to another as a dataclass field (`Holder(child=Child())`) is handed
  to the port as the port of that module; `Draft.build` builds it from the draft's source,
  with the same `rngs`, before the module that takes it.

  Attributes:
    cls: the drafted class to build.
    kwargs: its constructor arguments (others may be `PortOf` in turn), without `rngs`.
  """

  cls: str
  kwargs: dict[str, object]
