"""A Linen collection of the user's own (`self.variable('prime', 'ssm', init)`), which NNX
has no Variable type for: the port declares one, a subclass of `nnx.Variable` named after
the collection, so the variable keeps a type of its own (filtered apart from params with
`nnx.state(model, PrimeVariable)`) where Linen kept a collection of its own.

Hook: the rewriter's `self.variable` (`emit/variable_rewrites.py`) names the type; `draft.py`
writes each type used before the classes.
"""

from __future__ import annotations

from ... import _compat


def type_name(collection: str) -> str | None:
  """The drafted Variable type of a collection (`'prime'` -> `PrimeVariable`), or None when the
  collection's name makes no Python name."""
  words = [w for w in collection.replace("-", "_").split("_") if w]
  name = "".join(w[:1].upper() + w[1:] for w in words) + "Variable"
  return name if name.isidentifier() and words else None


def declaration(collection: str) -> str:
  """The class the port declares for `collection`, paired with the collection's name (so
  `lb.checkpoint.linen_to_nnx` and flax's bridge move the collection into it)."""
  name = type_name(collection)
  return (
    f"class {name}(nnx.Variable):\n"
    f'  """Linen\'s {collection!r} collection: a Variable type of its own, as in Linen."""\n'
    f"\n\n{_compat.register_variable_type_source(collection, str(name))}\n"
  )
