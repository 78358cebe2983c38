"""The records the pipeline passes along: one observed `sow` call, one sow site, one dropped sow.

Stage 0 of the data path (discover -> declare -> append -> read): plain frozen dataclasses and
no behaviour, so every later stage can import them. A `SowSite` is the single description of a
site from discovery to the `lb.sow_sites` report: discovery fills what one call sows, the
declaration adds `capacity` and `overflow`, and the declared tuple is kept on the recorder.
"""

from __future__ import annotations

import dataclasses
import math
import typing as tp

import jax
import numpy as np

from .capacity import Overflow

# Lifted transforms that add an axis to the collections they carry.
STACKING_KINDS = ("scan", "vmap")


@dataclasses.dataclass(frozen=True)
class Transform:
  """A Linen lifted transform (`nn.scan`, `nn.vmap`, `nn.remat`, ...) enclosing a sow.

  `axis`/`length` describe the axis it stacks the sown values along in the recorded value
  (`None` for transforms that add none, such as `nn.remat`, or when it cannot be told apart).
  `carries` says whether it carries the sow's collection out (if not, Linen drops the sow).
  """

  kind: str  # flax's name for it: "scan", "vmap", "remat", "jit", ...
  path: tuple[str, ...]  # Linen path of the transformed module
  axis: int | None = None
  length: int | None = None
  reverse: bool = False  # nn.scan(reverse=True)
  carries: bool = True

  def label(self) -> str:
    if self.kind not in STACKING_KINDS:
      return self.kind
    axis = "?" if self.axis is None else self.axis
    length = "?" if self.length is None else self.length
    return f"{self.kind}(axis={axis}, len={length}{', reverse' if self.reverse else ''})"

  def to_dict(self) -> dict[str, str | int | bool | None]:
    return {
      "kind": self.kind,
      "path": "/".join(self.path),
      "axis": self.axis,
      "length": self.length,
      "reverse": self.reverse,
    }


@dataclasses.dataclass(frozen=True)
class SowCall:
  """One `sow` call seen while discovering (Linen `Module.sow` or native `nnx.Module.sow`)."""

  collection: str
  module_path: tuple[str, ...]  # Linen scope path (native: empty, the state diff locates it)
  name: str
  shape: tuple[int, ...] | None  # None when the sown value is not a single array
  dtype: str | None
  default_reduce: bool  # the tuple-append reduce/init of `sow`: a record, not state
  dropped: bool = False  # Linen discarded it: the collection was not mutable in this scope
  module_type: str = ""
  init_fn: tp.Callable[[], object] | None = dataclasses.field(compare=False, default=None)
  transforms: tuple[Transform, ...] = ()  # enclosing lifted transforms, outermost first
  # A pytree value (tuple, dict, struct dataclass): each array leaf's shape, in flatten order
  # (`None` for a leaf that is not an array); `None` when the value is a single array.
  leaf_shapes: tuple[tuple[int, ...] | None, ...] | None = None

  @property
  def site(self) -> tuple[str, ...]:
    return (self.collection, *self.module_path, self.name)


class NNXAccumulatorInit:
  """The `init_fn` of an NNX module's custom-reduce `sow` that a wrapper such as
  `nnx.bridge.ToLinen` writes into a Linen collection (not through Linen's `sow`).

  Such an accumulator is state the NNX module reduces into on every call, so each call must be
  given it back as a Variable of `variable_type` (flax's wrapper rebuilds the NNX module from
  the Linen variables); the mark tells the bridged part to do that.
  """

  def __init__(self, init_fn: tp.Callable[[], object], variable_type: object):
    self.init_fn = init_fn
    self.variable_type = variable_type

  def __call__(self) -> object:
    return self.init_fn()


@dataclasses.dataclass(frozen=True)
class SowSite:
  """One recorded sow site: what one value looks like and what its buffer holds.

  Attributes:
    collection: the collection sown into (`"intermediates"`, ...).
    path: the path inside the collection, as in `lb.recorded(model)[collection]`.
    shape: one recorded value, including axes added by `nn.scan` / `nn.vmap`.
    dtype: the recorded dtype.
    sown_shape: the shape passed to `sow` inside the module (`None` if unknown).
    per_call: values one call adds.
    transforms: enclosing Linen lifted transforms, outermost first.
    capacity: buffer slots (`None` before the declaration).
    overflow: `"error"`, `"drop"` or `"wrap"` (`None` before the declaration).
    stack_axes: leading axes of the buffer added by stacking the sowing module (`nnx.vmap`
      layer stacks keep their buffers `(*stack, capacity, *value)`); 0 for most sites.
    leaf: for a sown pytree (tuple, dict, struct dataclass), this leaf's keys inside it, e.g.
      `("1",)` for the second entry of a tuple; `()` when the sown value is one array. Each
      array leaf is its own site (own buffer and count) under the sow's path.
    treedef: the sown pytree's structure (`None` for an array); `lb.recorded` rebuilds it.
    leaf_index: the leaf's position in the flattened pytree.
    signature: the call signature the site was declared for (an `lb.ToNNX` call's method and
      argument shapes, e.g. `"(float32[2,1,32])"`); `""` for native sows, which keep one
      signature per site.
    slot: where that signature's buffers sit on the recorder: 0 (the first signature declared)
      at the site's Linen path, as before signatures existed; later ones under
      `loopbridge__signature_<slot>`.
    count_index: the site's entry in its recorder's `Count` vector, fixed when the site is
      first declared (-1 before); later sites and signatures take the next entries.
  """

  collection: str
  path: tuple[str, ...]
  shape: tuple[int, ...]
  dtype: str
  sown_shape: tuple[int, ...] | None = None
  per_call: int = 1
  transforms: tuple[Transform, ...] = ()
  capacity: int | None = None
  overflow: Overflow | None = None
  stack_axes: int = 0
  leaf: tuple[str, ...] = ()
  treedef: tp.Any = None
  leaf_index: int = 0
  signature: str = ""
  slot: int = 0
  count_index: int = -1

  @property
  def key(self) -> tuple[str, ...]:
    """Where the buffer sits in the recorder's buffer tree: `(collection, *path, *leaf)`,
    behind the signature's slot key for every signature but the first."""
    return (*slot_prefix(self.slot), self.collection, *self.path, *self.leaf)

  @property
  def sow_key(self) -> tuple[str, ...]:
    """`(collection, *path)`: the sow this site belongs to (all leaves of a pytree share it)."""
    return (self.collection, *self.path)

  @property
  def name(self) -> str:
    """The `/`-joined path inside the collection (the key `capacity=` mappings use)."""
    return "/".join(self.path)

  @property
  def label(self) -> str:
    """`name`, then the leaf inside a sown pytree: `"Block_0/__call__[1]"`."""
    return self.name + "".join(f"[{k}]" for k in self.leaf)

  @property
  def value_shape(self) -> tuple[int, ...]:
    """One recorded value without the stack axes."""
    return self.shape[self.stack_axes :]

  @property
  def buffer_shape(self) -> tuple[int, ...]:
    """`(*stack, capacity, *value)`."""
    return (*self.shape[: self.stack_axes], self.capacity or 0, *self.value_shape)

  @property
  def lifted(self) -> bool:
    """Whether the site lies inside an `nn.scan` / `nn.vmap` that stacks its values."""
    return any(t.kind in STACKING_KINDS for t in self.transforms)

  @property
  def calls_to_fill(self) -> int:
    """Calls the buffer holds before it is full."""
    capacity = self.capacity or 0
    return capacity // self.per_call if self.per_call else capacity

  @property
  def buffer_bytes(self) -> int:
    """Bytes of the buffer (capacity times one value; stacked layers count each layer)."""
    return math.prod(self.buffer_shape) * np.dtype(self.dtype).itemsize

  def to_dict(self) -> dict[str, object]:
    return {
      "collection": self.collection,
      "path": self.name,
      "shape": list(self.shape),
      "dtype": self.dtype,
      "sown_shape": None if self.sown_shape is None else list(self.sown_shape),
      "per_call": self.per_call,
      "lifted": self.lifted,
      "in_scan": any(t.kind == "scan" for t in self.transforms),
      "in_vmap": any(t.kind == "vmap" for t in self.transforms),
      "transforms": [t.to_dict() for t in self.transforms],
      "capacity": self.capacity,
      "overflow": self.overflow,
      "calls_to_fill": self.calls_to_fill,
      "buffer_bytes": self.buffer_bytes,
      "leaf": list(self.leaf) if self.treedef is not None else None,
      "signature": self.signature,
    }


SLOT_KEY_PREFIX = "loopbridge__signature_"


def slot_prefix(slot: int) -> tuple[str, ...]:
  """The buffer-tree key in front of a signature's sites: none for the first signature, so a
  model declared for one signature keeps the state layout (and checkpoints) it always had."""
  return (f"{SLOT_KEY_PREFIX}{slot}",) if slot else ()


def split_slot(key: tuple[str, ...]) -> tuple[int, tuple[str, ...]]:
  """(slot, key without the slot prefix) of a buffer-tree key."""
  if key and key[0].startswith(SLOT_KEY_PREFIX):
    return int(key[0][len(SLOT_KEY_PREFIX) :]), key[1:]
  return 0, key


def key_str(entry: object) -> str:
  """One step of a jax key path as a plain string (a dict key in the buffer tree)."""
  for attr in ("key", "idx", "name"):  # DictKey/FlattenedIndexKey, SequenceKey, GetAttrKey
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def linen_key(path: tp.Sequence[object]) -> tuple[str, ...]:
  """The Linen name of an NNX graph path: a list index joins the name before it.

  Linen names submodules made in a loop `layers_0`, `layers_1` (and `unstack_params` names
  scanned layers so), where an NNX port holds a list `self.layers[0]`.

  Args:
    path: a path as `nnx.iter_graph` gives it.

  Returns:
    The path's keys as strings, each list index merged into the name before it.

  Examples:
    >>> linen_key(('layers', 0, 'Dense_0', 'kernel'))
    ('layers_0', 'Dense_0', 'kernel')
  """
  key: list[str] = []
  for part in path:
    if isinstance(part, int) and key:
      key[-1] = f"{key[-1]}_{part}"
    else:
      key.append(str(part))
  return tuple(key)


def flatten_value(value: tp.Any) -> tuple[tp.Any, list[tuple[tuple[str, ...], tp.Any]]]:
  """A sown value's pytree structure and its leaves, each with its keys as strings.

  An array is one leaf with keys `()`; a tuple `(out, weights)` gives leaves `("0",)` and
  `("1",)`; `None` entries are structure, not leaves (as everywhere in JAX).
  """
  with_path, treedef = jax.tree_util.tree_flatten_with_path(value)
  return treedef, [(tuple(key_str(e) for e in path), leaf) for path, leaf in with_path]


def is_pytree_value(treedef: tp.Any, leaves: tp.Sequence[tuple[tuple[str, ...], tp.Any]]) -> bool:
  """Whether a flattened sown value is a container rather than one array."""
  return not (len(leaves) == 1 and leaves[0][0] == () and treedef.num_nodes == 1)


@dataclasses.dataclass(frozen=True)
class DroppedSow:
  """A `sow` Linen discarded: an enclosing lifted transform does not carry its collection."""

  collection: str
  module_path: tuple[str, ...]  # Linen path of the module calling `sow`
  name: str
  module_type: str
  shape: tuple[int, ...] | None
  dtype: str | None
  dropped_by: Transform | None  # the innermost transform not carrying the collection

  @classmethod
  def from_call(cls, call: SowCall) -> DroppedSow:
    culprit = next((t for t in reversed(call.transforms) if not t.carries), None)
    return cls(
      call.collection,
      tuple(call.module_path),
      call.name,
      call.module_type,
      call.shape,
      call.dtype,
      culprit,
    )

  @property
  def fix(self) -> str:
    where = (
      f"the nn.{self.dropped_by.kind} at '{'/'.join(self.dropped_by.path) or '<root>'}'"
      if self.dropped_by is not None
      else "the enclosing lifted transform"
    )
    return f"add '{self.collection}': 0 to the variable_axes of {where}"

  def warning_text(self) -> str:
    culprit = (
      f"nn.{self.dropped_by.kind} at '{'/'.join(self.dropped_by.path) or '<root>'}'"
      if self.dropped_by is not None
      else "lifted transform (nn.scan, nn.vmap, ...)"
    )
    return (
      f"{self.module_type} at Linen path '{'/'.join(self.module_path) or '<root>'}' sows "
      f"'{self.name}' into collection '{self.collection}', but Linen discarded it: an "
      f"enclosing {culprit} does not carry the '{self.collection}' collection, so the value "
      f"is silently lost. Fix: add '{self.collection}': 0 to that transform's `variable_axes` "
      f"(e.g. nn.scan(..., variable_axes={{'params': 0, '{self.collection}': 0}}))."
    )

  def to_dict(self) -> dict[str, object]:
    return {
      "collection": self.collection,
      "module_path": "/".join(self.module_path),
      "name": self.name,
      "module_type": self.module_type,
      "shape": None if self.shape is None else list(self.shape),
      "dtype": self.dtype,
      "dropped_by": None if self.dropped_by is None else self.dropped_by.to_dict(),
      "fix": self.fix,
    }


def with_lengths(
  transforms: tp.Sequence[Transform], shape: tuple[int, ...], sown_shape: tuple[int, ...] | None
) -> tuple[Transform, ...]:
  """Transforms with the length of each stacked axis (and the axis, where discovery missed it)."""
  transforms = list(transforms)
  stacking = [i for i, t in enumerate(transforms) if t.kind in STACKING_KINDS and t.carries]
  axes: dict[int, int | None] = {i: transforms[i].axis for i in stacking}
  lengths: dict[int, int | None] = dict.fromkeys(stacking)
  if sown_shape is not None and len(shape) == len(sown_shape) + len(stacking):
    rest = list(shape)
    if all(axes[i] is not None for i in stacking):
      # Outermost transform first: its axis indexes the final value; removing it gives the
      # value as the next transform inward produced it.
      ok = True
      for i in stacking:
        axis = tp.cast(int, axes[i]) % len(rest) if rest else 0
        if axis >= len(rest):
          ok = False
          break
        lengths[i] = rest.pop(axis)
      if not ok or tuple(rest) != tuple(sown_shape):
        lengths = dict.fromkeys(stacking)
    elif len(stacking) == 1:
      # Axis unknown (e.g. a transform discovery did not see): where one axis can be removed
      # to give the sown shape. Adjacent equal sizes leave the position ambiguous (None).
      (i,) = stacking
      candidates = [a for a in range(len(shape)) if shape[:a] + shape[a + 1 :] == tuple(sown_shape)]
      if candidates:
        lengths[i] = shape[candidates[0]]
        axes[i] = candidates[0] if len(candidates) == 1 else None
  return tuple(
    dataclasses.replace(
      t,
      axis=axes.get(i) if i in axes else None,
      length=lengths.get(i),
      reverse=bool(t.reverse) if t.kind == "scan" else False,
    )
    for i, t in enumerate(transforms)
  )
