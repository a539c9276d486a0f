"""Per-priority partitions: floor, ceiling, elastic reservation, borrowing, reclaim order."""

import pytest

from tests.helpers import make_request
from tierserve.config import CacheConfig, ConfigError, PartitionConfig
from tierserve.core.kv import KVCacheManager
from tierserve.priority import Priority

P0, P1, P2, P3 = Priority

# 20 blocks of 4 tokens: floor 4 (P0 only), reservation 6 (P1), shared 10, P0 ceiling 10.
PARTS = PartitionConfig(p0_floor_min=4, p0_floor_max=4, p0_ceiling=10, p1_reserve=6, adaptive=False)


def kv20(parts=PARTS):
    return KVCacheManager(CacheConfig(block_size=4, num_blocks=20, partitions=parts))


def alloc(kv, blocks, priority):
    r = make_request(blocks * 4, priority)
    ids = kv.allocate_slots(r, blocks * 4)
    kv.check_invariants()
    return r if ids is not None else None


def test_p2_lives_in_shared_only_and_cannot_borrow():
    kv = kv20()
    assert alloc(kv, 10, P2) is not None
    assert alloc(kv, 1, P2) is None
    u = kv.stats().partitions
    assert (u.shared_used, u.reserve_used, u.floor_used) == (10, 0, 0)


def test_p3_borrows_idle_reservation_and_is_marked_borrowed():
    kv = kv20()
    alloc(kv, 10, P2)
    r3 = alloc(kv, 4, P3)
    assert r3 is not None
    assert kv.stats().partitions.borrowed == 4
    assert alloc(kv, 3, P3) is None  # only 2 lendable blocks remain
    assert alloc(kv, 2, P3) is not None
    assert kv.stats().partitions.reserve_used == 6


def test_no_lending_while_p1_waits():
    kv = kv20()
    alloc(kv, 10, P2)
    kv.set_p1_waiting(True)
    assert alloc(kv, 1, P3) is None
    kv.set_p1_waiting(False)
    assert alloc(kv, 1, P3) is not None


def test_p1_fills_its_reservation_then_shared():
    kv = kv20()
    assert alloc(kv, 8, P1) is not None
    u = kv.stats().partitions
    assert (u.reserve_used, u.shared_used) == (6, 2)
    assert alloc(kv, 8, P2) is not None
    assert alloc(kv, 1, P1) is None  # reserve and shared full; the floor is P0's


def test_p0_floor_then_shared_up_to_ceiling():
    kv = kv20()
    assert alloc(kv, 10, P0) is not None  # 4 floor + 6 shared
    assert alloc(kv, 1, P0) is None  # ceiling
    u = kv.stats().partitions
    assert (u.floor_used, u.shared_used) == (4, 6)


def test_p0_keeps_its_floor_when_everyone_else_is_full():
    kv = kv20()
    alloc(kv, 10, P2)
    alloc(kv, 6, P1)

    assert alloc(kv, 1, P3) is None
    assert alloc(kv, 4, P0) is not None
    assert alloc(kv, 1, P0) is None


def test_hard_floor_is_never_used_by_other_classes():
    kv = kv20()
    for cls in (P1, P2, P3, P1, P2, P3):
        while alloc(kv, 1, cls) is not None:
            pass
    assert sum(kv.ledger.used[1:]) == 16
    assert kv.pool.num_free == 4


def fill_for_reclaim(kv):
    a = alloc(kv, 5, P2)
    b = alloc(kv, 3, P2)
    d = alloc(kv, 2, P3)  # shared is now full
    c = alloc(kv, 4, P3)  # borrowed from the reservation
    assert kv.stats().partitions.borrowed == 4
    return a, b, c, d


def test_reclaim_for_p1_takes_borrowed_blocks_first():
    kv = kv20()
    _a, _b, c, _d = fill_for_reclaim(kv)
    assert kv.reclaim_for(P1, 2) == []  # enough room already
    assert kv.reclaim_for(P1, 4) == [c.request_id]


def test_reclaim_for_p0_takes_p3_borrowed_blocks_first():
    kv = kv20()
    _a, _b, c, _d = fill_for_reclaim(kv)
    # P0 has its free floor (4) and the reservation's free space (2): 6 fit already.
    assert kv.reclaim_for(P0, 6) == []
    # The reservation protects P1 from lower classes, not from P0: c's borrowed blocks help.
    assert kv.reclaim_for(P0, 8) == [c.request_id]
    assert kv.reclaim_for(P0, 11) == []  # the ceiling (10) cannot be passed by reclaiming


def test_reclaim_skips_victims_that_would_not_help():
    kv = kv20()
    _a, _b, _c, d = fill_for_reclaim(kv)
    # P2 cannot use the reservation, so c's borrowed blocks are useless to it.
    assert kv.reclaim_for(P2, 2) == [d.request_id]


def test_p0_uses_idle_reservation_space_after_floor_and_shared():
    kv = kv20()
    alloc(kv, 10, P2)  # shared full
    assert alloc(kv, 6, P0) is not None  # 4 floor + 2 of the reservation
    assert kv.stats().partitions.borrowed == 2
    assert alloc(kv, 5, P1) is None  # 4 reservation blocks left for P1
    assert alloc(kv, 4, P1) is not None


def test_own_room_is_what_a_class_grows_into_before_anothers_room():
    kv = kv20()  # floor 4, reservation 6, shared 10
    alloc(kv, 1, P0)
    alloc(kv, 2, P1)
    assert kv.ledger.own_room(P0, P1) == kv.ledger.own_room(P0, P3) == 3  # its free floor
    assert kv.ledger.own_room(P1, P2) == 4  # its free reservation
    assert kv.ledger.own_room(P1, P3) is None  # P3 borrows it while P1 is not waiting
    assert kv.ledger.own_room(P1, P0) is None  # P0 may take the reservation's free space
    assert kv.ledger.own_room(P2, P3) is None and kv.ledger.own_room(P1, P1) is None
    assert kv.own_rooms(P2) == [3, 4, None]
    kv.set_p1_waiting(True)  # no lending while P1 waits: the reservation is P1's again
    assert kv.ledger.own_room(P1, P3) == 4
    assert kv.own_rooms(P3) == [3, 4, None, None]
    alloc(kv, 7, P1)  # 9 in all: 6 in the reservation, 3 beyond it (the first it gives back)
    assert kv.ledger.own_room(P1, P2) == -3
    assert kv.own_rooms(P2) == [3, -3, None]


def test_reclaim_never_offers_same_or_higher_class():
    kv = kv20()
    fill_for_reclaim(kv)
    assert kv.reclaim_for(P2, 3) == []  # shared full of P2/P3; P3 d frees 2 -> not enough
    v = kv.reclaim_for(P2, 2)
    assert len(v) == 1 and kv.reclaim_order(P2)[1].priority == P3


def test_reclaim_touches_nothing():
    kv = kv20()
    fill_for_reclaim(kv)
    before = (list(kv.ledger.used), kv.pool.num_free)
    kv.reclaim_for(P0, 8)
    assert (list(kv.ledger.used), kv.pool.num_free) == before


def test_adaptive_floor_follows_p0_demand_between_min_and_max():
    parts = PartitionConfig(
        p0_floor_min=1,
        p0_floor_max=8,
        p0_ceiling=10,
        p1_reserve=6,
        window_s=1.0,
        ewma_alpha=0.5,
        headroom=1.25,
    )
    kv = kv20(parts)
    assert kv.ledger.floor == 8  # starts at the max
    kv.observe(0.0)
    kv.observe(1.0)  # window peak 0 -> ewma 0 -> floor clamps to min 1
    assert kv.ledger.floor == 1
    r = alloc(kv, 4, P0)
    kv.observe(1.5)
    kv.free(r.request_id)
    kv.observe(2.0)  # peak 4 -> ewma 0.5*4 + 0.5*0 = 2 -> ceil(2.5) = 3
    assert kv.ledger.floor == 3
    kv.observe(3.0)  # peak 0 -> ewma 1 -> ceil(1.25) = 2
    assert kv.ledger.floor == 2
    kv.check_invariants()


def test_floor_growth_never_takes_blocks_in_use():
    parts = PartitionConfig(p0_floor_min=0, p0_floor_max=8, p0_ceiling=10, p1_reserve=6)
    kv = kv20(parts)
    kv.set_p0_floor(0)
    big = alloc(kv, 14, P2)  # shared is 14 while the floor is 0
    assert big is not None
    assert kv.set_p0_floor(8) == 0  # nothing free to give the floor
    kv.check_invariants()
    assert alloc(kv, 6, P0) is not None  # the idle P1 reservation is all that is free
    assert alloc(kv, 1, P0) is None
    assert kv.reclaim_for(P0, 1) == [big.request_id]
    kv.free(big.request_id)
    assert kv.set_p0_floor(8) == 8
    kv.check_invariants()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"p1_reserve": -1}, "negative"),
        ({"p1_reserve": 1.5}, r"\[0, 1\]"),
        ({"p0_floor_min": 0.3, "p0_floor_max": 0.2}, "exceeds p0_floor_max"),
        ({"p0_floor_max": 0.7, "p0_ceiling": 0.6}, "exceeds p0_ceiling"),
        ({"p0_floor_max": 0.5, "p1_reserve": 0.6, "p0_ceiling": 0.9}, "more than the pool"),
        ({"p0_ceiling": 2000}, "exceeds the pool"),
        ({"p1_reserve": "lots"}, "fraction"),
        ({"borrowers": (Priority.P1,)}, "borrowers"),
    ],
)
def test_bad_partition_config_is_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        CacheConfig(num_blocks=1000, partitions=PartitionConfig(**kwargs))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_blocks": -5}, "num_blocks"),
        ({"block_size": 0}, "block_size"),
        ({"num_cpu_blocks": -1}, "num_cpu_blocks"),
    ],
)
def test_bad_cache_config_is_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        CacheConfig(**kwargs)
