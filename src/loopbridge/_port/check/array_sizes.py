"""Widths written as literals that equal a size of an array no check resizes.

A width matched by value is checked at configurations where every setting differs
(`tracing/distinct.py`), and the port at another size of each input array's axes the draft
reads (`class_check.other_input_size`). Neither changes an array a field holds or one nested
in an argument (a tuple of LSTM states). evojax's attention neuron reads
`nn.Dense(...)(self.pos_em)`: the input width is the table's last axis (5), so the literal 5
passed every check and the port was wrong for another table. A literal equal to the size of
such an array is not proven by those checks: the draft is not `ok`, and the report names the
literal and the arrays of that size.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
import numpy as np
from flax import linen as nn

from ..records import Call


def array_sizes(module: nn.Module, calls: tp.Sequence[Call]) -> dict[int, str]:
  """{size: where it is (at most three places)} for every axis (of size 2 or more) of the
  arrays the module's fields hold and those nested in the calls' arguments (an argument that
  is itself an array has its sizes checked at others)."""
  places: dict[int, list[str]] = {}

  def add(value: object, where: str, nested_only: bool = False) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(value):
      if isinstance(leaf, (jax.Array, np.ndarray)) and (path or not nested_only):
        for axis, size in enumerate(leaf.shape):
          if int(size) >= 2:
            places.setdefault(int(size), []).append(
              f"{where}{jax.tree_util.keystr(path)} axis {axis}"
            )

  for call in calls:
    for i, arg in enumerate(call.args):
      add(arg, f"argument {i}", nested_only=True)
    for name, arg in call.kwargs.items():
      add(arg, f"argument {name}", nested_only=True)
  if dataclasses.is_dataclass(module):
    for f in dataclasses.fields(module):
      value = getattr(module, f.name, None)
      if not isinstance(value, nn.Module):
        add(value, f"field {f.name}")
  return {size: ", ".join(dict.fromkeys(where[:3])) for size, where in places.items()}


def unproven(literals: tp.Iterable[tp.Any], sizes: tp.Mapping[int, str]) -> list[str]:
  """One line per width written as a number that equals one of `sizes`."""
  out = []
  for lit in literals:
    if isinstance(lit.value, int) and lit.expression == str(lit.value) and lit.value in sizes:
      out.append(
        f"{lit.cls}: {lit.hint} is written {lit.expression}, a size of the sample's arrays "
        f"({sizes[lit.value]}) no check changed: write it from that size "
        "(or pass draft(configs=[...]) an instance where it differs)"
      )
  return out
