"""The call conversion runs both models on, checked where it enters: `sample_kwargs=`,
`method=` and `probes=`, each refused with what it takes before anything runs."""

from __future__ import annotations

import typing as tp

from flax import linen as nn
from flax import nnx

from .._core.errors import CheckpointError
from .convert_probes import ProbeSpec, checked_probes


def check_call(
  linen_module: nn.Module,
  port: nnx.Module,
  sample_kwargs: tp.Mapping[str, tp.Any] | None,
  method: str | None,
  probes: ProbeSpec,
) -> int | list[tuple[tuple[object, ...], dict[str, object]]]:
  """The sample call's `method=` and `sample_kwargs=` name something both models can run;
  returns `probes=` checked (`convert_probes.checked_probes`)."""
  if sample_kwargs is not None and not isinstance(sample_kwargs, tp.Mapping):
    raise CheckpointError(
      f"sample_kwargs= takes the keyword arguments of the sample call as a dict "
      f"(e.g. {{'train': False}}), got {sample_kwargs!r}."
    )
  if method is None:
    return checked_probes(probes)
  if not isinstance(method, str):
    raise CheckpointError(
      f"method= takes the name of the method both models run (e.g. 'encode'), got {method!r}."
    )
  for side, model in (("Linen model", linen_module), ("port", port)):
    if not callable(getattr(type(model), method, None)):
      raise CheckpointError(
        f"method={method!r}: the {side} {type(model).__name__} has no method {method!r}. "
        "Fix: name a method both models define (the port keeps the Linen method's name)."
      )
  return checked_probes(probes)
