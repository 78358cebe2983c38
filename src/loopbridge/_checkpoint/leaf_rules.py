"""Leaf transforms: how a Linen array becomes the port's arrays, declared once, run both ways.

Real ports restructure arrays: a fused gate/up projection `[2, D, F]` kept as two `[D, F]`
Linear kernels, a `DenseGeneral` kernel `(D, H, K)` kept as `(D, H*K)`, a transposed kernel,
a renamed leaf. Each rule names Linen leaves and NNX leaves by path (module path and variable
name joined with '/'; `*` matches one path part, and the parts it matches must be equal on both
sides, so `'layers_*/mlp/wi'` pairs with `'layers/*/mlp/up/kernel'` layer by layer). A rule
states the Linen -> NNX direction; `nnx_to_linen` runs its inverse. The shapes come from the
two models, so a rule says only what cannot be read from them (the axis, the permutation).

Each rule's `str` is the call that makes it (`lb.checkpoint.split('mlp/wi', [...], axis=0)`),
so an error can print candidate rules ready to paste.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

import jax.numpy as jnp
import numpy as np

from .._core.errors import CheckpointError

Shape = tuple[int, ...]
Array = tp.Any  # a jax.Array or numpy array


def _quoted(paths: tp.Sequence[str]) -> str:
  return "[" + ", ".join(repr(p) for p in paths) + "]"


@dataclasses.dataclass(frozen=True)
class LeafRule:
  """How Linen leaves become NNX leaves (`linen` and `nnx` are path patterns, in order).

  Make one with `lb.checkpoint.rename`, `transpose`, `reshape`, `split` or `fuse`; pass a
  list of them as `rules=` to `linen_to_nnx` / `nnx_to_linen`. Its `str` is that call.

  Attributes:
    linen: the Linen leaf paths (module path and variable name; `*` matches one part).
    nnx: the port's leaf paths.

  Examples:
    >>> import jax.numpy as jnp, loopbridge as lb
    >>> rule = lb.checkpoint.split('mlp/wi', ['mlp/gate/kernel', 'mlp/up/kernel'], axis=0)
    >>> rule.linen, rule.nnx
    (('mlp/wi',), ('mlp/gate/kernel', 'mlp/up/kernel'))
    >>> [a.shape for a in rule.forward([jnp.zeros((2, 3, 4))], [(3, 4), (3, 4)])]
    [(3, 4), (3, 4)]
  """

  linen: tuple[str, ...]
  nnx: tuple[str, ...]

  def fits(self, linen: tp.Sequence[Shape], nnx: tp.Sequence[Shape]) -> bool:
    """Whether arrays of the `linen` shapes become arrays of the `nnx` shapes."""
    raise NotImplementedError

  def forward(self, arrays: tp.Sequence[Array], nnx: tp.Sequence[Shape]) -> list[Array]:
    """The NNX arrays (of shapes `nnx`) made from the Linen `arrays`."""
    raise NotImplementedError

  def backward(self, arrays: tp.Sequence[Array], linen: tp.Sequence[Shape]) -> list[Array]:
    """The Linen arrays (of shapes `linen`) made from the NNX `arrays`: the inverse."""
    raise NotImplementedError

  def describe(self) -> str:
    """A few words for the report (e.g. 'split axis 0')."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Rename(LeafRule):
  """The NNX leaf is the Linen leaf under another name."""

  def fits(self, linen, nnx):
    return list(linen) == list(nnx)

  def forward(self, arrays, nnx):
    return list(arrays)

  def backward(self, arrays, linen):
    return list(arrays)

  def describe(self):
    return "same array"

  def __str__(self) -> str:
    return f"lb.checkpoint.rename({self.linen[0]!r}, {self.nnx[0]!r})"


@dataclasses.dataclass(frozen=True)
class Transpose(LeafRule):
  """The NNX leaf is the Linen leaf transposed (`axes` as in `jnp.transpose`)."""

  axes: tuple[int, ...] | None = None

  def _axes(self, ndim: int) -> tuple[int, ...]:
    return tuple(reversed(range(ndim))) if self.axes is None else self.axes

  def fits(self, linen, nnx):
    (a,), (b,) = linen, nnx
    axes = self._axes(len(a))
    return sorted(axes) == list(range(len(a))) and tuple(a[i] for i in axes) == tuple(b)

  def forward(self, arrays, nnx):
    return [jnp.transpose(jnp.asarray(arrays[0]), self._axes(np.ndim(arrays[0])))]

  def backward(self, arrays, linen):
    inverse = tuple(int(i) for i in np.argsort(self._axes(np.ndim(arrays[0]))))
    return [jnp.transpose(jnp.asarray(arrays[0]), inverse)]

  def describe(self):
    return "transposed" if self.axes is None else f"transposed {list(self.axes)}"

  def __str__(self) -> str:
    axes = "" if self.axes is None else f", axes={tuple(self.axes)!r}"
    return f"lb.checkpoint.transpose({self.linen[0]!r}, {self.nnx[0]!r}{axes})"


@dataclasses.dataclass(frozen=True)
class Reshape(LeafRule):
  """The NNX leaf is the Linen leaf reshaped (row-major), e.g. `(D, H, K)` -> `(D, H*K)`."""

  def fits(self, linen, nnx):
    (a,), (b,) = linen, nnx
    return tuple(a) != tuple(b) and int(np.prod(a)) == int(np.prod(b))

  def forward(self, arrays, nnx):
    return [jnp.reshape(jnp.asarray(arrays[0]), nnx[0])]

  def backward(self, arrays, linen):
    return [jnp.reshape(jnp.asarray(arrays[0]), linen[0])]

  def describe(self):
    return "reshaped"

  def __str__(self) -> str:
    return f"lb.checkpoint.reshape({self.linen[0]!r}, {self.nnx[0]!r})"


def _parts_fit(whole: Shape, parts: tp.Sequence[Shape], axis: int) -> str | None:
  """'stack' when the parts are `whole` indexed along `axis`, 'concat' when they are
  consecutive slices of it along `axis`, else None."""
  if not -len(whole) <= axis < len(whole) or len(parts) < 2:
    return None
  axis %= len(whole)
  rest = whole[:axis] + whole[axis + 1 :]
  if whole[axis] == len(parts) and all(tuple(p) == rest for p in parts):
    return "stack"
  same_rest = all(len(p) == len(whole) and tuple(p[:axis] + p[axis + 1 :]) == rest for p in parts)
  if same_rest and sum(p[axis] for p in parts) == whole[axis]:
    return "concat"
  return None


def _cut(array: Array, parts: tp.Sequence[Shape], axis: int, how: str) -> list[Array]:
  array = jnp.asarray(array)
  if how == "stack":
    return [jnp.take(array, i, axis=axis) for i in range(len(parts))]
  ends = np.cumsum([p[axis] for p in parts])[:-1]
  return list(jnp.split(array, ends, axis=axis))


def _join(arrays: tp.Sequence[Array], axis: int, how: str) -> Array:
  arrays = [jnp.asarray(a) for a in arrays]
  return jnp.stack(arrays, axis=axis) if how == "stack" else jnp.concatenate(arrays, axis=axis)


@dataclasses.dataclass(frozen=True)
class Split(LeafRule):
  """One Linen leaf is several NNX leaves along `axis`: indexed (`[2, D, F]` -> two `[D, F]`)
  or cut into consecutive slices (`[D, 3*E]` -> three `[D, E]`), as the shapes say."""

  axis: int = 0

  def fits(self, linen, nnx):
    return len(linen) == 1 and bool(_parts_fit(tuple(linen[0]), [tuple(s) for s in nnx], self.axis))

  def forward(self, arrays, nnx):
    whole = np.shape(arrays[0])
    how = tp.cast(str, _parts_fit(whole, [tuple(s) for s in nnx], self.axis))
    return _cut(arrays[0], nnx, self.axis % len(whole), how)

  def backward(self, arrays, linen):
    how = tp.cast(str, _parts_fit(tuple(linen[0]), [np.shape(a) for a in arrays], self.axis))
    return [_join(arrays, self.axis % len(linen[0]), how)]

  def describe(self):
    return f"split along axis {self.axis}"

  def __str__(self) -> str:
    return f"lb.checkpoint.split({self.linen[0]!r}, {_quoted(self.nnx)}, axis={self.axis})"


@dataclasses.dataclass(frozen=True)
class Fuse(LeafRule):
  """Several Linen leaves are one NNX leaf along `axis` (the inverse of `Split`)."""

  axis: int = 0

  def fits(self, linen, nnx):
    return len(nnx) == 1 and bool(_parts_fit(tuple(nnx[0]), [tuple(s) for s in linen], self.axis))

  def forward(self, arrays, nnx):
    how = tp.cast(str, _parts_fit(tuple(nnx[0]), [np.shape(a) for a in arrays], self.axis))
    return [_join(arrays, self.axis % len(nnx[0]), how)]

  def backward(self, arrays, linen):
    whole = np.shape(arrays[0])
    how = tp.cast(str, _parts_fit(whole, [tuple(s) for s in linen], self.axis))
    return _cut(arrays[0], linen, self.axis % len(whole), how)

  def describe(self):
    return f"fused along axis {self.axis}"

  def __str__(self) -> str:
    return f"lb.checkpoint.fuse({_quoted(self.linen)}, {self.nnx[0]!r}, axis={self.axis})"


# --- the public constructors ----------------------------------------------------------------

_BAD_PATH = (
  "{what} must be a leaf path as a string ('module/sub/variable', `*` for one path part), "
  "got {got!r}."
)


def _path(value: object, what: str) -> str:
  if not isinstance(value, str) or not value.strip("/"):
    raise CheckpointError(_BAD_PATH.format(what=what, got=value))
  return value.replace(".", "/").strip("/")


def _paths(values: object, what: str) -> tuple[str, ...]:
  if isinstance(values, str) or not isinstance(values, tp.Sequence) or len(values) < 2:
    raise CheckpointError(
      f"{what} takes a list of at least two leaf paths (['a/kernel', 'b/kernel']), got {values!r}."
    )
  return tuple(_path(v, what) for v in values)


def _axis(axis: object) -> int:
  if not isinstance(axis, int) or isinstance(axis, bool):
    raise CheckpointError(f"axis= takes an int, got {axis!r}.")
  return axis


def rename(linen: str, nnx: str) -> LeafRule:
  """A Linen leaf kept under another path in the port (same shape, same values).

  Args:
    linen: the Linen leaf's path, e.g. `'block/ln/scale'` (`*` matches one path part).
    nnx: the port leaf's path, e.g. `'block/norm/alpha'`.

  Returns:
    A rule for `linen_to_nnx(..., rules=[...])` and `nnx_to_linen`.

  Raises:
    CheckpointError: a path that is not a string.

  Examples:
    >>> import loopbridge as lb
    >>> print(lb.checkpoint.rename('ln/scale', 'norm/alpha'))
    lb.checkpoint.rename('ln/scale', 'norm/alpha')
  """
  return Rename((_path(linen, "rename's linen"),), (_path(nnx, "rename's nnx"),))


def transpose(linen: str, nnx: str, axes: tp.Sequence[int] | None = None) -> LeafRule:
  """A Linen leaf kept transposed in the port (e.g. a `(in, out)` kernel stored `(out, in)`).

  Args:
    linen: the Linen leaf's path.
    nnx: the port leaf's path.
    axes: the permutation, as in `jnp.transpose` (NNX axis i is Linen axis `axes[i]`);
      None reverses the axes.

  Returns:
    A rule for `linen_to_nnx(..., rules=[...])` and `nnx_to_linen`.

  Raises:
    CheckpointError: a path that is not a string or `axes` that are not ints.

  Examples:
    >>> import loopbridge as lb
    >>> print(lb.checkpoint.transpose('Dense_0/kernel', 'proj/weight'))
    lb.checkpoint.transpose('Dense_0/kernel', 'proj/weight')
  """
  if axes is not None:
    axes = tuple(_axis(a) for a in axes)
  return Transpose((_path(linen, "transpose's linen"),), (_path(nnx, "transpose's nnx"),), axes)


def reshape(linen: str, nnx: str) -> LeafRule:
  """A Linen leaf kept with another shape of the same size (row-major), e.g. a
  `DenseGeneral` kernel `(D, H, K)` stored as `(D, H*K)`.

  Args:
    linen: the Linen leaf's path.
    nnx: the port leaf's path.

  Returns:
    A rule for `linen_to_nnx(..., rules=[...])` and `nnx_to_linen`.

  Raises:
    CheckpointError: a path that is not a string.

  Examples:
    >>> import loopbridge as lb
    >>> print(lb.checkpoint.reshape('attn/query/kernel', 'attn/q_proj/kernel'))
    lb.checkpoint.reshape('attn/query/kernel', 'attn/q_proj/kernel')
  """
  return Reshape((_path(linen, "reshape's linen"),), (_path(nnx, "reshape's nnx"),))


def split(linen: str, nnx: tp.Sequence[str], axis: int = 0) -> LeafRule:
  """One Linen leaf kept as several port leaves along `axis`, in the order given.

  Where the Linen array has as many entries along `axis` as there are port leaves and each
  port leaf has the shape of one entry (`[2, D, F]` -> two `[D, F]`), entry i goes to leaf i;
  otherwise the port leaves are consecutive slices along `axis` (a fused `qkv` `[D, 3*E]` ->
  `q`, `k`, `v`, also of unequal widths for grouped-query attention).

  Args:
    linen: the Linen leaf's path, e.g. `'mlp/gating_einsum'`.
    nnx: the port leaves' paths, in order, e.g. `['mlp/gate_proj/kernel', 'mlp/up_proj/kernel']`.
    axis: the Linen array's axis that is split.

  Returns:
    A rule for `linen_to_nnx(..., rules=[...])` and `nnx_to_linen` (which fuses them back).

  Raises:
    CheckpointError: a path that is not a string, fewer than two port leaves, or an axis
      that is not an int.

  Examples:
    >>> import loopbridge as lb
    >>> print(lb.checkpoint.split('mlp/wi', ['mlp/gate/kernel', 'mlp/up/kernel'], axis=0))
    lb.checkpoint.split('mlp/wi', ['mlp/gate/kernel', 'mlp/up/kernel'], axis=0)
  """
  return Split((_path(linen, "split's linen"),), _paths(nnx, "split's nnx"), _axis(axis))


def fuse(linen: tp.Sequence[str], nnx: str, axis: int = 0) -> LeafRule:
  """Several Linen leaves kept as one port leaf along `axis` (the inverse of `split`).

  Args:
    linen: the Linen leaves' paths, in order, e.g. `['attn/q/kernel', 'attn/k/kernel',
      'attn/v/kernel']`.
    nnx: the port leaf's path, e.g. `'attn/qkv/kernel'`.
    axis: the port array's axis along which the Linen arrays are stacked (when the port
      array has one entry per Linen leaf there) or concatenated.

  Returns:
    A rule for `linen_to_nnx(..., rules=[...])` and `nnx_to_linen` (which splits them back).

  Raises:
    CheckpointError: a path that is not a string, fewer than two Linen leaves, or an axis
      that is not an int.

  Examples:
    >>> import loopbridge as lb
    >>> print(lb.checkpoint.fuse(['q/kernel', 'k/kernel', 'v/kernel'], 'qkv/kernel', axis=1))
    lb.checkpoint.fuse(['q/kernel', 'k/kernel', 'v/kernel'], 'qkv/kernel', axis=1)
  """
  return Fuse(_paths(linen, "fuse's linen"), (_path(nnx, "fuse's nnx"),), _axis(axis))


# --- patterns -------------------------------------------------------------------------------


def _regex(pattern: str) -> re.Pattern[str]:
  parts = (
    "([^/]+)" if part == "*" else re.escape(part).replace(r"\*", "([^/]*)")
    for part in pattern.split("/")
  )
  return re.compile("/".join(parts))


def match(pattern: str, path: str) -> tuple[str, ...] | None:
  """The parts `*` matched when `pattern` matches the whole `path`, else None."""
  found = _regex(pattern).fullmatch(path)
  return None if found is None else found.groups()


# --- rules written as text (the CLI's --rule) -----------------------------------------------

_MAKERS: dict[str, tp.Callable[..., LeafRule]] = {
  "rename": rename,
  "transpose": transpose,
  "reshape": reshape,
  "split": split,
  "fuse": fuse,
}
RULE_TEXT_HELP = (
  "a rule is written as its Python call, e.g. \"split('mlp/wi', ['mlp/gate/kernel', "
  "'mlp/up/kernel'], axis=0)\" (rename, transpose, reshape, split or fuse; the "
  "`lb.checkpoint.` prefix is optional; arguments are literals)"
)


def parse(text: str) -> LeafRule:
  """A rule from its text (what `str(rule)` prints); literals only, nothing is executed."""
  import ast

  try:
    call = ast.parse(text.strip(), mode="eval").body
  except SyntaxError as e:
    raise CheckpointError(f"cannot read the rule {text!r}: {e.msg}; {RULE_TEXT_HELP}.") from e
  name = (
    call.func.attr
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
    else (call.func.id if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) else None)
  )
  if name not in _MAKERS:
    raise CheckpointError(f"cannot read the rule {text!r}: {RULE_TEXT_HELP}.")
  call = tp.cast(ast.Call, call)
  try:
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {tp.cast(str, k.arg): ast.literal_eval(k.value) for k in call.keywords}
  except ValueError as e:
    raise CheckpointError(f"cannot read the rule {text!r}: {RULE_TEXT_HELP}.") from e
  try:
    return _MAKERS[name](*args, **kwargs)
  except TypeError as e:
    raise CheckpointError(f"cannot read the rule {text!r} ({e}); {RULE_TEXT_HELP}.") from e
