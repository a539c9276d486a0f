"""The device block pool: free blocks in eviction order, reference counts, prefix-cache map.

Free blocks, in the order they are reused (front first)::

    [blocks holding nothing reusable]  then  cached blocks, by eviction key, smallest first

* A freed block without a hash holds nothing any later request can reuse, so it is reused
  before any cached block is evicted.
* A freed block with a hash stays findable through the cache map until it is reused. Its
  eviction key is ``tick + credit[keep]``: ``tick`` counts the blocks handed out so far (the
  pool's own clock: a block is evicted when enough allocations came after it), ``keep`` is the
  most urgent class that held the block since it was filled (a P0 prefix hit on a block P3
  cached makes it P0's), and ``credit[c]`` is ``retention[c] x pool size`` blocks. With every
  credit 0 this is least-recently-freed order (plain LRU). With the default (P0 four pools, P1
  two, P2 one, P3 none) a background flood evicts its own cached blocks first, and a realtime
  prompt's cached prefix outlives four pools' worth of lower-class allocations beyond LRU,
  then goes like any other: the protection is bounded, so a prefix nobody asks for any more
  cannot hold the cache forever.
* At equal keys the block freed first goes first. Callers free a request's blocks tail first,
  so the tail of a finished request is evicted before its prefix (prefixes are what other
  requests share).
* Reusing a free block that has a hash evicts it from the cache map.

Each class's cached blocks sit in their own queue, in key order (the tick only grows), so
finding the next victim looks at the front of four queues.

The pool knows nothing about requests; the manager says which class takes or touches a block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from tierserve.config import CacheConfig
from tierserve.core.kv.errors import KVCacheError
from tierserve.priority import NUM_PRIORITIES, Priority

# Pool sizes of later allocations a cached block of each class outlives beyond LRU.
DEFAULT_RETENTION = CacheConfig().prefix_retention


class KVBlock:
    __slots__ = (
        "block_hash",
        "block_id",
        "borrowed",
        "charge",
        "evict_at",
        "freed_seq",
        "keep",
        "ref_cnt",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        # The class this block's memory is charged to while ref_cnt > 0, and whether it was
        # borrowed from the P1 reservation (see partitions.py).
        self.charge: Priority | None = None
        self.borrowed = False
        # Most urgent class that held it since it was handed out, and, while it is free and
        # cached, its eviction key.
        self.keep = NUM_PRIORITIES - 1
        self.evict_at = 0
        self.freed_seq = 0

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, charge={self.charge})"


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        retention: tuple[float, ...] = DEFAULT_RETENTION,
    ) -> None:
        if num_blocks <= 0:
            raise KVCacheError(f"num_blocks must be positive, got {num_blocks}")
        if len(retention) != NUM_PRIORITIES or any(r < 0 for r in retention):
            raise KVCacheError(f"retention needs {NUM_PRIORITIES} values >= 0, got {retention}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.credit = tuple(int(r * num_blocks) for r in retention)
        self._plain: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached_free: list[OrderedDict[int, None]] = [
            OrderedDict() for _ in range(NUM_PRIORITIES)
        ]
        self._cached: dict[bytes, KVBlock] = {}
        self._tick = 0
        self._freed = 0  # blocks freed so far: the order at equal keys
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._plain) + sum(len(q) for q in self._cached_free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """Free block ids in the order they would be reused (for tests and invariant checks)."""
        cached = sorted((b for q in self._cached_free for b in q), key=self._key)
        return list(self._plain) + cached

    def get_cached(self, block_hash: bytes) -> KVBlock | None:
        return self._cached.get(block_hash)

    def _key(self, block_id: int) -> tuple[int, int]:
        blk = self.blocks[block_id]
        return blk.evict_at, blk.freed_seq

    def _next_victim(self) -> int:
        """The free block to reuse next (there is one)."""
        if self._plain:
            return next(iter(self._plain))
        fronts = [next(iter(q)) for q in self._cached_free if q]
        return min(fronts, key=self._key)

    def _unfree(self, blk: KVBlock) -> None:
        if blk.block_hash is None:
            del self._plain[blk.block_id]
        else:
            del self._cached_free[blk.keep][blk.block_id]

    def get_new_blocks(self, n: int, cls: int = NUM_PRIORITIES - 1) -> list[KVBlock]:
        """Take `n` free blocks for class `cls` in reuse order (evicting cached ones); ref = 1."""
        if n > self.num_free:
            raise KVCacheError(f"asked for {n} blocks, only {self.num_free} free")
        out = []
        for _ in range(n):
            blk = self.blocks[self._next_victim()]
            self._unfree(blk)
            if blk.block_hash is not None:
                del self._cached[blk.block_hash]
                blk.block_hash = None
                self.num_evictions += 1
            blk.ref_cnt = 1
            blk.keep = cls
            self._tick += 1
            out.append(blk)
        return out

    def touch(self, blocks: Iterable[KVBlock], cls: int = NUM_PRIORITIES - 1) -> None:
        """Take one more reference on each block for class `cls` (a prefix hit); free ones
        leave the free queues."""
        for blk in blocks:
            if blk.ref_cnt == 0:
                self._unfree(blk)
            blk.ref_cnt += 1
            blk.keep = min(blk.keep, cls)

    def release(self, blk: KVBlock) -> bool:
        """Drop one reference; return True when the block became free."""
        if blk.ref_cnt <= 0:
            raise KVCacheError(f"block {blk.block_id} released with ref_cnt {blk.ref_cnt}")
        blk.ref_cnt -= 1
        if blk.ref_cnt > 0:
            return False
        if blk.block_hash is None:
            self._plain[blk.block_id] = None
            self._plain.move_to_end(blk.block_id, last=False)
        else:
            blk.evict_at = self._tick + self.credit[blk.keep]
            self._freed += 1
            blk.freed_seq = self._freed
            self._cached_free[blk.keep][blk.block_id] = None
        return True

    def cache_block(self, blk: KVBlock, block_hash: bytes) -> bool:
        """Register a full, computed block (held by a request) under its hash. A block whose
        content is already cached under another block stays uncached (duplicates are not
        indexed twice)."""
        if not self.enable_caching or blk.block_hash is not None or blk.ref_cnt == 0:
            return False
        if block_hash in self._cached:
            return False
        blk.block_hash = block_hash
        self._cached[block_hash] = blk
        return True

    def check_invariants(self) -> None:
        free = set(self._plain)
        for c, q in enumerate(self._cached_free):
            keys = [self._key(b) for b in q]
            if keys != sorted(keys):
                raise AssertionError(f"class {c}'s cached free blocks are out of key order")
            for b in q:
                blk = self.blocks[b]
                if blk.block_hash is None or blk.keep != c or b in free:
                    raise AssertionError(f"{blk} misplaced in class {c}'s cached free queue")
                free.add(b)
        if len(free) != self.num_free:
            raise AssertionError("a block appears twice in the free queues")
        for blk in self.blocks:
            in_free = blk.block_id in free
            if blk.ref_cnt < 0:
                raise AssertionError(f"{blk} has a negative ref count")
            if in_free != (blk.ref_cnt == 0):
                raise AssertionError(f"{blk}: in free queue={in_free} but ref_cnt={blk.ref_cnt}")
            if blk.block_id in self._plain and blk.block_hash is not None:
                raise AssertionError(f"{blk} has a hash but sits with the uncached free blocks")
            if blk.block_hash is not None and self._cached.get(blk.block_hash) is not blk:
                raise AssertionError(f"{blk} has a hash the cache map does not point back to")
        for h, blk in self._cached.items():
            if blk.block_hash != h:
                raise AssertionError(f"cache map entry points at {blk} with another hash")
