"""Checkpoint layouts of layer stacks: Linen scanned params <-> per-layer params <-> NNX layers.

Three layouts hold the same numbers:

* *scanned*: what Linen `nn.scan(variable_axes={'params': 0})` stores: one subtree whose every
  leaf has a leading layer axis (`{'Dense_0': {'kernel': f32[L, i, o]}}`);
* *per-layer*: one subtree per layer under generated names (`{'layers_0': ..., 'layers_1': ...}`,
  what an unrolled Linen loop of `Block(name=f'layers_{i}')` stores), or a plain list;
* *NNX*: a stack (`lb.layers.stack` / `nnx.vmap`; the scanned layout in Variables) or a list
  of layers.

All conversions copy values without casting, so every round trip is exact.

`load_into_port` loads a whole Linen model's variables into its NNX port by name (attributes
named like the Linen submodules), unstacking the `nn.scan` subtrees the port holds as lists
(`unstack_listed`); it casts to the port's dtypes.
"""

from __future__ import annotations

import re
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.linen import meta as linen_meta

from .. import _compat
from .._core.errors import StackError
from .._core.site import linen_key
from .stack import _num_layers, _path_str, variables_by_path

Names = str | tp.Callable[[int], str]
# A Linen params subtree (nested mappings of arrays) or a list of them. Kept loose: callers
# index what these functions return (`stack_params(...)['kernel']`), which a union would refuse.
Tree = tp.Any


def _namer(names: Names) -> tp.Callable[[int], str]:
  if callable(names):
    return names
  if not isinstance(names, str) or ("{}" not in names and "{i}" not in names):
    raise StackError(
      f"names={names!r} must be a format string with one `{{}}` (e.g. "
      "'layers_{}') or a function from the layer index to a name."
    )
  return lambda i: names.format(i, i=i)


def _leaf_sizes(tree: Tree) -> dict[int, str]:
  sizes: dict[int, str] = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    where = jax.tree_util.keystr(key_path) or "<root>"
    if np.ndim(leaf) == 0:
      raise StackError(
        f"`{where}` is a scalar, so this is not a scanned (stacked) subtree: "
        "every leaf of one has a leading layer axis."
      )
    sizes.setdefault(np.shape(leaf)[0], where)
  if not sizes:
    raise StackError("the scanned subtree holds no arrays, so it has no layer axis.")
  if len(sizes) > 1:
    (n1, p1), (n2, p2) = list(sizes.items())[:2]
    raise StackError(
      f"leading axes disagree (`{p1}` has {n1} layers, `{p2}` has {n2}), so "
      "this is not one scanned subtree."
    )
  return sizes


def unstack_params(
  scanned: Tree, *, names: Names | None = "layers_{}"
) -> dict[str, Tree] | list[Tree]:
  """Split a scanned params subtree (leading layer axis) into one subtree per layer.

  Args:
    scanned: the subtree `nn.scan(variable_axes={'params': 0})` stored, e.g.
      `variables['params']['ScanBlock_0']`; boxed leaves (`nn.Partitioned`) are unboxed.
    names: the per-layer names: a format string (`'layers_{}'`), a function of the index, or
      None for a list.

  Returns:
    `{names(0): layer_0, ...}` (or a list), each a subtree with the leading axis removed.

  Raises:
    StackError: a leaf is a scalar or the leaves disagree on the number of layers.

  Examples:
    >>> import jax.numpy as jnp
    >>> import loopbridge as lb
    >>> layers = lb.layers.unstack_params({'Dense_0': {'kernel': jnp.zeros((3, 4, 4))}})
    >>> sorted(layers), layers['layers_2']['Dense_0']['kernel'].shape
    (['layers_0', 'layers_1', 'layers_2'], (4, 4))
  """
  scanned = linen_meta.unbox(scanned)
  n = next(iter(_leaf_sizes(scanned)))
  per_layer = [jax.tree.map(lambda leaf, i=i: leaf[i], scanned) for i in range(n)]
  if names is None:
    return per_layer
  name = _namer(names)
  return {name(i): tree for i, tree in enumerate(per_layer)}


_NOT_LAYERS = (
  "{what} takes per-layer params: a list of per-layer subtrees ([params_0, params_1, ...]) or "
  "a mapping holding 'layers_0', 'layers_1', ... (e.g. variables['params']), got {got}. "
  "Fix: pass the params tree itself, not its name or None."
)


def _layer_list(layers: tp.Mapping[str, Tree] | tp.Sequence[Tree], names: Names) -> list[Tree]:
  if not isinstance(layers, tp.Mapping):
    if isinstance(layers, (str, bytes)) or not isinstance(layers, tp.Iterable):
      raise StackError(_NOT_LAYERS.format(what="lb.layers.stack_params", got=type(layers).__name__))
    found = list(layers)
    if not found:
      raise StackError(
        "lb.layers.stack_params got an empty list: there are no layers to stack, so the "
        "stacked subtree would have no leaves. Fix: pass the per-layer subtrees "
        "([params_0, params_1, ...]) or the mapping holding 'layers_0', 'layers_1', ..."
      )
    return found
  name = _namer(names)
  found = []
  while name(len(found)) in layers:
    found.append(layers[name(len(found))])
  stray = [
    name(j) for j in range(len(found) + 1, len(found) + 1 + len(layers)) if name(j) in layers
  ]
  hint = " Pass names= matching your checkpoint (e.g. names='block_{}')."
  if not found:
    raise StackError(
      f"no per-layer entries {name(0)!r}, {name(1)!r}, ... among the keys "
      f"{sorted(map(str, layers))}.{hint}"
    )
  if stray:
    raise StackError(
      f"per-layer entries stop at {name(len(found))!r} but {stray[0]!r} exists: "
      f"a layer is missing.{hint}"
    )
  return found


def _desc(leaf: jax.typing.ArrayLike | None) -> str:
  return "nothing" if leaf is None else f"{jnp.result_type(leaf)}{list(np.shape(leaf))}"


def stack_params(
  layers: tp.Mapping[str, Tree] | tp.Sequence[Tree], *, names: Names = "layers_{}"
) -> Tree:
  """Stack per-layer params into one scanned subtree (what `nn.scan` stores), exactly.

  Args:
    layers: a list of per-layer subtrees, or a mapping holding `names(0)`, `names(1)`, ...
      (other keys, e.g. an embedding next to the layers, are ignored).
    names: the per-layer names when `layers` is a mapping (format string or function).

  Returns:
    One subtree of the per-layer structure whose leaves are `jnp.stack` of the layers' leaves.

  Raises:
    StackError: no per-layer entries, a gap in the numbering, or layers that differ in
      structure, shape or dtype (the message names the first differing leaf).

  Examples:
    >>> import jax.numpy as jnp
    >>> import loopbridge as lb
    >>> per_layer = {f'layers_{i}': {'kernel': jnp.zeros((4, 4))} for i in range(3)}
    >>> lb.layers.stack_params(per_layer)['kernel'].shape
    (3, 4, 4)
  """
  found = [linen_meta.unbox(t) for t in _layer_list(layers, names)]
  first = dict(jax.tree_util.tree_leaves_with_path(found[0]))
  for index, tree in enumerate(found[1:], start=1):
    other = dict(jax.tree_util.tree_leaves_with_path(tree))
    for key in list(first) + [k for k in other if k not in first]:
      a, b = first.get(key), other.get(key)
      if (
        a is None
        or b is None
        or np.shape(a) != np.shape(b)
        or (jnp.result_type(a) != jnp.result_type(b))
      ):
        raise StackError(
          f"layer {index} differs from layer 0 at `{jax.tree_util.keystr(key)}`: layer 0 has "
          f"{_desc(a)}, layer {index} has {_desc(b)}. Only equal layers share a scanned subtree."
        )
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *found)


def _params_of(
  module: nnx.Module, linen_names: bool = False
) -> dict[tuple[str, ...], nnx.Variable]:
  """The module's Params by path; with `linen_names` a list index joins the name before it
  (`encoderblock/0` -> Linen's `encoderblock_0`, `linen_key`)."""
  return {
    linen_key(path) if linen_names else tuple(str(p) for p in path): v
    for path, v in variables_by_path(module).items()
    if isinstance(v, nnx.Param)
  }


def _flatten_params(tree: Tree) -> dict[tuple[str, ...], tp.Any]:
  flat: dict[tuple[str, ...], tp.Any] = {}

  def walk(node, prefix):
    if isinstance(node, tp.Mapping):
      for key, child in node.items():
        walk(child, (*prefix, str(key)))
    else:
      flat[prefix] = node

  walk(linen_meta.unbox(tree), ())
  return flat


def _unflatten(flat: tp.Mapping[tuple[str, ...], object]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def _load_into(module: nnx.Module, tree: Tree, what: str, linen_names: bool = False) -> None:
  targets, values = _params_of(module, linen_names), _flatten_params(tree)
  for path in list(targets) + [p for p in values if p not in targets]:
    if path not in values:
      raise StackError(
        f"{what}: the NNX module has a Param at `{_path_str(path)}` that the "
        f"checkpoint lacks (checkpoint keys: {sorted('/'.join(p) for p in values)}"
        "). Name the NNX attributes like the Linen submodules (e.g. "
        "`self.Dense_0 = nnx.Linear(...)`) or rename the checkpoint's keys."
      )
    if path not in targets:
      raise StackError(
        f"{what}: the checkpoint has `{_path_str(path)}`, which the NNX module "
        "has no Param for. Name the NNX attributes like the Linen submodules or "
        "rename the checkpoint's keys."
      )
    old, new = _compat.variable_value(targets[path]), values[path]
    if np.shape(old) != np.shape(new) or jnp.result_type(old) != jnp.result_type(new):
      raise StackError(
        f"{what}: `{_path_str(path)}` is {jnp.result_type(new)}{list(np.shape(new))} in the "
        f"checkpoint but {jnp.result_type(old)}{list(np.shape(old))} in the NNX module. Build "
        "the NNX port with the same widths, dtypes and number of layers."
      )
  for path, variable in targets.items():
    _compat.set_variable_value(variable, jnp.asarray(values[path]))


_M = tp.TypeVar("_M", bound=nnx.Module)


@tp.overload
def load_params(params: Tree, target: _M, *, names: Names = ...) -> _M: ...
@tp.overload
def load_params(params: Tree, target: tp.Sequence[_M], *, names: Names = ...) -> list[_M]: ...
def load_params(
  params: Tree, target: nnx.Module | tp.Sequence[nnx.Module], *, names: Names = "layers_{}"
) -> nnx.Module | tp.Sequence[nnx.Module]:
  """Load layer params in any layout into an NNX stack or list of layers, in place.

  Every `nnx.Param` of the target receives the checkpoint value at the same path (NNX
  attribute names = Linen submodule names, e.g. `self.Dense_0 = nnx.Linear(...)`); other
  Variables (batch statistics, buffers, rngs) are left alone.

  Args:
    params: a scanned subtree (leading layer axis), a mapping with per-layer entries
      `names(0)`, `names(1)`, ..., or a list of per-layer subtrees.
    target: a stack (`lb.layers.stack` / `nnx.vmap`) or a list of NNX layers, built with the
      checkpoint's widths, dtypes and depth.
    names: per-layer names when `params` is such a mapping.

  Returns:
    `target`, updated.

  Raises:
    StackError: a Param missing on either side, a shape or dtype that differs, or a depth that
      differs; the message names the path.

  Examples:
    >>> import jax.numpy as jnp
    >>> import loopbridge as lb
    >>> from flax import nnx
    >>> stacked = lb.layers.stack([nnx.Linear(4, 4, rngs=nnx.Rngs(i)) for i in range(3)])
    >>> scanned = {'kernel': jnp.ones((3, 4, 4)), 'bias': jnp.zeros((3, 4))}
    >>> float(lb.layers.load_params(scanned, stacked).kernel[...].sum())
    48.0
  """
  if not isinstance(params, (tp.Mapping, list, tuple)):
    raise StackError(_NOT_LAYERS.format(what="lb.layers.load_params", got=type(params).__name__))
  is_per_layer = not isinstance(params, tp.Mapping) or _namer(names)(0) in params
  if isinstance(target, nnx.Module):
    scanned = stack_params(params, names=names) if is_per_layer else params
    depth, got = (
      _num_layers(target, "lb.layers.load_params"),
      next(iter(_leaf_sizes(linen_meta.unbox(scanned)))),
    )
    if depth != got:
      raise StackError(
        f"lb.layers.load_params: the checkpoint has {got} layers, the NNX stack "
        f"{depth}. Build the stack with {got} layers."
      )
    _load_into(target, scanned, "lb.layers.load_params")
    return target
  layers = list(target)
  per_layer = _layer_list(params, names) if is_per_layer else unstack_params(params, names=None)
  if len(per_layer) != len(layers):
    raise StackError(
      f"lb.layers.load_params: the checkpoint has {len(per_layer)} layers, the list "
      f"of NNX layers {len(layers)}. Build as many layers as the checkpoint has."
    )
  for index, (module, tree) in enumerate(zip(layers, per_layer)):
    # A list holds whole layers (or a whole port): its Linen checkpoint names the layers'
    # own lists `blocks_0`, `blocks_1` where the NNX module holds `blocks[0]`, `blocks[1]`.
    _load_into(module, tree, f"lb.layers.load_params (layer {index})", linen_names=True)
  return layers


def export_params(
  source: nnx.Module | tp.Sequence[nnx.Module],
  *,
  scanned: bool = True,
  names: Names | None = "layers_{}",
) -> Tree:
  """Export the `nnx.Param`s of an NNX stack or list of layers as Linen-style params.

  Args:
    source: a stack (`lb.layers.stack` / `nnx.vmap`) or a list of NNX layers.
    scanned: True for one scanned subtree (leading layer axis, the `nn.scan` layout), False for
      per-layer subtrees.
    names: per-layer names when `scanned=False` (format string or function); None for a list.

  Returns:
    Nested dicts of arrays keyed like the NNX attributes.

  Raises:
    StackError: `source` is not a stack or a list of equal layers (when a stacked layout is
      asked for).

  Examples:
    >>> import loopbridge as lb
    >>> from flax import nnx
    >>> layers = [nnx.Linear(4, 4, rngs=nnx.Rngs(i)) for i in range(3)]
    >>> lb.layers.export_params(layers)['kernel'].shape
    (3, 4, 4)
  """
  if not isinstance(source, (nnx.Module, list, tuple)):
    raise StackError(
      f"lb.layers.export_params takes a layer stack (lb.layers.stack / nnx.vmap) or a list of "
      f"NNX layers, got {type(source).__name__}. Fix: pass the stacked module (e.g. "
      "model.layers) or the list of layers."
    )
  if isinstance(source, nnx.Module):
    _num_layers(source, "lb.layers.export_params")
    tree = _unflatten({p: _compat.variable_value(v) for p, v in _params_of(source).items()})
    return tree if scanned else unstack_params(tree, names=names)
  per_layer = [
    _unflatten({p: _compat.variable_value(v) for p, v in _params_of(m).items()}) for m in source
  ]
  if scanned:
    return stack_params(per_layer)
  if names is None:
    return per_layer
  name = _namer(names)
  return {name(i): tree for i, tree in enumerate(per_layer)}


# ----------------------------------------------------------------------------- a whole port
PORT_NAMES_HINT = (
  "Name the port's attributes like the Linen submodules (self.Dense_0 = nnx.Linear(...); a "
  "list self.layers[0] for Linen's layers_0)."
)

Key = tuple[str, ...]


def unstack_listed(params: Tree, listed: tp.Collection[Key]) -> dict[str, Tree]:
  """Unstack each scanned subtree of `params` that a port holds as a list of layers.

  Linen stores an `nn.scan` of layers as one subtree with a leading layer axis
  (`cells/Dense_0/kernel`: (L, i, o)); a port holding a list `self.cells[i]` has its Params
  at `cells_0/Dense_0/kernel`, ... (`linen_key`), the names `unstack_params(names='cells_{}')`
  gives. Other subtrees are kept as they are.

  Args:
    params: one Linen collection (`variables['params']`); boxed leaves are unboxed.
    listed: the Linen keys (`linen_key`) of the port's Variables of that collection.

  Returns:
    `params` with each such subtree replaced by its per-layer subtrees.

  Raises:
    StackError: the port's list has another number of layers than the scanned subtree.

  Examples:
    >>> import jax.numpy as jnp
    >>> params = {'cells': {'kernel': jnp.zeros((2, 4, 4))}}
    >>> sorted(unstack_listed(params, [('cells_0', 'kernel'), ('cells_1', 'kernel')]))
    ['cells_0', 'cells_1']
  """
  wanted = set(listed)

  def walk(node: tp.Mapping[str, Tree], prefix: Key) -> dict[str, Tree]:
    below = [
      p[len(prefix) :] for p in wanted if len(p) > len(prefix) + 1 and p[: len(prefix)] == prefix
    ]
    out: dict[str, Tree] = {}
    for key, child in node.items():
      key = str(key)
      if not isinstance(child, tp.Mapping):
        out[key] = child
        continue
      pattern = re.compile(rf"{re.escape(key)}_(\d+)")
      indices = {int(m.group(1)) for p in below if (m := pattern.fullmatch(p[0]))}
      # Only where the port holds a list and Linen has no per-layer entries of its own.
      if indices and not any(p[0] == key for p in below) and f"{key}_0" not in node:
        try:
          layers = unstack_params(child, names=f"{key}_{{}}")
        except StackError:  # not a scanned subtree: loaded (or reported missing) as it is
          layers = None
        if isinstance(layers, dict):
          if indices != set(range(len(layers))):
            leaf = "/".join((*prefix, key, *next(iter(_flatten_params(child)))))
            raise StackError(
              f"the Linen param {leaf!r} stacks {len(layers)} layers (nn.scan) but the port's "
              f"list has {len(indices)}; build the port with as many layers"
            )
          out.update((name, walk(layer, (*prefix, name))) for name, layer in layers.items())
          continue
      out[key] = walk(child, (*prefix, key))
    return out

  return walk(linen_meta.unbox(params), ())


def _has_sibling(key: Key, keys: tp.Iterable[Key]) -> bool:
  """Whether another param of the same layer as `key` (`Dense_1/bias`) is among `keys`."""
  return any(k != key and k[:-1] == key[:-1] for k in keys)


def _layer_lacks(key: Key, lacking: str, having: str, add: bool = False) -> str:
  """Why a param exists on one side only when its layer exists on both: the layer's options.

  `add`: the port's layer needs the param (else: it has one too many).
  """
  layer, name = "/".join(key[:-1]), key[-1]
  option = {"bias": "use_bias", "scale": "use_scale"}.get(name)
  why = f" (built with {option}=False?)" if option and add else ""
  fix = (
    f"build the port's layer {layer!r} with {option}={add}"
    if option
    else f"build the port's layer {layer!r} with the same options as the Linen layer"
  )
  return (
    f"Why: {lacking} {layer!r} has no {name!r}{why}, while {having} has one; the names "
    f"match. Fix: {fix}."
  )


def state_collection(variable: nnx.Variable) -> str | None:
  """The Linen collection a port's Variable loads from; None for state Linen has none of.

  An `nnx.Dropout(..., rngs=rngs)` holds rng streams (`RngKey`, `RngCount`): the port's own,
  never in a Linen checkpoint (and flax 0.12 names no collection for them). A Variable type
  of the user's that flax cannot name has no Linen counterpart either.
  """
  if isinstance(variable, nnx.RngState):
    return None
  try:
    return _compat.collection_name(type(variable))
  except (ValueError, KeyError):  # "Type ... is not registered in the registry"
    return None


def load_into_port(
  port: nnx.Module, variables: tp.Mapping[str, Tree], *, hint: str = PORT_NAMES_HINT
) -> int:
  """Write a Linen model's variables into its NNX port's Variables by name, in place.

  Paths correspond when the port's attributes are named like the Linen submodules, a list
  index `layers/0` standing for Linen's `layers_0` (or for layer 0 of an `nn.scan` named
  `layers`, see `unstack_listed`). Every `nnx.Param` must find its value; other collections
  (batch statistics, ...) are loaded where present; the port's rng streams (an
  `nnx.Dropout(..., rngs=rngs)`) and other state Linen has no collection for stay its own.
  Values take the port's dtypes.

  Args:
    port: the NNX module, built with the Linen model's widths and depths.
    variables: what the Linen model's `init` returns (`{'params': ..., 'batch_stats': ...}`).
    hint: the advice when a param matches nothing by name (a caller may offer more ways out).

  Returns:
    How many Variables were written.

  Raises:
    StackError: a Param on one side only (the message names the layer option that differs
      when the layer exists on both), a scanned depth or a shape that differs.

  Examples:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from flax import nnx
    >>> class Port(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.Dense_0 = nnx.Linear(2, 3, rngs=rngs)
    >>> variables = nn.Dense(3, name='Dense_0').init(jax.random.key(0), jnp.ones((1, 2)))
    >>> load_into_port(Port(nnx.Rngs(0)), {'params': {'Dense_0': variables['params']}})
    2
  """
  collections = {name: tree for name, tree in variables.items() if isinstance(tree, tp.Mapping)}
  seen: set[int] = set()
  targets: dict[tuple[str, Key], tuple[str, nnx.Variable]] = {}
  for path, node in _compat.iter_graph(port):
    if not isinstance(node, nnx.Variable) or id(node) in seen:
      continue
    seen.add(id(node))
    collection = state_collection(node)
    if collection not in collections or _compat.variable_value(node) is None:
      continue  # flax 0.10 keeps a disabled bias as a Param holding None
    targets[(collection, linen_key(path))] = ("/".join(map(str, path)), node)
  reference = {
    name: _flatten_params(unstack_listed(tree, [k for c, k in targets if c == name]))
    for name, tree in collections.items()
  }
  params = reference.get("params", {})
  port_params = {key: shown for (c, key), (shown, _) in targets.items() if c == "params"}
  missing = [key for key in port_params if key not in params]
  if missing:
    names = sorted("/".join(k) for k in params)
    raise StackError(
      f"the port has a Param at {port_params[missing[0]]!r} that the Linen model lacks "
      f"({len(missing)} such; Linen params: {', '.join(names[:8])}"
      f"{', ...' if len(names) > 8 else ''}). "
      + (
        _layer_lacks(missing[0], "the Linen layer", "the port's layer")
        if _has_sibling(missing[0], params)
        else hint
      )
    )
  extra = [key for key in params if key not in port_params]
  if extra:
    first = "/".join(extra[0])
    if _has_sibling(extra[0], port_params):
      raise StackError(
        f"the Linen param {first!r} has no Param in the port ({len(extra)} such), though the "
        "port's layer at that path exists. "
        + _layer_lacks(extra[0], "the port's layer", "the Linen layer", add=True)
      )
    raise StackError(
      f"the Linen param {first!r} has no Param in the port ({len(extra)} such). {hint}"
    )
  loaded = 0
  for (collection, key), (shown, variable) in targets.items():
    if key not in reference[collection]:
      continue
    old, new = _compat.variable_value(variable), reference[collection][key]
    if np.shape(old) != np.shape(new):
      raise StackError(
        f"{collection} {'/'.join(key)!r} is {list(np.shape(new))} in the Linen model but "
        f"{shown!r} is {list(np.shape(old))} in the port; build the port with the same widths "
        "and depths (a transposed layout, such as a kernel stored (out, in), has to be "
        "converted by hand)."
      )
    _compat.set_variable_value(variable, jnp.asarray(new, getattr(old, "dtype", None)))
    loaded += 1
  return loaded
