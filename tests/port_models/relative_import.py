"""A class importing a helper relative to its package inside a method (HF's encoder-decoder
wrappers import their parts in setup: `from ...models.auto import ...`)."""

import flax.linen as nn


class ImportsRelativeInSetup(nn.Module):
  features: int = 3

  def setup(self):
    from .relative_helpers import squash

    self.squash = squash
    self.proj = nn.Dense(self.features)

  def __call__(self, x):
    return self.squash(self.proj(x))
