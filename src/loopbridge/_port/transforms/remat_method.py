"""A method rematerialized by its decorator: `@nn.remat` over a compact `__call__` (magvit's
`Conv2Plus1D`), `@functools.partial(nn.checkpoint, static_argnums=(2,))`, or a second entry
point `@nn.remat def remat_call(self, x): return self(x)` (magvit's 3D CNN blocks).

Linen recomputes the method's activations in the backward pass; its params are the module's
own, named as without the decorator. The port's method runs its body under `nnx.remat`, the
module passed in as the body's first argument (so NNX carries its state through the
transform, as for any module an NNX transform is given):

    def __call__(self, x):
      def body(self, x):
        ...
      return nnx.remat(body)(self, x)

Linen counts `static_argnums` with `self` as 0, as the body does: they are kept as written, and
so are `prevent_cse` and `policy`. Linen's `variables=`, `rngs=`, `concrete=` and `methods=`
have no `nnx.remat` counterpart: the method stays a TODO naming them. Hook:
`scanned_method.lifted_method` (every method decorated by a Linen lifted transform).
"""

from __future__ import annotations

import typing as tp

from ..plan.names import names_in
from ..plan.source import dotted, is_docstring, libcst, resolve

if tp.TYPE_CHECKING:
  import libcst as cst

# nn.checkpoint's options that nnx.remat takes as they are (same meaning, same argnum count).
_KEPT = ("prevent_cse", "static_argnums", "policy")
WHY = (
  "Linen rematerializes the method; NNX rematerializes its body, given the module as its "
  "first argument (nnx.remat)"
)


def _options(planner: tp.Any, decorator: cst.Decorator) -> tuple[list[str], str | None]:
  """`nnx.remat`'s keyword arguments from the decorator's options, or why it stays a TODO."""
  import functools

  c = libcst()
  node: tp.Any = decorator.decorator
  if not isinstance(node, c.Call):
    return [], None  # `@nn.remat`: no options
  if resolve(dotted(node.func), planner.src.namespace) is not functools.partial:
    return [], (
      "nn.remat called with its options to make the decorator: write the method's body "
      "under nnx.remat by hand"
    )
  kept: list[str] = []
  for arg in node.args[1:]:
    name = arg.keyword.value if arg.keyword is not None else None
    if name not in _KEPT:
      return [], (
        f"nn.remat's {name or 'positional'} option over a method has no nnx.remat "
        "counterpart: write the method's body under nnx.remat by hand"
      )
    kept.append(f"{name}={planner.code(arg.value)}")
  return kept, None


def rematerialized(planner: tp.Any, fn: cst.FunctionDef, decorator: cst.Decorator) -> tp.Any:
  """The method rewritten to run its body under `nnx.remat`, or why it is not (a str)."""
  c = libcst()
  options, why = _options(planner, decorator)
  if why is not None:
    return why
  params = fn.params
  if (
    params.star_arg not in (None, c.MaybeSentinel.DEFAULT)
    or params.kwonly_params
    or params.star_kwarg is not None
    or params.posonly_params
    or not params.params
  ):
    return (
      "nn.remat over a method with keyword-only, * or ** arguments (nnx.remat passes "
      "positional ones): write the method's body under nnx.remat by hand"
    )
  names = [p.name.value for p in params.params]
  body = list(fn.body.body)
  doc = body[:1] if body and is_docstring(body[0]) else []
  inner_name = "body"
  while inner_name in names_in(fn):
    inner_name = f"{inner_name}_"
  inner = c.FunctionDef(
    name=c.Name(inner_name),
    params=c.Parameters(params=[c.Param(c.Name(n)) for n in names]),
    body=c.IndentedBlock(body=body[len(doc) :]),
  )
  remat = f"nnx.remat({', '.join([inner_name, *options])})({', '.join(names)})"
  ret = c.parse_statement(f"return {remat}\n")
  planner.change(
    planner.positions[decorator].start.line, f"@{planner.code(decorator.decorator)}", remat, WHY
  )
  return fn.with_changes(body=fn.body.with_changes(body=[*doc, inner, ret]))
