"""Which Linen names the draft knows, and what each becomes (one place for the vocabulary)."""

from __future__ import annotations

from flax import linen as nn
from flax import nnx

# `self.<name>(...)` of a Linen module that has no NNX idiom the draft writes (yet): kept as TODO.
UNTRANSLATED_SELF = frozenset(
  {
    "variables",
    "put_variable",
    "get_variable",
    "has_variable",
    "has_rng",
    "scope",
    "path",
    "bind",
    "unbind",
    "apply",
    "init",
    "init_with_output",
    "lazy_init",
    "perturb",
    "param_is_initialized",
    "is_mutable_collection",
    "module_paths",
    "tabulate",
    "copy",
    "clone",
  }
)

# Collection -> the NNX Variable type a `self.variable(collection, ...)` becomes.
VARIABLE_TYPES = {
  "params": "Param",
  "batch_stats": "BatchStat",
  "cache": "Cache",
  "intermediates": "Intermediate",
}


# Linen helpers whose NNX counterpart has another name (same meaning: metadata on the Variable).
# `nn.with_partitioning` boxes Linen's params in `nn.Partitioned`, which NNX's layers cannot
# read: NNX's own function of the same name puts the same sharding on the Variable.
RENAMED = {
  "with_logical_partitioning": "with_partitioning",
  "with_partitioning": "with_partitioning",
}


def nnx_equivalent(dotted_rest: str) -> str | None:
  """`relu` -> `relu` when `nnx.relu` is the very object `nn.relu` is (else None)."""
  if dotted_rest in RENAMED:
    return RENAMED[dotted_rest]
  a, b = nn, nnx
  for part in dotted_rest.split("."):
    a, b = getattr(a, part, None), getattr(b, part, None)
    if a is None or b is None:
      return None
  if a is b:
    return dotted_rest
  # Initializer factories are re-exported under new module objects but are the same functions.
  return dotted_rest if getattr(a, "__wrapped__", a) is getattr(b, "__wrapped__", b) else None


def is_lift(obj: object) -> bool:
  """A Linen lifted transform (`nn.scan`, `nn.remat`, `nn.vmap`, `nn.map_variables`, ...)."""
  return callable(obj) and getattr(obj, "__module__", "").startswith("flax.linen.transforms")
