"""A method under a Linen lifted transform written as its decorator (flax's sst2 `SimpleLSTM`:
`@functools.partial(nn.transforms.scan, variable_broadcast='params', in_axes=1, ...)` over a
compact `__call__(self, carry, x)`).

Linen's `nn.scan` runs the method once per step with the module's params shared by every step.
The port's method runs its own body under `nnx.scan`: a function of the carry and the step's
inputs that reads the module's layers as they are (the layers are built once, in `__init__`).
Only that case is drafted; every other option (variables stacked per step, rng streams split
per step, a scan `length` with no inputs, another lift) leaves the method a TODO that says what
to write, never a Linen transform inside an NNX module.
"""

from __future__ import annotations

import ast
import functools
import typing as tp

from ..plan.names import names_in
from ..plan.source import dotted, is_docstring, libcst, resolve

if tp.TYPE_CHECKING:
  import libcst as cst

# nn.scan options the port reproduces; any other one given is a TODO naming it.
_DRAFTED = frozenset(
  {"variable_broadcast", "variable_axes", "split_rngs", "in_axes", "out_axes", "reverse", "unroll"}
)
WHY = (
  "Linen scans the method with its params shared by every step (variable_broadcast='params'); "
  "NNX scans the method's body, which reads the layers built in __init__"
)


def linen_lift(decorator: cst.Decorator, namespace: tp.Mapping[str, object]) -> tp.Any:
  """The Linen lifted transform a method decorator applies (`nn.scan`, `nn.jit`, ...), or None.

  `@functools.partial(nn.scan, ...)` and `@nn.jit` both apply one; the transform is told by
  what the name refers to in the class's module, however it was imported.
  """
  c = libcst()
  node: tp.Any = decorator.decorator
  target = node
  if isinstance(node, c.Call):
    func = resolve(dotted(node.func), namespace)
    target = node.args[0].value if func is functools.partial and node.args else node.func
  lift = resolve(dotted(target), namespace)
  module = getattr(lift, "__module__", "") or ""
  return lift if module.startswith("flax.linen.transforms") and callable(lift) else None


def _literal(planner: tp.Any, node: cst.BaseExpression) -> tuple[bool, object]:
  try:
    return True, ast.literal_eval(planner.code(node))
  except (ValueError, SyntaxError):
    return False, None


def _axes(value: object) -> bool:
  """An axis (int) or a tuple of them: what `nnx.scan` takes as it is."""
  if isinstance(value, tuple):
    return all(_axes(v) for v in value)
  return type(value) is int


def _unsupported(planner: tp.Any, options: dict[str, cst.BaseExpression]) -> str | None:
  """Why the options are not drafted (what to write instead), or None."""
  for name, node in options.items():
    if name not in _DRAFTED:
      return f"nn.scan's {name}= over a method is not drafted: scan the method body by hand"
    ok, value = _literal(planner, node)
    if not ok:
      return (
        f"nn.scan's {name}={planner.code(node)} is not a literal the draft can read: write "
        "the method's nnx.scan by hand"
      )
    if name == "variable_broadcast" and value not in ("params", ("params",), ["params"], True):
      return (
        f"nn.scan with variable_broadcast={value!r}: the draft reads only the params as "
        "shared by every step; scan the method body with nnx.scan by hand"
      )
    if name == "variable_axes" and value:
      return (
        f"nn.scan with variable_axes={value!r} makes one set of variables per step: build "
        "the layers as an nnx.vmap stack in __init__ and scan over it (nnx.scan) by hand"
      )
    if name == "split_rngs" and any(stream != "params" for stream in tp.cast(dict, value)):
      return (
        f"nn.scan with split_rngs={value!r}: the scanned method draws random numbers; the "
        "port would carry its nnx.Rngs through nnx.scan (pass the module with "
        "nnx.StateAxes({nnx.RngState: nnx.Carry, ...: None})): write it by hand"
      )
    if name in ("in_axes", "out_axes") and not _axes(value):
      return f"nn.scan's {name}={value!r} (only axes as ints are drafted): scan it by hand"
  return None


def lifted_method(
  planner: tp.Any, fn: cst.FunctionDef, decorator: cst.Decorator, lift: object
) -> tp.Any:
  """The method without the decorator applying `lift`, rewritten to do its work in NNX, or
  why it is not drafted (a str: the method becomes a TODO)."""
  from flax import linen as nn

  from . import remat_method

  if lift is nn.checkpoint or lift is nn.remat:
    return remat_method.rematerialized(planner, fn, decorator)
  if lift is not nn.scan:
    name = getattr(lift, "__name__", "a lifted transform")
    return (
      f"a method under nn.{name} (a Linen lifted transform): apply nnx.{name} to the method's "
      "body by hand (only nn.scan and nn.remat over a method are drafted)"
    )
  return _scanned(planner, fn, decorator)


def _scanned(planner: tp.Any, fn: cst.FunctionDef, decorator: cst.Decorator) -> tp.Any:
  """The method rewritten to scan its body with `nnx.scan`, or why it is not (a str)."""
  c = libcst()
  call: tp.Any = decorator.decorator
  if not isinstance(call, c.Call) or any(a.keyword is None for a in call.args[1:]):
    return "nn.scan applied to a method without its options as keywords: scan it by hand"
  options = {a.keyword.value: a.value for a in call.args[1:] if a.keyword is not None}
  why = _unsupported(planner, options)
  if why is not None:
    return why
  if "variable_broadcast" not in options:
    return (
      "nn.scan over a method without variable_broadcast='params' (its params would be "
      "made per step): scan it by hand"
    )
  params = fn.params
  if (
    params.star_arg not in (None, c.MaybeSentinel.DEFAULT)
    or params.kwonly_params
    or params.star_kwarg is not None
    or params.posonly_params
    or len(params.params) < 2
  ):
    return "nn.scan over a method whose arguments are not (self, carry, *xs): scan it by hand"
  carry, *xs = [p.name.value for p in params.params[1:]]
  in_axes = ast.literal_eval(planner.code(options["in_axes"])) if "in_axes" in options else 0
  out_axes = ast.literal_eval(planner.code(options["out_axes"])) if "out_axes" in options else 0
  per_input = list(in_axes) if isinstance(in_axes, tuple) else [in_axes] * len(xs)
  if len(per_input) != len(xs):
    return f"nn.scan's in_axes={in_axes!r} for {len(xs)} scanned inputs: scan it by hand"
  body = list(fn.body.body)
  doc = body[:1] if body and is_docstring(body[0]) else []
  step = "step"
  taken = names_in(fn) | {carry, *xs}
  while step in taken:
    step = f"{step}_"
  extra = "".join(
    f", {k}={planner.code(options[k])}" for k in ("reverse", "unroll") if k in options
  )
  axes_in = ", ".join(["nnx.Carry", *map(repr, per_input)])
  scan = (
    f"nnx.scan({step}, in_axes=({axes_in}), out_axes=(nnx.Carry, {out_axes!r}){extra})"
    f"({', '.join([carry, *xs])})"
  )
  inner = c.FunctionDef(
    name=c.Name(step),
    params=c.Parameters(params=[c.Param(c.Name(n)) for n in (carry, *xs)]),
    body=c.IndentedBlock(body=body[len(doc) :]),
  )
  ret = c.parse_statement(f"return {scan}\n")
  planner.port.scans_a_method = True
  planner.change(planner.positions[decorator].start.line, f"@{planner.code(call)}", scan, WHY)
  return fn.with_changes(body=fn.body.with_changes(body=[*doc, inner, ret]))


def per_step_paths(traced: tp.Any, ported: tp.Mapping[type, tp.Any]) -> tuple[str, ...]:
  """Module paths whose Linen calls are per scan step with no call of the port to pair with
  (the port's scanned method is one call): compared through the calls inside and around."""
  return tuple(
    "/".join(path)
    for path, inst in traced.instances.items()
    if path and getattr(ported.get(inst.cls), "scans_a_method", False)
  )
