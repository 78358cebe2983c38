"""Whether the sample call draws random numbers, told by running Linen twice (flax's seq2seq
decoder samples its prediction with `self.make_rng('lstm')` on every call).

The port draws from its own `nnx.Rngs` streams; no key the port is given reproduces the keys
Linen derives for a module, so an output that depends on a draw cannot be equal. A check that
fails on such a call says so, and what to check instead, rather than only that it differs.
"""

from __future__ import annotations

import re
import typing as tp

import jax
import numpy as np

from ..records import Call, Check

# What `self.make_rng('<stream>')` became in the drafted source.
_DRAWN = re.compile(r"self\.rngs\.(\w+)\(\)")


def _keys(seed: int, streams: tp.Iterable[str]) -> dict[str, jax.Array]:
  return {s: jax.random.fold_in(jax.random.key(seed), i) for i, s in enumerate(sorted(streams))}


def draws(
  module: tp.Any, variables: tp.Mapping[str, object], call: Call, streams: set[str]
) -> bool:
  """Linen's output on the call changes with the rng keys of its streams."""
  names = {"params", "dropout", *streams}
  kwargs = dict(call.kwargs)
  first, second = (
    module.apply(variables, *call.args, method=call.method, rngs=_keys(seed, names), **kwargs)
    for seed in (0, 1)
  )
  return any(
    np.shape(a) != np.shape(b) or not np.array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second))
  )


def explained(check: Check, module: tp.Any, variables: tp.Any, call: Call, source: str) -> Check:
  """`check` (not equal), said to come from random draws when the sample call draws."""
  found = sorted(set(_DRAWN.findall(source)))
  try:
    if variables is None:
      variables = module.init(
        _keys(0, {"params", "dropout", *found}), *call.args, method=call.method, **call.kwargs
      )
    random = draws(module, variables, call, set(found))
  except Exception:  # the check's own verdict stands
    return check
  if not random:
    return check
  where = ", ".join(repr(s) for s in found)
  why = (
    f"the sample call {call.label()} draws random numbers (Linen's output changes with the rng "
    f"keys it is given{'; the source draws from ' + where if where else ''}). The port draws "
    "from its own nnx.Rngs streams, whose keys cannot be Linen's, so outputs that depend on a "
    "draw cannot be equal: check the port on a call that draws nothing (the flag that makes "
    "the model deterministic), or compare by hand what does not depend on the draws"
  )
  before = check.error or (
    f"first divergence at {check.first_divergence}" if check.first_divergence else None
  )
  return Check(
    False, check.reports, check.first_divergence, why + (f" ({before})" if before else "")
  )
