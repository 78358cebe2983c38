"""The declaration spec: `capacity=` / `overflow=` validated once, and resolved to sow sites.

Every entry (`lb.ToNNX(...)`, `lb.lazy_init`, `lb.preallocate`, `lb.capacity`) builds one
`DeclarationSpec` from what it was given and passes that on; nothing downstream validates
again or changes its form (a capacity mapping is a hashable `FrozenDict` from the start, so an
`lb.ToNNX` can keep its own spec in the GraphDef).

A capacity is an `int` for every site, or a mapping whose keys are a collection name
(`"intermediates"`), a `/`-joined sow path inside its collection (`"ScanBlock_0/carry"`), or an
`fnmatch` glob of one (`"ScanBlock_0/*"`; `*` also matches `/`). The most specific key wins:
exact path, then glob, then collection name.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import fnmatch
import operator
import typing as tp

import jax
import jax.core
from flax.core import FrozenDict

from .errors import CapacityError
from .memory import check_memory_spec

# What a write past a full buffer does; the one default is DEFAULT_OVERFLOW.
Overflow = tp.Literal["error", "drop", "wrap"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = tp.get_args(Overflow)
DEFAULT_OVERFLOW: Overflow = "error"

CapacitySpec = int | tp.Mapping[str, int]
# A sow site: (collection, *path inside the collection),
# e.g. ("intermediates", "ScanBlock_0", "carry").
SiteKey = tuple[str, ...]

_CAPACITY_HELP = (
  "Pass a positive int for every sow site (capacity=8) or a mapping from a collection name, "
  "a '/'-joined sow path or a glob of one to a positive int "
  "(capacity={'intermediates': 8, 'ScanBlock_0/*': 2})."
)


# The default of `with lb.capacity(N):`. A ContextVar, not a global: private to the thread (and
# task) that opened the block. Read once per declaration by the entries, passed on as a value.
_SCOPED: contextvars.ContextVar[CapacitySpec | None] = contextvars.ContextVar(
  "loopbridge_capacity", default=None
)


@contextlib.contextmanager
def capacity(spec: CapacitySpec | None) -> tp.Iterator[None]:
  """A default capacity for every declaration made inside the block.

  For code you cannot edit: a third-party constructor that calls `model.lazy_init(...)` on an
  `lb.ToNNX` without `capacity=` declares its buffers with `spec` when built inside the block.
  Precedence, most specific first: `capacity=` given to `lb.lazy_init`/`lb.preallocate`, then
  `lb.ToNNX(..., capacity=)`, then this block (the innermost one when nested). One block covers
  many declarations, so a key of a mapping that matches no site of one of them is not an error
  (a site no key covers still is). `lb.capacity(None)` turns an outer block off.

  Args:
    spec: an int for every sow site, or a mapping as for `lb.lazy_init`'s `capacity=`.

  Returns:
    A context manager: use it in a `with` statement.

  Raises:
    CapacityError: a malformed `spec` (checked when the block opens).

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> from flax import linen as nn, nnx
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     self.sow("intermediates", "x", x)
    ...     return x
    >>> with lb.capacity(3):
    ...   model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
    ...   _ = model.lazy_init(jnp.ones(2))  # as third-party code would call it
    >>> lb.buffers(model)["intermediates"]["x"].shape
    (3, 2)
  """
  token = _SCOPED.set(check_capacity_spec(spec))
  try:
    yield
  finally:
    _SCOPED.reset(token)


def scoped_capacity() -> CapacitySpec | None:
  """The capacity of the innermost open `lb.capacity` block (None outside any)."""
  return _SCOPED.get()


def site_path_str(site: SiteKey) -> str:
  """Path inside the collection: `("intermediates", "Block_0", "carry")` -> `"Block_0/carry"`."""
  return "/".join(site[1:])


def site_label(site: SiteKey) -> str:
  """Human-readable name of a site for messages: `intermediates/ScanBlock_0/carry`."""
  return "/".join(site)


def check_capacity_value(value: object, where: str) -> int:
  """One capacity number: a static, positive Python/NumPy integer (not bool, not a tracer)."""
  if isinstance(value, jax.core.Tracer):
    raise CapacityError(
      f"{where} is a traced value ({value}). Buffers are allocated with a static shape, so the "
      "capacity must be known when the model is built, outside jit/vmap/loops. "
      "Fix: pass a plain Python int."
    )
  if isinstance(value, bool) or not hasattr(value, "__index__"):
    raise CapacityError(
      f"{where} must be a positive int, got {value!r} of type {type(value).__name__}. "
      f"{_CAPACITY_HELP}"
    )
  try:
    number = operator.index(tp.cast(tp.SupportsIndex, value))
  except TypeError:  # an array: only a 0-d integer array is one number
    raise CapacityError(
      f"{where} must be a positive int, got a {getattr(value, 'dtype', '?')} array of shape "
      f"{getattr(value, 'shape', '?')}: a capacity is a single integer (the number of slots). "
      f"{_CAPACITY_HELP}"
    ) from None
  if number <= 0:
    raise CapacityError(
      f"{where} must be a positive int, got {number}: a buffer needs room for at least one "
      f"value. {_CAPACITY_HELP}"
    )
  return number


def check_capacity_spec(capacity: object) -> int | FrozenDict[str, int] | None:
  """Validate the form of a capacity declaration before any model code runs."""
  if capacity is None:
    return None
  if isinstance(capacity, tp.Mapping):
    if not capacity:
      raise CapacityError(f"capacity={{}} declares nothing. {_CAPACITY_HELP}")
    out: dict[str, int] = {}
    for key, value in tp.cast(tp.Mapping[object, object], capacity).items():
      if not isinstance(key, str) or not key:
        raise CapacityError(
          f"capacity key {key!r} must be a non-empty string (a collection name, a '/'-joined "
          f"sow path, or a glob). {_CAPACITY_HELP}"
        )
      out[key] = check_capacity_value(value, f"capacity[{key!r}]")
    return FrozenDict(out)
  return check_capacity_value(capacity, "capacity")


def check_overflow(overflow: object) -> Overflow:
  """Validate an overflow policy name."""
  if not isinstance(overflow, str) or overflow not in OVERFLOW_POLICIES:
    raise CapacityError(
      f"overflow={overflow!r} is not a policy loopbridge knows. Choose one of "
      "'error' (keep the first `capacity` values and raise when they are read back after more "
      "were sown), 'drop' (keep the first `capacity`, silently) or 'wrap' (ring buffer: keep "
      "the last `capacity`)."
    )
  return tp.cast(Overflow, overflow)


@dataclasses.dataclass(frozen=True)
class DeclarationSpec:
  """What one declaration asked for, validated: a capacity and an overflow policy.

  `None` means "not given here": a lower-precedence source decides (see `lb.capacity`).
  Built where the values enter, from the checks of this module (`DeclarationSpec.checked` for
  the entries); it is hashable, so an `lb.ToNNX` keeps its own as a static attribute.
  """

  capacity: int | FrozenDict[str, int] | None = None
  overflow: Overflow | None = None
  # Where the records live ("device", "host", or a mapping as for capacity; see `memory`).
  memory: str | FrozenDict[str, str] | None = None

  def __repr__(self) -> str:  # one line (FrozenDict's own repr spans several)
    capacity = dict(self.capacity) if isinstance(self.capacity, FrozenDict) else self.capacity
    memory = dict(self.memory) if isinstance(self.memory, FrozenDict) else self.memory
    return f"DeclarationSpec(capacity={capacity!r}, overflow={self.overflow!r}, memory={memory!r})"

  @classmethod
  def checked(
    cls, capacity: object = None, overflow: object = None, memory: object = None
  ) -> DeclarationSpec:
    """Validate `capacity=`, `overflow=` and `memory=` as a user gave them (CapacityError if
    malformed)."""
    return cls(
      check_capacity_spec(capacity),
      None if overflow is None else check_overflow(overflow),
      check_memory_spec(memory),
    )


NO_CAPACITY_FIX = (
  "Fix, any one of: lb.lazy_init(model, *args, capacity=N) (or lb.preallocate(...)) with an "
  "int for every site or a mapping per path, e.g. capacity={'intermediates': 16}; "
  "lb.ToNNX(module, rngs=..., capacity=N) when building the wrapper; or, when the code that "
  "calls lazy_init is not yours (a third-party model's __init__), build the model inside "
  "`with lb.capacity(N):`."
)


def resolve_capacities(
  capacity: CapacitySpec | None,
  sites: tp.Sequence[SiteKey],
  *,
  model_name: str = "the model",
  unused_ok: bool = False,
) -> dict[SiteKey, int]:
  """Map every site to its capacity; every site must be covered and every key must match.

  `unused_ok`: keys that match no site are allowed (an `lb.capacity` block's default).
  """
  if not sites:
    return {}
  if capacity is None:
    listing = ", ".join(site_label(s) for s in sites)
    raise CapacityError(
      f"{model_name} sows at {len(sites)} site(s) ({listing}) but no capacity was declared. "
      "Why: inside NNX loops every recorded value needs a preallocated buffer of fixed size. "
      + NO_CAPACITY_FIX
    )
  if not isinstance(capacity, tp.Mapping):
    return dict.fromkeys(sites, capacity)

  resolved: dict[SiteKey, int] = {}
  used: set[str] = set()
  uncovered = []
  for site in sites:
    path = site_path_str(site)
    if path in capacity:
      resolved[site] = capacity[path]
      used.add(path)
      continue
    globs = [k for k in capacity if any(c in k for c in "*?[") and fnmatch.fnmatchcase(path, k)]
    if globs:
      values = {capacity[k] for k in globs}
      if len(values) > 1:
        raise CapacityError(
          f"sow site {site_label(site)} matches several capacity globs with different values: "
          + ", ".join(f"{k!r}: {capacity[k]}" for k in globs)
          + ". Fix: add an exact key for this path, or make the globs disjoint."
        )
      resolved[site] = values.pop()
      used.update(globs)
      continue
    if site[0] in capacity:
      resolved[site] = capacity[site[0]]
      used.add(site[0])
      continue
    uncovered.append(site)

  all_paths = ", ".join(f"{s[0]}: {site_path_str(s)!r}" for s in sites)
  if uncovered:
    raise CapacityError(
      "no capacity key covers sow site(s) "
      + ", ".join(site_label(s) for s in uncovered)
      + f". Why: every site needs a buffer size. The sites of this call are: {all_paths}. "
      "Fix: add a key for the path, a glob, or the collection name (e.g. 'intermediates')."
    )
  unused = [k for k in capacity if k not in used]
  if unused and not unused_ok:
    raise CapacityError(
      f"capacity key(s) {unused} match no sow site of this call. Why: a key that matches "
      "nothing is usually a typo and would silently leave a site without the size you meant. "
      f"The sites of this call are: {all_paths}. Keys are a collection name, a '/'-joined "
      "path inside the collection, or a glob of one."
    )
  return resolved
