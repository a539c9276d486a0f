"""Exact-id tests of the KV cache manager on tiny pools (vLLM style)."""

import pytest

from tests.helpers import make_request
from tierserve.config import CacheConfig, PartitionConfig
from tierserve.core.kv import KVCacheError, KVCacheManager
from tierserve.priority import Priority

NO_PARTITIONS = PartitionConfig(
    p0_floor_min=0, p0_floor_max=0, p0_ceiling=1.0, p1_reserve=0, adaptive=False
)


def manager(num_blocks=10, block_size=4, cpu=0, caching=True, partitions=NO_PARTITIONS):
    kv = KVCacheManager(
        CacheConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            num_cpu_blocks=cpu,
            enable_prefix_caching=caching,
            partitions=partitions,
        )
    )
    return kv


def run_prefill(kv, req, computed=None):
    """Allocate a request's whole prompt (after prefix hits), mark it computed, cache blocks."""
    computed = computed or kv.get_computed_blocks(req)
    ids = kv.allocate_slots(req, req.num_tokens - computed.num_tokens, computed)
    assert ids is not None
    req.num_computed_tokens = req.num_tokens
    kv.cache_blocks(req)
    kv.check_invariants()
    return ids


def test_allocation_takes_lowest_free_ids_in_order():
    kv = manager()
    r1, r2 = make_request(10), make_request(5)
    assert kv.allocate_slots(r1, 10) == [0, 1, 2]
    assert kv.allocate_slots(r2, 5) == [3, 4]
    assert kv.pool.num_free == 5
    kv.check_invariants()


def test_free_puts_uncached_tail_first_and_cached_prefix_last_tail_first():
    kv = manager()
    r1 = make_request(10)
    run_prefill(kv, r1)  # blocks 0, 1 full (cached), block 2 partial
    kv.free(r1.request_id)
    # Partial block 2 holds nothing reusable: front. Cached blocks go to the back, the tail of
    # the request (block 1) before its head (block 0).
    assert kv.pool.free_block_ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    kv.check_invariants()


def test_prefix_hit_reuses_cached_blocks_and_counts_hits():
    kv = manager()
    shared = list(range(100, 108))
    r1 = make_request(tokens=[*shared, 1, 2])
    run_prefill(kv, r1)
    kv.free(r1.request_id)
    r2 = make_request(tokens=[*shared, 9, 9, 9], priority=Priority.P2)
    hit = kv.get_computed_blocks(r2)
    assert [b.block_id for b in hit.blocks] == [0, 1]
    assert hit.num_tokens == 8
    ids = kv.allocate_slots(r2, 3, hit)
    assert ids == [0, 1, 2]  # new block: the uncached block 2 from the front
    assert kv.stats().prefix_hits[Priority.P2] == 8
    assert kv.stats().prefix_queries[Priority.P2] == 11
    kv.check_invariants()


def test_prefix_hit_on_live_block_shares_it():
    kv = manager()
    tokens = list(range(200, 212))
    r1 = make_request(tokens=tokens)
    run_prefill(kv, r1)
    r2 = make_request(tokens=[*tokens, 5])
    hit = kv.get_computed_blocks(r2)
    assert [b.block_id for b in hit.blocks] == [0, 1, 2]
    assert kv.allocate_slots(r2, 1, hit) == [0, 1, 2, 3]
    assert [kv.pool.blocks[i].ref_cnt for i in range(4)] == [2, 2, 2, 1]
    kv.free(r1.request_id)
    assert [kv.pool.blocks[i].ref_cnt for i in range(4)] == [1, 1, 1, 1]
    kv.check_invariants()


def test_whole_prompt_cached_still_leaves_one_token_to_compute():
    kv = manager()
    tokens = list(range(300, 308))  # exactly 2 blocks
    run_prefill(kv, make_request(tokens=tokens))
    hit = kv.get_computed_blocks(make_request(tokens=tokens))
    assert hit.num_tokens == 4  # block 1 would leave nothing to compute


def test_cache_salt_separates_tenants():
    kv = manager()
    tokens = list(range(400, 412))
    run_prefill(kv, make_request(tokens=tokens, salt="tenant-a"))
    assert (
        kv.get_computed_blocks(make_request(tokens=[*tokens, 1], salt="tenant-b")).num_tokens == 0
    )
    assert kv.get_computed_blocks(make_request(tokens=[*tokens, 1], salt=None)).num_tokens == 0
    assert (
        kv.get_computed_blocks(make_request(tokens=[*tokens, 1], salt="tenant-a")).num_tokens == 12
    )


def test_blocks_are_cached_only_once_computed():
    kv = manager()
    r1 = make_request(tokens=list(range(500, 512)))
    kv.allocate_slots(r1, 12)
    assert kv.pool.num_cached == 0  # scheduled, not computed
    r1.num_computed_tokens = 8
    kv.cache_blocks(r1)
    assert kv.pool.num_cached == 2
    r1.num_computed_tokens = 12
    kv.cache_blocks(r1)
    assert kv.pool.num_cached == 3


def test_eviction_takes_uncached_first_then_least_recently_freed():
    kv = manager(num_blocks=6)
    a = make_request(tokens=list(range(600, 608)))  # blocks 0, 1 (cached)
    b = make_request(tokens=list(range(700, 708)))  # blocks 2, 3 (cached)
    run_prefill(kv, a)
    run_prefill(kv, b)
    kv.free(a.request_id)  # queue: 4 5 1 0
    kv.free(b.request_id)  # queue: 4 5 1 0 3 2
    assert kv.pool.free_block_ids() == [4, 5, 1, 0, 3, 2]
    c = make_request(12)
    assert kv.allocate_slots(c, 12) == [4, 5, 1]  # evicts a's tail block 1
    assert kv.pool.num_evictions == 1
    # a's first block is still a hit; its second is gone.
    assert kv.get_computed_blocks(make_request(tokens=[*range(600, 608), 1])).num_tokens == 4
    kv.check_invariants()


def test_allocation_failure_changes_nothing():
    kv = manager(num_blocks=4)
    r1 = make_request(12)
    assert kv.allocate_slots(r1, 12) == [0, 1, 2]
    r2 = make_request(8)
    before = kv.pool.free_block_ids()
    assert kv.allocate_slots(r2, 8) is None
    assert kv.pool.free_block_ids() == before
    assert not kv.holds(r2.request_id)
    kv.check_invariants()


def test_decode_allocates_a_block_only_at_a_boundary():
    kv = manager()
    r = make_request(4)
    assert kv.allocate_slots(r, 4) == [0]
    r.num_computed_tokens = 4
    r.append_output(7)
    assert kv.allocate_slots(r, 1) == [1]  # token 5 starts block 1
    r.num_computed_tokens = 5
    r.append_output(8)
    assert kv.allocate_slots(r, 1) == []
    kv.check_invariants()


def test_swap_out_and_in_exact_mappings():
    kv = manager(num_blocks=8, cpu=4)
    r = make_request(10)
    kv.allocate_slots(r, 10)
    r.num_computed_tokens = 10
    assert kv.swap_out(r) == [(0, 0), (1, 1), (2, 2)]
    assert kv.is_swapped(r.request_id) and not kv.holds(r.request_id)
    assert kv.pool.num_free == 8 and kv.swap.num_free == 1
    other = make_request(4)
    kv.allocate_slots(other, 4)
    # Uncached blocks went back to the front in request order (freed tail first, each to the
    # front), so block 0 is reused first.
    assert kv.block_ids(other.request_id) == [0]
    assert kv.swap_in(r) == [(0, 1), (1, 2), (2, 3)]
    assert kv.swap.num_free == 4
    kv.check_invariants()


def test_swap_out_keeps_only_computed_blocks():
    kv = manager(num_blocks=8, cpu=4)
    r = make_request(10)
    kv.allocate_slots(r, 10)
    r.num_computed_tokens = 3  # only block 0 holds computed KV
    assert kv.swap_out(r) == [(0, 0)]
    kv.check_invariants()


def test_swap_out_refused_when_swap_space_is_short():
    kv = manager(num_blocks=8, cpu=2)
    r = make_request(10)
    kv.allocate_slots(r, 10)
    r.num_computed_tokens = 10
    assert kv.swap_out(r) is None
    assert kv.holds(r.request_id)
    kv.check_invariants()


def test_bad_calls_are_refused_with_clear_errors():
    kv = manager()
    r = make_request(4)
    with pytest.raises(KVCacheError, match="unknown request"):
        kv.free("nope")
    kv.allocate_slots(r, 4)
    kv.free(r.request_id)
    with pytest.raises(KVCacheError, match="unknown request"):
        kv.free(r.request_id)  # double free
    with pytest.raises(KVCacheError, match="negative"):
        kv.allocate_slots(r, -1)
    with pytest.raises(KVCacheError, match="not swapped"):
        kv.swap_in(r)
    with pytest.raises(KVCacheError, match="holds no device blocks"):
        kv.swap_out(r)


def test_abort_of_swapped_request_frees_swap_space():
    kv = manager(num_blocks=8, cpu=4)
    r = make_request(8)
    kv.allocate_slots(r, 8)
    r.num_computed_tokens = 8
    kv.swap_out(r)
    kv.free(r.request_id)
    assert kv.swap.num_free == 4 and not kv.is_swapped(r.request_id)
    kv.check_invariants()


def test_fragmentation_counts_unused_slots():
    kv = manager()
    kv.allocate_slots(make_request(5), 5)  # 2 blocks, 8 slots, 5 used
    assert kv.stats().fragmentation == pytest.approx(3 / 8)


def test_without_prefix_caching_nothing_is_cached():
    kv = manager(caching=False)
    r = make_request(8)
    run_prefill(kv, r)
    assert kv.pool.num_cached == 0
    assert kv.get_computed_blocks(make_request(tokens=[*r.all_token_ids, 1])).num_tokens == 0
