"""Placing record buffers on a device mesh.

`lb.lazy_init` / `lb.preallocate` already shard each buffer like the batch-sharded sample
arguments it records; `shard_buffers` overrides that layout explicitly.
"""

from ._core.errors import ShardingError as ShardingError
from ._sharding.shard_buffers import shard_buffers as shard_buffers

__all__ = [
  "ShardingError",
  "shard_buffers",
]
