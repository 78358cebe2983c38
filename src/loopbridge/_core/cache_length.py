"""Warn about flax attention caches too short for the loop a declaration prepares.

Flax's `nn.MultiHeadDotProductAttention(decode=True)` (and `nnx.MultiHeadAttention`) size their
`cached_key`/`cached_value` from the input given to `init`; each decoding step writes one
position. A loop with more steps than the cache has positions writes past its end, which
`dynamic_update_slice` clamps to the last slot: decoding goes on with no error and samples
other tokens than the model's own decode. The capacity declared for a part is the number of
calls the user plans to record, so a capacity larger than a cache of that part says the loop
will overrun it. A cache of length 1 right after `lazy_init` is the usual cause (init on the
one-token step signature instead of the full length).
"""

from __future__ import annotations

import typing as tp
import warnings

from flax import nnx

from .. import _compat
from . import recorder
from .errors import CacheLengthWarning

if tp.TYPE_CHECKING:
  from .declare import Part

CACHE_NAME = "cached_key"  # flax's name (Linen and NNX attention, and most hand-written caches)

_TOO_SHORT = (
  "lb.{entry}: the attention cache '{path}' holds {length} position(s) (cached_key "
  "{shape}, length axis -3) but capacity {capacity} is declared for '{part}', so a loop "
  "recording {capacity} one-token steps writes past its end. Why: a decode=True cache is "
  "sized by the input given to init, and flax clamps writes past the end to the last slot, "
  "so decoding continues silently with wrong tokens. Fix: initialize on the full length and "
  "declare the one-token step separately: lb.lazy_init(model, tokens_of_max_length, "
  "capacity=N) then lb.preallocate(model, tokens[:, :1], capacity=N); or declare "
  "capacity <= {length}."
)
_ONE_POSITION = (
  "lb.lazy_init: the attention cache '{path}' has length 1 (cached_key {shape}): the model "
  "was initialized on a single token, so decoding past the first position writes over the "
  "same slot with no error (flax does not check) and samples wrong tokens. Why: a "
  "decode=True cache is sized by the input given to init. Fix: initialize on the full "
  "length, then declare the one-token step: lb.lazy_init(model, tokens_of_max_length, "
  "capacity=N) then lb.preallocate(model, tokens[:, :1], capacity=N)."
)


def _caches(node: nnx.Module) -> tp.Iterator[tuple[str, nnx.Variable]]:
  """('/'-joined path, Variable) of every attention cache under `node`."""
  for path, child in _compat.iter_graph(node):
    if (
      isinstance(child, nnx.Variable)
      and issubclass(type(child), nnx.Cache)
      and path
      and path[-1] == CACHE_NAME
    ):
      shape = getattr(_compat.variable_value(child), "shape", ())
      if len(shape) >= 3:  # (*batch, length, heads, head_dim)
        yield "/".join(map(str, path)), child


def _under(
  caches: tp.Sequence[tuple[str, nnx.Variable]], prefix: tuple[str, ...]
) -> tp.Iterator[tuple[str, nnx.Variable]]:
  """The caches whose path starts with `prefix`, with their path relative to it."""
  head = "/".join(prefix)
  for path, cache in caches:
    if not head:
      yield path, cache
    elif path.startswith(head + "/"):
      yield path[len(head) + 1 :], cache


def _length(cache: nnx.Variable) -> tuple[int, tuple[int, ...]]:
  shape = tuple(_compat.variable_value(cache).shape)
  return shape[-3], shape


def warn_short_caches(root: nnx.Module, parts: tp.Sequence[Part], entry: str) -> None:
  """Warn once per cache that is shorter than the capacity declared for its part, and (after
  `lazy_init`) once per cache of length 1. `parts` are the declaration's `_declare.Part`s."""
  warned: set[int] = set()
  # One walk of the whole graph (a Python-level traversal costs milliseconds on a model with
  # many Variables); each part takes the caches under its own path.
  all_caches = list(_caches(root))
  for part in parts:
    # The part's sites, not yet in their signature's slot: matched by signature and path.
    keys = {(s.signature, s.collection, s.path, s.leaf) for s in part.sites}
    declared = [
      s.capacity
      for s in (recorder.sites_of(part.node) or ())
      if (s.signature, s.collection, s.path, s.leaf) in keys and s.capacity is not None
    ]
    if not declared:
      continue
    capacity = max(declared)
    prefix = tuple(map(str, part.path))
    for path, cache in _under(all_caches, prefix):
      length, shape = _length(cache)
      if capacity > length and id(cache) not in warned:
        warned.add(id(cache))
        warnings.warn(
          _TOO_SHORT.format(
            entry=entry,
            path="/".join((*prefix, path)),
            length=length,
            shape=shape,
            capacity=capacity,
            part="/".join(prefix) or "the model",
          ),
          CacheLengthWarning,
          stacklevel=3,
        )
  if entry != "lazy_init":
    return
  for path, cache in all_caches:
    length, shape = _length(cache)
    if length == 1 and id(cache) not in warned:
      warned.add(id(cache))
      warnings.warn(_ONE_POSITION.format(path=path, shape=shape), CacheLengthWarning, stacklevel=3)
