"""Paged KV cache bookkeeping (no tensors): block pool, prefix cache, partitions, swap space."""

from tierserve.core.kv.errors import KVCacheError
from tierserve.core.kv.manager import ComputedBlocks, KVCacheManager, KVStats
from tierserve.core.kv.reclaim import Victim

__all__ = ["ComputedBlocks", "KVCacheError", "KVCacheManager", "KVStats", "Victim"]
