"""The model `loopbridge inspect` uses when no TARGET is given: a small MLP that sows.

A Linen MLP that sows its input at the top level and each layer's output inside an `nn.scan`
body (`variable_axes={'params': 0, 'intermediates': 0}`); width 100,
depth 3, called on `float32[1,100]`. Stock `flax.nnx.bridge.ToNNX` cannot run it in
`nnx.while_loop`; `lb.ToNNX` can.
"""

from __future__ import annotations

import flax.linen as nn

WIDTH = 100
DEPTH = 3
DEFAULT_ARGS = (f"float32[1,{WIDTH}]",)
DESCRIPTION = (
  f"default model: MLP(depth={DEPTH}), width {WIDTH}, a sow at the top level and one inside nn.scan"
)


class Block(nn.Module):
  """The scan body: Dense + relu, sows its carry."""

  features: int = WIDTH

  @nn.compact
  def __call__(self, carry, unused_inputs):
    carry = nn.Dense(self.features)(carry)
    carry = nn.relu(carry)
    self.sow("intermediates", "carry", carry)
    return carry, None


class MLP(nn.Module):
  """Sows its input, then runs `depth` Blocks with `nn.scan`."""

  depth: int = DEPTH
  features: int = WIDTH

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    scan_block = nn.scan(
      Block,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True},
      length=self.depth,
    )(self.features)
    carry, _ = scan_block(x, None)
    return carry


def default_model() -> nn.Module:
  """The default MLP (depth 3, width 100)."""
  return MLP()
