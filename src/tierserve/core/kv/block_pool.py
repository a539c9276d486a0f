"""The device block pool: free queue in eviction order, reference counts, prefix-cache map.

Free queue layout (front is evicted/reused first)::

    front ─► [blocks holding nothing reusable] [cached blocks, least recently freed first] ◄─ back

* A freed block without a hash holds nothing any later request can reuse, so it goes to the
  front: it is reused before any cached block is evicted.
* A freed block with a hash stays findable through the cache map and goes to the back.
  Callers free a request's blocks tail first, so the tail of a finished request is evicted before
  its prefix (prefixes are what other requests share).
* Reusing a free block that has a hash evicts it from the cache map.

The pool knows nothing about requests or priorities; the manager charges blocks to classes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from tierserve.core.kv.errors import KVCacheError
from tierserve.priority import Priority


class KVBlock:
    __slots__ = ("block_hash", "block_id", "borrowed", "charge", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        # The class this block's memory is charged to while ref_cnt > 0, and whether it was
        # borrowed from the P1 reservation (see partitions.py).
        self.charge: Priority | None = None
        self.borrowed = False

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, charge={self.charge})"


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks <= 0:
            raise KVCacheError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, KVBlock] = {}
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """Free block ids in eviction order (for tests and invariant checks)."""
        return list(self._free)

    def get_cached(self, block_hash: bytes) -> KVBlock | None:
        return self._cached.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Take `n` blocks from the front of the free queue (evicting cached ones); ref = 1."""
        if n > len(self._free):
            raise KVCacheError(f"asked for {n} blocks, only {len(self._free)} free")
        out = []
        for _ in range(n):
            bid, _ = self._free.popitem(last=False)
            blk = self.blocks[bid]
            if blk.block_hash is not None:
                del self._cached[blk.block_hash]
                blk.block_hash = None
                self.num_evictions += 1
            blk.ref_cnt = 1
            out.append(blk)
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take one more reference on each block (prefix hit); free ones leave the free queue."""
        for blk in blocks:
            if blk.ref_cnt == 0:
                del self._free[blk.block_id]
            blk.ref_cnt += 1

    def release(self, blk: KVBlock) -> bool:
        """Drop one reference; return True when the block became free."""
        if blk.ref_cnt <= 0:
            raise KVCacheError(f"block {blk.block_id} released with ref_cnt {blk.ref_cnt}")
        blk.ref_cnt -= 1
        if blk.ref_cnt > 0:
            return False
        self._free[blk.block_id] = None
        if blk.block_hash is None:
            self._free.move_to_end(blk.block_id, last=False)
        return True

    def cache_block(self, blk: KVBlock, block_hash: bytes) -> bool:
        """Register a full, computed block under its hash. A block whose content is already
        cached under another block stays uncached (duplicates are not indexed twice)."""
        if not self.enable_caching or blk.block_hash is not None:
            return False
        if block_hash in self._cached:
            return False
        blk.block_hash = block_hash
        self._cached[block_hash] = blk
        return True

    def check_invariants(self) -> None:
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a block appears twice in the free queue")
        for blk in self.blocks:
            in_free = blk.block_id in free
            if blk.ref_cnt < 0:
                raise AssertionError(f"{blk} has a negative ref count")
            if in_free != (blk.ref_cnt == 0):
                raise AssertionError(f"{blk}: in free queue={in_free} but ref_cnt={blk.ref_cnt}")
            if blk.block_hash is not None and self._cached.get(blk.block_hash) is not blk:
                raise AssertionError(f"{blk} has a hash the cache map does not point back to")
        for h, blk in self._cached.items():
            if blk.block_hash != h:
                raise AssertionError(f"cache map entry points at {blk} with another hash")
