"""The routing rule and its baselines: exact choices for hand-built replica stats."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tierserve.config import CacheConfig
from tierserve.core.kv import KVCacheManager
from tierserve.priority import Priority
from tierserve.routing import ReplicaStats, RouteRequest, RoutingConfig, make_router, rank_replicas
from tierserve.routing.baselines import least_loaded, prefix_only
from tierserve.routing.types import hash_key, prefix_hashes

from .helpers import make_request

P0, P1, P2, P3 = Priority


def stats(rid: str, **kw) -> ReplicaStats:
    """An idle replica of 1,000 blocks and 8 seats, changed by `kw`."""
    base = dict(
        replica_id=rid,
        block_size=16,
        num_blocks=1000,
        free_blocks=1000,
        partition_free=(50, 200, 750),
        headroom=(1000, 950, 750, 950),
        used_blocks=(0, 0, 0, 0),
        p0_room=600,
        waiting=(0, 0, 0, 0),
        waiting_tokens=(0, 0, 0, 0),
        prefill_tokens=(0, 0, 0, 0),
        running=(0, 0, 0, 0),
        max_seats=8,
        max_step_tokens=2048,
        outstanding_tokens=0,
    )
    return ReplicaStats(**(base | kw))


def full_of(rid: str, cls: Priority, outstanding: int) -> ReplicaStats:
    """Every seat and every block outside the P0 floor (50 blocks) held by class `cls`."""
    per_class = [0, 0, 0, 0]
    per_class[cls] = 8
    used = [0, 0, 0, 0]
    used[cls] = 950
    return stats(
        rid,
        free_blocks=50,
        partition_free=(50, 0, 0),
        headroom=(50, 0, 0, 0),
        used_blocks=tuple(used),
        running=tuple(per_class),
        outstanding_tokens=outstanding,
    )


def req(priority: Priority, prompt: int = 100, prefix: tuple[int, ...] = ()) -> RouteRequest:
    return RouteRequest(priority, prompt, prefix)


def top(request, replicas, **cfg) -> tuple[str, str]:
    return rank_replicas(request, replicas, RoutingConfig(**cfg))[0]


# -- P0 ---------------------------------------------------------------------------------------


def test_p0_goes_to_the_replica_full_of_p3_not_the_one_full_of_p1():
    # Both must preempt for a seat and for blocks (the prompt needs 63 blocks, the P0 floor has
    # 50 free). P3 work is nearly free to displace; P1 is not. Least-loaded sees the P3 replica
    # as the busier one (long outputs) and picks the P1 one.
    p3 = full_of("a-p3", P3, outstanding=200_000)
    p1 = full_of("b-p1", P1, outstanding=50_000)
    r = req(P0, prompt=1000)
    assert rank_replicas(r, [p1, p3]) == [("a-p3", "p0-preempt"), ("b-p1", "p0-preempt")]
    assert rank_replicas(r, [p3, p1]) == [("a-p3", "p0-preempt"), ("b-p1", "p0-preempt")]
    assert least_loaded(r, [p1, p3])[0] == ("b-p1", "least-loaded")


def test_p0_prefers_free_room_to_preempting_even_cheap_work():
    free = stats("z-free", running=(0, 4, 0, 0), outstanding_tokens=90_000)
    p3 = full_of("a-p3", P3, outstanding=1_000)
    assert rank_replicas(req(P0, 1000), [p3, free]) == [
        ("z-free", "p0-free"),
        ("a-p3", "p0-preempt"),
    ]


def test_p0_queued_ahead_costs_p0_its_start():
    # 3,000 P0 tokens wait on one replica; the other must displace 63 blocks of P3 (about 50
    # weighted tokens).
    queued = stats("a", waiting=(3, 0, 0, 0), waiting_tokens=(3000, 0, 0, 0))
    p3 = full_of("b", P3, outstanding=500_000)
    assert top(req(P0, 1000), [queued, p3]) == ("b", "p0-preempt")
    # ...and P0 prompt tokens a running P0 request has yet to prefill count the same way.
    prefilling = stats("a", running=(1, 0, 0, 0), prefill_tokens=(3000, 0, 0, 0))
    assert top(req(P0, 1000), [prefilling, p3]) == ("b", "p0-preempt")


def test_p0_avoids_the_replica_whose_steps_carry_long_prefill_chunks():
    # A P0 arrival waits for the step in flight; lower-class prompt tokens still to prefill
    # make that step a long one, up to one step's budget.
    prefilling = stats("a", running=(0, 2, 0, 0), prefill_tokens=(0, 3000, 0, 0))
    decoding = stats("b", running=(0, 6, 0, 0), outstanding_tokens=50_000)
    assert rank_replicas(req(P0), [prefilling, decoding]) == [
        ("b", "p0-free"),
        ("a", "p0-free"),
    ]
    # Capped at one step (2,048 tokens): 100,000 to prefill weigh less than 3,000 P0 tokens
    # queued ahead.
    huge = replace(prefilling, prefill_tokens=(0, 60_000, 40_000, 0))
    p0_queue = stats("b", waiting=(2, 0, 0, 0), waiting_tokens=(3000, 0, 0, 0))
    assert top(req(P0), [huge, p0_queue]) == ("a", "p0-free")
    # P1 counts no P2/P3 work at all: to a P1 request, a is empty.
    assert top(req(P1), [replace(huge, prefill_tokens=(0, 0, 40_000, 0)), p0_queue])[0] == "a"


def test_p0_that_cannot_start_anywhere_soon_ranks_last():
    at_ceiling = stats("a", p0_room=10, outstanding_tokens=0)  # P0 holds all it may
    p1 = full_of("b", P1, outstanding=900_000)
    assert rank_replicas(req(P0, 1000), [at_ceiling, p1]) == [
        ("b", "p0-preempt"),
        ("a", "p0-wait"),
    ]
    # Seats all held by P0: nothing to preempt.
    all_p0 = stats("c", running=(8, 0, 0, 0), used_blocks=(400, 0, 0, 0), headroom=(600,) * 4)
    assert rank_replicas(req(P0, 100), [all_p0, p1])[-1] == ("c", "p0-wait")


def test_p0_displacement_follows_the_reclaim_order_lowest_class_first():
    # Mixed replica: P3 alone covers the shortfall, so it costs like the all-P3 one.
    mixed = stats(
        "a",
        free_blocks=50,
        headroom=(50, 0, 0, 0),
        used_blocks=(0, 450, 0, 500),
        running=(0, 4, 0, 4),
    )
    p2 = full_of("b", P2, outstanding=0)
    assert top(req(P0, 1000), [p2, mixed]) == ("a", "p0-preempt")


# -- P1..P3 -----------------------------------------------------------------------------------


def test_p1_goes_where_less_p0_and_p1_work_is_queued():
    a = stats("a", waiting_tokens=(0, 5000, 0, 0), outstanding_tokens=6_000)
    b = stats("b", waiting_tokens=(500, 1000, 40_000, 90_000), outstanding_tokens=140_000)
    assert top(req(P1), [a, b]) == ("b", "least-queued")
    assert least_loaded(req(P1), [a, b])[0][0] == "a"
    # A P3 request counts every class: b has more in all.
    assert top(req(P3), [a, b]) == ("a", "least-queued")
    # P2 counts P0..P2 but not P3: 5,000 on a against 41,500 on b.
    assert top(req(P2), [a, b]) == ("a", "least-queued")


def test_prompt_tokens_still_to_prefill_count_as_queued_work():
    a = stats("a", running=(0, 1, 0, 0), prefill_tokens=(0, 4000, 0, 0))
    b = stats("b", waiting_tokens=(0, 3000, 0, 0))
    assert top(req(P1), [a, b]) == ("b", "least-queued")


def test_equal_queues_fall_back_to_least_outstanding_then_replica_id():
    a = stats("a", outstanding_tokens=900)
    b = stats("b", outstanding_tokens=100)
    c = stats("c", outstanding_tokens=100)
    for order in ([a, b, c], [c, b, a], [b, a, c]):
        assert [rid for rid, _ in rank_replicas(req(P1), order)] == ["b", "c", "a"]
        assert [rid for rid, _ in rank_replicas(req(P0), order)] == ["b", "c", "a"]


def test_duplicate_replica_ids_are_refused():
    with pytest.raises(ValueError, match="duplicate"):
        rank_replicas(req(P1), [stats("a"), stats("a")])


# -- prefix affinity ----------------------------------------------------------------------------


H0, H1 = 11, 22


def test_prefix_holder_wins_within_the_margin_and_not_beyond():
    best = stats("a", waiting_tokens=(0, 1000, 0, 0))
    holder = stats("b", waiting_tokens=(0, 4000, 0, 0), prefix_hashes={H0, H1})
    r = req(P1, 500, (H0, H1))
    assert top(r, [best, holder]) == ("b", "prefix")  # 3,000 more, margin 4,096
    farther = replace(holder, waiting_tokens=(0, 6000, 0, 0))
    assert rank_replicas(r, [best, farther]) == [("a", "least-queued"), ("b", "least-queued")]
    # The relative margin takes over for long queues: 25% of 100,000.
    big = stats("a", waiting_tokens=(0, 100_000, 0, 0))
    near = stats("b", waiting_tokens=(0, 120_000, 0, 0), prefix_hashes={H0})
    assert top(r, [big, near]) == ("b", "prefix")
    assert top(r, [big, replace(near, waiting_tokens=(0, 130_000, 0, 0))])[0] == "a"
    # A zero margin turns affinity off.
    assert top(r, [best, holder], prefix_margin_tokens=0, prefix_margin_ratio=0)[0] == "a"


def test_longer_prefix_match_first_and_hashes_are_chained():
    r = req(P1, 500, (H0, H1))
    one = stats("a", prefix_hashes={H0})
    two = stats("b", prefix_hashes={H0, H1}, outstanding_tokens=50)
    second_only = stats("c", prefix_hashes={H1})  # block 1 without block 0 is no match
    # b holds more than the best by load (a) does: it moves ahead; a keeps its place.
    assert rank_replicas(r, [one, two, second_only]) == [
        ("b", "prefix"),
        ("a", "least-queued"),
        ("c", "least-queued"),
    ]
    three = stats("d", prefix_hashes={H0, H1}, outstanding_tokens=20)
    assert [x for x, _ in rank_replicas(r, [stats("e"), one, two, three])] == list("dbae")
    assert second_only.prefix_match(r) == 0


def test_nothing_moves_when_the_best_already_holds_the_prefix():
    r = req(P1, 500, (H0,))
    a = stats("a", prefix_hashes={H0})
    b = stats("b", prefix_hashes={H0}, outstanding_tokens=10)
    assert rank_replicas(r, [b, a]) == [("a", "least-queued"), ("b", "least-queued")]


def test_p0_prefix_affinity_never_trades_a_start_now_for_a_wait():
    r = req(P0, 500, (H0,))
    can = stats("a")
    cannot = stats("b", p0_room=0, prefix_hashes={H0})
    assert top(r, [can, cannot]) == ("a", "p0-free")


# -- baselines ----------------------------------------------------------------------------------


def test_round_robin_rotates_in_replica_id_order():
    rr = make_router("round-robin")
    reps = [stats("c"), stats("a"), stats("b")]
    firsts = [rr(req(P1), reps)[0][0] for _ in range(4)]
    assert firsts == ["a", "b", "c", "a"]


def test_prefix_only_ignores_load_and_least_loaded_ignores_classes():
    r = req(P1, 500, (H0,))
    busy_holder = stats(
        "a", waiting_tokens=(0, 90_000, 0, 0), outstanding_tokens=90_000, prefix_hashes={H0}
    )
    idle = stats("b")
    assert prefix_only(r, [idle, busy_holder])[0] == ("a", "prefix")
    assert prefix_only(req(P1), [idle, busy_holder])[0] == ("b", "no-prefix")
    assert top(r, [idle, busy_holder]) == ("b", "least-queued")


def test_unknown_router_name_is_refused():
    with pytest.raises(ValueError, match="priority-aware"):
        make_router("random")


# -- data -------------------------------------------------------------------------------------


def test_stats_survive_a_json_round_trip_and_bad_input_is_named():
    s = stats("r1", prefix_hashes={2**63 + 5, 7}, running=(1, 2, 3, 4), time=12.5)
    back = ReplicaStats.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s
    d = s.to_dict()
    with pytest.raises(ValueError, match=r"unknown field.*colour"):
        ReplicaStats.from_dict(d | {"colour": 1})
    with pytest.raises(ValueError, match=r"missing field.*waiting_tokens"):
        ReplicaStats.from_dict({k: v for k, v in d.items() if k != "waiting_tokens"})
    with pytest.raises(ValueError, match="running must be 4 non-negative"):
        ReplicaStats.from_dict(d | {"running": [1, 2]})
    with pytest.raises(ValueError, match="prompt_tokens"):
        RouteRequest(P1, 0)
    assert RouteRequest("realtime", 5).priority == P0


def test_request_prefix_hashes_match_the_kv_cache_and_are_tenant_salted():
    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=64))
    prompt = list(range(100, 120))
    cached = make_request(tokens=prompt, salt="tenant-a")
    assert kv.allocate_slots(cached, len(prompt)) is not None
    cached.num_computed_tokens = len(prompt)
    kv.cache_blocks(cached)
    want = tuple(hash_key(h) for h in cached.block_hashes[:2])
    assert RouteRequest.of(prompt, P1, 4, "tenant-a").prefix_hashes == want
    assert kv.pool.get_cached(cached.block_hashes[1]) is not None
    assert prefix_hashes(prompt, 4, "tenant-b")[0] != want[0]
    assert prefix_hashes(prompt[:5], 4, None, blocks=2) == prefix_hashes(prompt, 4, None)[:1]
