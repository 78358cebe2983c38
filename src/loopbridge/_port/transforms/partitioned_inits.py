"""An initializer the user's own code boxes with Linen's `nn.with_partitioning` (nanodo's
`kernel_init=fsdp.init('mlp_kernel', cfg)`, a helper in another module that returns
`nn.with_partitioning(init, ('data', None))` or the bare initializer by a config flag).

Linen's init stores such a param as an `nn.Partitioned` box (the array and its sharding names)
and its methods read the array. NNX's layers put whatever the initializer returns into the
Variable, so a Linen box would be the Param's value and the first product with it raises. The
draft cannot rewrite the helper (it is the user's, and Linen's code still calls it), so where
the trace saw a boxed param it passes the initializer through `partitioned_as_nnx`, a helper
written into the draft: the array goes into the Variable, the box's names onto it as its
sharding metadata (what `nnx.with_partitioning` puts there), and an unboxed value passes as it
is. A direct `nn.with_partitioning(init, axes)` in the class's own source needs none of this:
it is written as `nnx.with_partitioning(init, axes)` (`plan/linen_api.py`).

Hooks: `emit/construction.py` (a flax layer's `*_init=` argument) and
`emit/variable_rewrites.py` (`self.param`'s initializer).
"""

from __future__ import annotations

import typing as tp

from flax.core import meta

from ..plan.source import dotted, libcst

HELPER = "partitioned_as_nnx"
SOURCE = f'''
def {HELPER}(init):
  """A Linen initializer as NNX's: where it boxes its value (`nn.with_partitioning`), the array
  goes into the Variable and the box's sharding names onto it, as `nnx.with_partitioning`
  puts them."""
  from flax.core import meta

  def unboxed(*args):
    value = init(*args)
    if not isinstance(value, meta.Partitioned):
      return value
    return nnx.with_partitioning(lambda: value.value, value.names, value.mesh)()

  return unboxed
'''
WHY = (
  "the initializer boxes its params with Linen's nn.with_partitioning: the port keeps the "
  "sharding names as the nnx.Param's metadata and computes with the array"
)


def boxed(instances: tp.Iterable[tp.Any], collection: str, name: str) -> bool:
  """Whether Linen's init boxed the variable `name` of any of `instances` (any configuration)."""
  return any(isinstance(i.variables.get((collection, name)), meta.Partitioned) for i in instances)


def variable_of(init_field: str) -> str | None:
  """The variable a flax layer's initializer field makes: `kernel_init` -> `kernel`."""
  return init_field[: -len("_init")] if init_field.endswith("_init") else None


def unboxed_init(planner: tp.Any, code: str, lines: tp.Any, method: str) -> str:
  """`code` (an initializer's NNX expression in `method`, whose Linen value the trace saw
  boxed) as one whose value NNX's Variables take; the draft's helper is written where used."""
  # A local of the method bound once at its top (`init = nn.with_partitioning(...)`): its value.
  value = planner.aliases.get(method, {}).get(code.strip())
  shown = planner.rewrite_expr(value) if value is not None else code
  node = libcst().parse_expression(shown)
  if isinstance(node, libcst().Call) and dotted(node.func) == "nnx.with_partitioning":
    return code  # NNX's own annotation already (the class wrote `nn.with_partitioning(...)`)
  planner.ctx.helpers.add(HELPER)
  wrapped = f"{HELPER}({code})"
  planner.change(lines, code, wrapped, WHY)
  return wrapped
