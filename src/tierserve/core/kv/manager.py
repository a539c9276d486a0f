"""Per-request KV bookkeeping on top of the block pool, the partition ledger and swap space.

The scheduler sees request ids, block ids and counts, never the pool's internals. Every call that
allocates checks *and* commits in one go and returns ``None`` when it cannot.

Block table layout of a request with ``block_size`` 4 (``c`` computed, ``n`` scheduled now)::

    | prefix hit | prefix hit | c c c n | n n . . |
      blocks from get_computed_blocks     new blocks from allocate_slots

Full blocks are registered in the prefix cache only once their tokens are computed
(``cache_blocks`` after the step), so a request preempted after being scheduled never leaves a
cached block with garbage in it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tierserve.config import CacheConfig
from tierserve.core.kv.block_pool import BlockPool, KVBlock
from tierserve.core.kv.errors import KVCacheError
from tierserve.core.kv.hashing import extend_block_hashes
from tierserve.core.kv.partitions import PartitionLedger, PartitionUsage
from tierserve.core.kv.reclaim import Victim, reclaim_for, reclaim_order
from tierserve.core.kv.swap import SwapSpace
from tierserve.priority import NUM_PRIORITIES, Priority

if TYPE_CHECKING:
    from tierserve.request import Request


@dataclass(frozen=True)
class ComputedBlocks:
    """Prefix-cache hits for a request that holds no blocks yet (opaque to the scheduler)."""

    blocks: tuple[KVBlock, ...] = ()
    num_tokens: int = 0


NO_HITS = ComputedBlocks()


@dataclass(frozen=True)
class KVStats:
    num_blocks: int
    num_free: int
    num_cached: int
    partitions: PartitionUsage
    prefix_queries: tuple[int, ...]  # prompt tokens looked up, per class
    prefix_hits: tuple[int, ...]  # tokens found, per class
    fragmentation: float  # unused token slots in allocated blocks / slots allocated
    swap_total: int
    swap_used: int
    num_evictions: int

    def hit_rate(self, priority: Priority) -> float:
        q = self.prefix_queries[priority]
        return self.prefix_hits[priority] / q if q else 0.0

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks


@dataclass
class _Held:
    priority: Priority
    blocks: list[KVBlock] = field(default_factory=list)
    num_cached: int = 0  # leading blocks already registered in the prefix cache
    num_tokens: int = 0  # tokens the allocation covers


@dataclass
class _Swapped:
    priority: Priority
    cpu_block_ids: list[int]
    num_tokens: int


class KVCacheManager:
    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.pool = BlockPool(
            config.num_blocks, config.enable_prefix_caching, config.prefix_retention
        )
        self.ledger = PartitionLedger(
            config.partitions.resolve(config.num_blocks), config.partitions
        )
        self.swap = SwapSpace(config.num_cpu_blocks)
        self._held: dict[str, _Held] = {}
        self._swapped: dict[str, _Swapped] = {}
        self._queries = [0] * NUM_PRIORITIES
        self._hits = [0] * NUM_PRIORITIES

    # -- queries ---------------------------------------------------------------------------
    def holds(self, request_id: str) -> bool:
        return request_id in self._held

    def is_swapped(self, request_id: str) -> bool:
        return request_id in self._swapped

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self._get_held(request_id).blocks]

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks `request_id` holds on the device (0 when it holds none)."""
        held = self._held.get(request_id)
        return len(held.blocks) if held else 0

    def num_swapped_blocks(self, request_id: str) -> int:
        return len(self._swapped[request_id].cpu_block_ids)

    def blocks_needed(self, request: Request, num_new_tokens: int, computed: ComputedBlocks) -> int:
        held = self._held.get(request.request_id)
        have = len(held.blocks) if held else 0
        total = request.num_computed_tokens + computed.num_tokens + num_new_tokens
        return max(0, math.ceil(total / self.block_size) - have - len(computed.blocks))

    def usage(self) -> float:
        """Fraction of device blocks held by requests (cached free blocks count as free)."""
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    def headroom(self, priority: Priority) -> int:
        return min(self.ledger.headroom(priority), self.pool.num_free)

    def own_rooms(self, priority: Priority) -> list[int | None]:
        """Per class up to `priority`: ``PartitionLedger.own_room(k, priority)`` (None for
        `priority` itself: all its blocks count). The free parts together are bounded by the
        free blocks beyond `priority`'s headroom (what the pool really has)."""
        spare = self.pool.num_free - self.headroom(priority)
        rooms: list[int | None] = []
        for k in range(priority):
            room = self.ledger.own_room(Priority(k), priority)
            if room is not None and room > 0:
                room = min(room, max(0, spare))
                spare -= room
            rooms.append(room)
        return [*rooms, None]

    # -- prefix cache ----------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> ComputedBlocks:
        """Longest cached prefix of a request that holds no blocks. At least one token is left
        to compute (its logits are needed). Commits nothing."""
        if not self.pool.enable_caching or request.request_id in self._held:
            return NO_HITS
        if request.request_id in self._swapped:
            return NO_HITS
        if request.sampling_params.prompt_logprobs is not None:
            return NO_HITS  # its prompt logprobs need the logits of every prompt position
        bs = self.block_size
        hashes = extend_block_hashes(
            request.block_hashes, request.all_token_ids, bs, request.cache_salt
        )
        max_blocks = (request.num_tokens - 1) // bs
        hits: list[KVBlock] = []
        for h in hashes[:max_blocks]:
            blk = self.pool.get_cached(h)
            if blk is None:
                break
            hits.append(blk)
        if not hits:
            return NO_HITS
        return ComputedBlocks(tuple(hits), len(hits) * bs)

    def cache_blocks(self, request: Request) -> None:
        """Register the request's newly computed full blocks in the prefix cache."""
        held = self._held.get(request.request_id)
        if held is None or not self.pool.enable_caching:
            return
        full = min(request.num_computed_tokens // self.block_size, len(held.blocks))
        if full <= held.num_cached:
            return
        hashes = extend_block_hashes(
            request.block_hashes, request.all_token_ids, self.block_size, request.cache_salt
        )
        for i in range(held.num_cached, full):
            self.pool.cache_block(held.blocks[i], hashes[i])
        held.num_cached = full

    # -- allocation ------------------------------------------------------------------------
    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed: ComputedBlocks = NO_HITS
    ) -> list[int] | None:
        """Make room for `num_new_tokens` more tokens (after `computed` prefix hits, for a request
        holding no blocks yet). Returns the block ids appended to the request's block table, or
        None (nothing changed) when the pool or the request's partitions cannot give them."""
        if num_new_tokens < 0:
            raise KVCacheError(f"num_new_tokens must not be negative, got {num_new_tokens}")
        rid = request.request_id
        if rid in self._swapped:
            raise KVCacheError(f"request {rid} is swapped out: swap it in before allocating")
        held = self._held.get(rid)
        if held is not None:
            if computed.blocks:
                raise KVCacheError(
                    f"request {rid} already holds blocks; prefix hits are for new ones"
                )
            total = request.num_computed_tokens + num_new_tokens
            if total <= len(held.blocks) * self.block_size:  # fast path: fits in its blocks
                held.num_tokens = max(held.num_tokens, total)
                return []
        cls = held.priority if held is not None else request.priority
        need = self.blocks_needed(request, num_new_tokens, computed)
        revived = [b for b in computed.blocks if b.ref_cnt == 0]
        if need + len(revived) > self.pool.num_free:
            return None
        borrowed = self.ledger.plan(cls, need + len(revived))
        if borrowed is None:
            return None

        if held is None:
            held = self._held[rid] = _Held(cls)
            self._queries[cls] += request.num_tokens
            self._hits[cls] += computed.num_tokens
        # Cache retention follows the class the request was sent as (aging changes its
        # scheduling class, not how much its prefix is worth keeping).
        keep = request.base_priority
        self.pool.touch(computed.blocks, keep)
        new = self.pool.get_new_blocks(need, keep)
        self._charge(cls, revived + new, borrowed)
        held.blocks.extend(computed.blocks)
        held.blocks.extend(new)
        held.num_tokens = max(
            held.num_tokens, request.num_computed_tokens + computed.num_tokens + num_new_tokens
        )
        return [b.block_id for b in computed.blocks] + [b.block_id for b in new]

    def trim(self, request: Request) -> None:
        """Roll back the slots given for tokens that were not kept (rejected speculative
        drafts): the covered count shrinks to the request's known tokens. The blocks stay with
        the request (the executor's block table holds them too, and its next tokens fill them);
        none of them is cached, since only computed full blocks are. Nothing for a request that
        holds nothing (finished meanwhile)."""
        held = self._held.get(request.request_id)
        if held is not None:
            held.num_tokens = min(held.num_tokens, request.num_tokens)

    def free(self, request_id: str) -> None:
        """Release everything the request holds on the device or in swap space."""
        held = self._held.pop(request_id, None)
        if held is not None:
            self._release(held.blocks)
            return
        swapped = self._swapped.pop(request_id, None)
        if swapped is not None:
            self.swap.free(swapped.cpu_block_ids)
            return
        raise KVCacheError(
            f"free of unknown request {request_id!r}: it holds no KV (never allocated, or freed "
            "already)"
        )

    # -- swap ----------------------------------------------------------------------------
    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's computed KV to swap space and free its device blocks.
        Returns the (device, cpu) copies to make, or None when swap space is short."""
        held = self._get_held(request.request_id)
        keep = min(len(held.blocks), math.ceil(request.num_computed_tokens / self.block_size))
        cpu_ids = self.swap.allocate(keep)
        if cpu_ids is None:
            return None
        mapping = [(held.blocks[i].block_id, cpu_ids[i]) for i in range(keep)]
        del self._held[request.request_id]
        self._release(held.blocks)
        self._swapped[request.request_id] = _Swapped(
            held.priority, cpu_ids, request.num_computed_tokens
        )
        return mapping

    def swap_in(self, request: Request) -> list[tuple[int, int]] | None:
        """Bring a swapped request back. Returns the (cpu, device) copies, or None if no room."""
        rid = request.request_id
        sw = self._swapped.get(rid)
        if sw is None:
            raise KVCacheError(f"swap_in of {rid!r}, which is not swapped out")
        n = len(sw.cpu_block_ids)
        if n > self.pool.num_free:
            return None
        borrowed = self.ledger.plan(sw.priority, n)
        if borrowed is None:
            return None
        new = self.pool.get_new_blocks(n, request.base_priority)
        self._charge(sw.priority, new, borrowed)
        del self._swapped[rid]
        self._held[rid] = _Held(sw.priority, new, num_cached=0, num_tokens=sw.num_tokens)
        self.swap.free(sw.cpu_block_ids)
        return [(c, b.block_id) for c, b in zip(sw.cpu_block_ids, new, strict=True)]

    # -- partitions ------------------------------------------------------------------------
    def set_p1_waiting(self, waiting: bool) -> None:
        """P1 demand signal: while P1 waits, its idle reservation is not lent out."""
        self.ledger.p1_waiting = waiting

    def observe(self, now: float) -> None:
        self.ledger.observe(now)

    def set_p0_floor(self, target: int) -> int:
        return self.ledger.set_floor(target)

    def reclaim_order(
        self, for_priority: Priority, request_ids: list[str] | None = None
    ) -> list[Victim]:
        """Holders of device blocks in reclaim order (see reclaim.py)."""
        ids = list(self._held) if request_ids is None else request_ids
        return reclaim_order(self.ledger, self._held, for_priority, ids)

    def reclaim_for(self, priority: Priority, num_blocks: int) -> list[str]:
        """Requests of strictly lower classes whose preemption would let `priority` allocate
        `num_blocks` (see reclaim.py). Touches nothing."""
        if self.headroom(priority) >= num_blocks:
            return []
        return reclaim_for(self.ledger, self.reclaim_order(priority), priority, num_blocks)

    # -- observability and checks ------------------------------------------------------
    def stats(self) -> KVStats:
        slots = used_slots = 0
        for held in self._held.values():
            s = len(held.blocks) * self.block_size
            slots += s
            used_slots += min(s, held.num_tokens)
        return KVStats(
            num_blocks=self.pool.num_blocks,
            num_free=self.pool.num_free,
            num_cached=self.pool.num_cached,
            partitions=self.ledger.usage(),
            prefix_queries=tuple(self._queries),
            prefix_hits=tuple(self._hits),
            fragmentation=(1.0 - used_slots / slots) if slots else 0.0,
            swap_total=self.swap.num_blocks,
            swap_used=self.swap.num_used,
            num_evictions=self.pool.num_evictions,
        )

    def check_invariants(self) -> None:
        """Every block is free or held (ref counts equal references held, per block); charges
        match a recount; partitions and swap space are consistent. Raises AssertionError."""
        self.pool.check_invariants()
        refs: Counter[int] = Counter()
        for rid, held in self._held.items():
            ids = [b.block_id for b in held.blocks]
            if len(set(ids)) != len(ids):
                raise AssertionError(f"request {rid} holds a block twice")
            refs.update(ids)
            if rid in self._swapped:
                raise AssertionError(f"request {rid} is both held and swapped")
        used = [0] * NUM_PRIORITIES
        borrowed = [0] * NUM_PRIORITIES
        for blk in self.pool.blocks:
            if blk.ref_cnt != refs.get(blk.block_id, 0):
                raise AssertionError(
                    f"{blk}: ref_cnt {blk.ref_cnt} != {refs.get(blk.block_id, 0)} holders"
                )
            if (blk.ref_cnt > 0) != (blk.charge is not None):
                raise AssertionError(f"{blk}: charged={blk.charge} with ref_cnt {blk.ref_cnt}")
            if blk.charge is not None:
                used[blk.charge] += 1
                if blk.borrowed:
                    if blk.charge not in self.ledger.borrowers and blk.charge != Priority.P0:
                        raise AssertionError(f"{blk} borrowed by non-borrower {blk.charge}")
                    borrowed[blk.charge] += 1
            elif blk.borrowed:
                raise AssertionError(f"free {blk} still marked borrowed")
        self.ledger.check_invariants(used, borrowed)
        self.swap.check_invariants([s.cpu_block_ids for s in self._swapped.values()])

    # -- internals -----------------------------------------------------------------------
    def _get_held(self, request_id: str) -> _Held:
        held = self._held.get(request_id)
        if held is None:
            raise KVCacheError(f"request {request_id!r} holds no device blocks")
        return held

    def _charge(self, cls: Priority, blocks: list[KVBlock], borrowed: int) -> None:
        first_borrowed = len(blocks) - borrowed
        for i, blk in enumerate(blocks):
            blk.charge = cls
            blk.borrowed = i >= first_borrowed
        self.ledger.charge(cls, len(blocks), borrowed)

    def _release(self, blocks: list[KVBlock]) -> None:
        # Tail first: the tail of a request is the first of its blocks to be evicted.
        for blk in reversed(blocks):
            cls, was_borrowed = blk.charge, blk.borrowed
            if self.pool.release(blk):
                self.ledger.release(cls, 1, int(was_borrowed))
                blk.charge = None
                blk.borrowed = False
