"""Scheduling policies: ordering properties, fairness shares, aging, tenant fairness, victims."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import make_request
from tierserve.config import ConfigError, PolicyConfig
from tierserve.policies import (
    POLICIES,
    PolicyRegistry,
    SchedulerState,
    VictimCandidate,
    create_policy,
)
from tierserve.policies.base import Policy
from tierserve.priority import Priority
from tierserve.request import RequestStatus

NAMES = ["fcfs", "strict", "drr", "wfq", "hybrid"]
P0, P1, P2, P3 = Priority


def policy(name, **kw):
    return create_policy(PolicyConfig(name=name, **kw))


def req(prio, prompt=16, max_tokens=16, arrival=0.0, tenant="default", deadline=None):
    return make_request(
        prompt, prio, max_tokens=max_tokens, arrival=arrival, tenant=tenant, deadline=deadline
    )


# -- registry -------------------------------------------------------------------------------------


def test_registry_lists_the_builtin_policies():
    assert POLICIES.names() == sorted(NAMES)


def test_registry_refuses_a_duplicate_name_and_returns_the_class():
    reg = PolicyRegistry()

    @reg.register("mine")
    class Mine(Policy):
        pass

    assert Mine.name == "mine" and reg.get("mine") is Mine
    with pytest.raises(ValueError, match="already registered"):
        reg.register("mine")(Mine)


def test_unknown_policy_name_lists_the_available_ones():
    with pytest.raises(ConfigError, match=r"unknown policy 'lifo'.*drr, fcfs, hybrid, strict, wfq"):
        policy("lifo")


# -- properties on random streams -----------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "pop", "pop", "remove", "requeue", "tick"]),
        st.integers(0, 3),
        st.integers(1, 400),
        st.integers(0, 1_000),
    ),
    max_size=120,
)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_every_request_is_popped_or_removed_exactly_once(name, ops):
    p = policy(name)
    now = 0.0
    live, done = {}, set()
    served_objs = {}
    for op, prio, size, pick in ops:
        state = SchedulerState(now=now, idle_seats=1)
        if op == "add":
            r = req(prio, prompt=size, arrival=now, tenant=f"t{pick % 3}")
            p.add(r)
            live[r.request_id] = r
        elif op == "pop":
            peeked = p.peek(state)
            r = p.pop_next(state)
            assert r is peeked
            if r is not None:
                assert r.request_id in live and r.request_id not in done
                del live[r.request_id]
                served_objs[r.request_id] = r
        elif op == "remove" and live:
            rid = sorted(live)[pick % len(live)]
            assert p.remove(live.pop(rid))
            done.add(rid)
            assert not p.remove(served_objs.get(rid, req(0)))
        elif op == "requeue" and served_objs:
            rid = sorted(served_objs)[pick % len(served_objs)]
            r = served_objs.pop(rid)
            p.requeue_preempted(r)
            live[rid] = r
        elif op == "tick":
            now += pick / 100.0
        assert len(p) == len(live)
        assert sum(p.waiting_by_class()) == len(live)
    # Drain: everything still live comes out exactly once; best-effort needs idle seats.
    out = []
    while (r := p.pop_next(SchedulerState(now=now, idle_seats=1))) is not None:
        out.append(r.request_id)
    assert sorted(out) == sorted(live)
    assert len(p) == 0


@settings(max_examples=100, deadline=None)
@given(ops=OPS)
def test_strict_never_serves_a_lower_class_while_a_higher_one_waits(ops):
    p = policy("strict")
    waiting = {}
    for op, prio, size, pick in ops:
        if op == "add":
            r = req(prio, prompt=size)
            p.add(r)
            waiting[r.request_id] = r
        elif op == "pop":
            r = p.pop_next(SchedulerState())
            if r is not None:
                assert r.priority == min(w.priority for w in waiting.values())
                del waiting[r.request_id]
        elif op == "remove" and waiting:
            rid = sorted(waiting)[pick % len(waiting)]
            p.remove(waiting.pop(rid))


def backlog_shares(name, rng, pops=6000, **kw):
    """Keep every class backlogged; return each class's share of served tokens."""
    p = policy(name, aging=False, **kw)
    for prio in Priority:
        for _ in range(3):
            p.add(req(prio, prompt=rng.randint(16, 2048), max_tokens=rng.randint(1, 512)))
    served = [0, 0, 0, 0]
    for _ in range(pops):
        r = p.pop_next(SchedulerState())
        served[r.priority] += p.cost(r)
        p.add(req(r.priority, prompt=rng.randint(16, 2048), max_tokens=rng.randint(1, 512)))
    total = sum(served)
    return [s / total for s in served]


@pytest.mark.parametrize(
    ("name", "weights_field"), [("drr", "drr_weights"), ("wfq", "wfq_weights")]
)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_backlogged_classes_get_token_shares_within_10_percent_of_weights(
    name, weights_field, seed
):
    weights = getattr(PolicyConfig(), weights_field)
    shares = backlog_shares(name, random.Random(seed))
    for c, w in enumerate(weights):
        expect = w / sum(weights)
        assert abs(shares[c] - expect) <= 0.10 * expect, (c, shares, expect)


def test_drr_long_requests_cost_more_rounds_than_short_ones():
    p = policy("drr", drr_quantum_tokens=100, drr_weights=(1, 1, 1, 1))
    long_, short = [req(P1, prompt=1000) for _ in range(3)], [req(P2, prompt=10) for _ in range(30)]
    for r in long_ + short:
        p.add(r)
    order = [p.pop_next(SchedulerState()).priority for _ in range(20)]
    assert order.count(P2) > 3 * order.count(P1)


@pytest.mark.parametrize("name", ["wfq", "hybrid"])
def test_aging_promotes_on_schedule_within_one_service_time(name):
    """A request that has waited past its class threshold is promoted by the next decision,
    i.e. within one service time (dt) of crossing, and promotions chain through classes."""
    cfg = PolicyConfig()
    p = policy(name)
    th = cfg.aging_thresholds_s
    top = 1 if name == "hybrid" else 0
    rng = random.Random(5)
    dt = 0.25
    now = 0.0
    waiting = {}
    for _ in range(800):
        for _ in range(rng.randint(0, 3)):
            r = req(rng.choice([P1, P2, P3]), prompt=rng.randint(8, 64), arrival=now)
            p.add(r)
            waiting[r.request_id] = r
        # Nobody is served (the engine is saturated): one decision per service time.
        p.peek(SchedulerState(now=now, idle_seats=0))
        for r in waiting.values():
            # Expected class from the schedule: thresholds are cumulative from arrival.
            c, t_cross = int(r.base_priority), r.arrival_time
            while c > top and th[c] is not None and now >= t_cross + th[c]:
                t_cross += th[c]
                c -= 1
            assert int(r.priority) == c, (r, now)
        now += dt
    assert p.promotions > 0


def test_hybrid_never_promotes_into_p0_and_wfq_does():
    for name, expect in (("hybrid", P1), ("wfq", P0)):
        p = policy(name)
        r = req(P3, arrival=0.0)
        p.add(r)
        p.refresh(1000.0)
        assert r.priority == expect
        assert r.base_priority == P3


def test_hybrid_serves_p0_first_and_p3_only_when_idle():
    p = policy("hybrid")
    r3, r2, r0 = req(P3), req(P2), req(P0)
    for r in (r3, r2, r0):
        p.add(r)
    assert p.pop_next(SchedulerState(idle_seats=4)) is r0
    assert p.pop_next(SchedulerState(idle_seats=4)) is r2
    assert p.pop_next(SchedulerState(idle_seats=0)) is None  # P3 waits for idle seats
    assert p.pop_next(SchedulerState(idle_seats=1)) is r3


def test_wfq_serves_earliest_deadline_first_inside_a_class():
    p = policy("wfq", tenant_fairness=False)
    late = req(P1, arrival=0.0)  # deadline 0 + 5 s SLA
    urgent = req(P1, arrival=1.0, deadline=2.0)
    p.add(late)
    p.add(urgent)
    assert p.pop_next(SchedulerState(now=1.0)) is urgent


@pytest.mark.parametrize("name", NAMES)
def test_preempted_request_goes_back_to_the_head_of_its_class(name):
    p = policy(name)
    first = req(P2, arrival=0.0)
    p.add(first)
    assert p.pop_next(SchedulerState(idle_seats=1)) is first
    later = [req(P2, arrival=float(i)) for i in range(1, 4)]
    for r in later:
        p.add(r)
    p.requeue_preempted(first)
    assert p.pop_next(SchedulerState(now=5.0, idle_seats=1)) is first


@pytest.mark.parametrize("name", ["wfq", "hybrid"])
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_two_backlogged_tenants_stay_within_twice_the_largest_cost(name, seed):
    rng = random.Random(seed)
    p = policy(name, aging=False)
    served = {"a": 0, "b": 0}
    max_cost = 0
    # Tenant a floods with big requests, b sends small ones; both stay backlogged (each always
    # has queued requests, even right after one of its requests is served).
    for t in ("a", "a", "a", "b", "b"):
        p.add(req(P1, prompt=rng.randint(16, 3000), tenant=t))
    for _ in range(400):
        r = p.pop_next(SchedulerState())
        cost = p.cost(r)
        max_cost = max(max_cost, cost)
        served[r.tenant] += cost
        size = rng.randint(500, 3000) if r.tenant == "a" else rng.randint(16, 200)
        p.add(req(P1, prompt=size, tenant=r.tenant))
        assert abs(served["a"] - served["b"]) <= 2 * max_cost


def test_tenant_returning_from_idle_does_not_bank_credit():
    p = policy("wfq", aging=False)
    for _ in range(50):
        p.add(req(P1, prompt=100, tenant="a"))
    for _ in range(40):
        p.pop_next(SchedulerState())
    # b arrives late: it is lifted to a's counter, so a is not starved for 40 turns.
    for _ in range(10):
        p.add(req(P1, prompt=100, tenant="b"))
    order = [p.pop_next(SchedulerState()).tenant for _ in range(10)]
    assert 4 <= order.count("a") <= 6


# -- victims ---------------------------------------------------------------------------------------


def running(prio, arrival):
    r = req(prio, arrival=arrival)
    r.transition(RequestStatus.RUNNING)
    return r


@pytest.mark.parametrize("name", ["strict", "drr", "wfq", "hybrid"])
def test_priority_policies_preempt_only_lower_classes_for_a_waiting_request(name):
    p = policy(name)
    p3, p1, p0 = running(P3, 0), running(P1, 0), running(P0, 0)
    cands = [VictimCandidate(p3, 2), VictimCandidate(p1, 5), VictimCandidate(p0, 5)]
    asker = req(P1, arrival=1.0)
    assert p.select_victims(cands, asker, 2) == [p3]
    assert p.select_victims(cands, asker, 3) == []  # p3 alone is not enough; p1 not eligible
    assert p.select_victims(cands, req(P0), 7) == [p3, p1]
    assert p.select_victims(cands, req(P0), 0) == [p3]  # a seat: one victim


def test_running_request_may_push_out_later_arrivals_of_its_class():
    p = policy("hybrid")
    old, new = running(P2, 0.0), running(P2, 1.0)
    cands = [VictimCandidate(new, 1), VictimCandidate(old, 1)]
    assert p.select_victims(cands, old, 1) == [new]
    assert p.select_victims(cands, new, 1) == []


def test_fcfs_never_preempts_for_a_waiting_request():
    p = policy("fcfs")
    victim = running(P3, 0.0)
    assert p.select_victims([VictimCandidate(victim, 4)], req(P0, arrival=1.0), 1) == []
    grower = running(P3, -1.0)
    assert p.select_victims([VictimCandidate(victim, 4)], grower, 1) == [victim]


def test_victims_that_free_nothing_useful_are_skipped():
    p = policy("strict")
    useless, useful = running(P3, 0), running(P2, 0)
    cands = [VictimCandidate(useless, 0), VictimCandidate(useful, 3)]
    assert p.select_victims(cands, req(P0), 3) == [useful]
