"""What `nn.scan` and `nn.vmap` drafts share: reading the transform's arguments, the stack.

Both lifts are drafted only from what the source says before the call: keyword arguments
whose values are literals or the module's globals (`nn.broadcast`), and a stack size that
`__init__` can evaluate. A stack (one module per layer or member) is built in `__init__` as
flax's guide builds one: `nnx.split_rngs` + `nnx.vmap` over the rngs.
"""

from __future__ import annotations

import typing as tp

from ..plan.names import available, names_in

if tp.TYPE_CHECKING:
  from ..plan.find_sites import Site

# The planner (`rewrite_class.Planner`) is passed in; typed loosely so this module stays below it.
Planner = tp.Any


def keywords(site: Site, known: tp.Collection[str], lift: str) -> dict[str, tp.Any] | str:
  """The lift call's keyword arguments by name, or why it stays a TODO (positional, unknown)."""
  call = site.lift
  kwargs = {a.keyword.value: a.value for a in call.args[1:] if a.keyword is not None}
  unknown = sorted(set(kwargs) - set(known))
  if unknown or any(a.keyword is None for a in call.args[1:]):
    return f"nn.{lift} with {', '.join(unknown) or 'positional arguments'} (not drafted)"
  return kwargs


def value(planner: Planner, node: tp.Any, lift: str) -> object:
  """An argument's value: literals and the module's globals (`nn.broadcast`) only."""
  code = planner.code(node)
  try:
    # The user's own literal, e.g. {'params': 0}; a name a method binds is not the global's.
    return eval(code, dict(planner.init_namespace))
  except Exception as e:
    raise ValueError(f"nn.{lift}'s {code} cannot be read before the call ({e})") from e


def read(
  planner: Planner, site: Site, known: tp.Collection[str], lift: str, size: str
) -> tuple[dict[str, tp.Any], dict[str, object]] | str:
  """The lift call's keyword arguments (nodes) and the values of all but `size` (the stack's
  size, evaluated in `__init__`), or why the construction stays a TODO."""
  kwargs = keywords(site, known, lift)
  if isinstance(kwargs, str):
    return kwargs
  try:
    values = {k: value(planner, v, lift) for k, v in kwargs.items() if k != size}
  except ValueError as e:
    return str(e)
  return kwargs, values


def known_in_init(planner: Planner, site: Site, node: tp.Any) -> bool:
  """Whether `__init__` can evaluate `node` (fields, globals, the method's top aliases)."""
  aliases = planner.aliases.get(site.method, {})
  if not available(node, planner.init_namespace, set(aliases)):
    return False
  planner.used_aliases.update(n for n in names_in(node) if n in aliases)  # moved to __init__
  return True


def stack(size: str, attr: str, construction: str, unit: str, metadata: str = "") -> list[str]:
  """`__init__` lines building a stack of `size` modules, each with its own rng streams
  (`metadata`: `, transform_metadata=...` for the vmap, or empty)."""
  return [
    f"@nnx.split_rngs(splits={size})\n"
    f"@nnx.vmap(in_axes=(0,), out_axes=0{metadata})\n"
    f"def make_{attr}(rngs: nnx.Rngs):\n"
    f"{unit}return {construction}\n",
    f"self.{attr} = make_{attr}(rngs)",
  ]
