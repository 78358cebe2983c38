"""`lb.port.draft` of a width that only the size of an array a field holds decides (a position
table handed in as a field): no configuration the draft traces changes that array, so a width
written as its number is not proven, and the draft is not `ok`; the report names the array.
A width read from the call's own array stays `ok` (the check runs it at another size).

The reference is Linen's own `init` with another table: its kernel follows the table.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from symbolic_port_helpers import load

import loopbridge as lb

pytest.importorskip("libcst")

SOURCE = """
import flax.linen as nn
import numpy as np


class Queries(nn.Module):
  width: int
  table: np.ndarray

  @nn.compact
  def __call__(self, x):
    q = nn.Dense(self.width)(self.table)
    k = nn.Dense(self.width)(x)
    return k @ q.T
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return load(tmp_path_factory.mktemp("array_sizes"), "array_size_models", SOURCE)


def test_a_width_from_a_fields_array_is_not_ok_as_a_literal(models):
  table = np.ones((6, 5), np.float32)
  x = jax.random.normal(jax.random.key(0), (3, 7))
  draft = lb.port.draft(models.Queries(4, table), x)
  # Not `ok` for the literal alone (the report says so), whatever the check found (flax 0.10's
  # NNX refuses an array attribute; newer ones hold it, and the port is equal at the sample).
  assert not draft.ok
  assert "Dense_0_in_features is written 5" in draft.report()
  assert "(field table axis 1) no check changed" in draft.report()
  assert "Dense_1_in_features" not in draft.report()  # `x_features`: checked at another size


def test_at_another_table_the_literal_is_what_linen_disproves(models):
  """What the refusal stands for: where the table differs (a configuration the user gives),
  Linen's kernel follows the table and the draft is not equal."""
  x = jax.random.normal(jax.random.key(0), (3, 7))
  wide = models.Queries(4, np.ones((6, 9), np.float32))
  assert wide.init(jax.random.key(0), x)["params"]["Dense_0"]["kernel"].shape == (9, 4)
  draft = lb.port.draft(models.Queries(4, np.ones((6, 5), np.float32)), x, configs=[wide])
  assert not draft.ok and draft.check is not None and not draft.check.equal
