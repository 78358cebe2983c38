"""`param_with_axes(name, init, *shape, axes=(...))` (flax.linen.partitioning, T5X's layers):
a Linen param made through a module-level function that also records its logical axes.

The param is the same as `self.param(name, init, *shape)`'s, so it is drafted as one (an
`nnx.Param`); the axes are names for sharding, kept by Linen in the `params_axes` collection
beside the arrays, and change nothing the layer computes. Any other keyword (`module=`, init
keywords) is left as a TODO. Hook: `plan/find_sites.py` (the site), `emit/variable_rewrites.py`
(its arguments).
"""

from __future__ import annotations

import typing as tp

KIND = "param_with_axes"  # the site's target, telling it from `self.param`


def is_param_with_axes(obj: object) -> bool:
  """`flax.linen.partitioning.param_with_axes`, however the user's module imported it."""
  from flax.linen import partitioning

  return obj is getattr(partitioning, "param_with_axes", None)


def positional(args: tp.Sequence[tp.Any]) -> tuple[list[tp.Any], str | None]:
  """The call's positional arguments (name, init, *init_args), or why the call stays a TODO."""
  others = [a.keyword.value for a in args if a.keyword is not None and a.keyword.value != "axes"]
  if others or any(a.star for a in args):
    return [], (
      f"param_with_axes with {', '.join(others) or '*args'}= (only the name, the initializer, "
      "its positional arguments and axes= are drafted): write it as an nnx.Param by hand"
    )
  return [a for a in args if a.keyword is None], None
