"""The TTFT predictor (admission/ttft.py), the policies' declared service order and the load
meter, checked with exact arithmetic."""

import math
from dataclasses import replace

import pytest

from tierserve.admission.load_meter import SEED_WEIGHT_S, LoadMeter
from tierserve.admission.ttft import Load, TenantBacklog, predict_ttft
from tierserve.config import PolicyConfig
from tierserve.policies import create_policy
from tierserve.policies.order import FLAT_ORDER, ServiceOrder
from tierserve.priority import Priority

P0, P1, P2, P3 = Priority


def order(name: str, **kw) -> ServiceOrder:
    return create_policy(PolicyConfig(name=name, **kw)).service_order()


def test_policies_declare_their_service_order():
    hybrid = order("hybrid")
    assert hybrid.before == ((), (0,), (0, 1), (0, 1, 2)) and hybrid.tenant_fair
    assert hybrid.yields_to == ((), (0,), (0,), (0,))  # running chunks leave budget for P0 only
    shared = order("hybrid", sla_urgency_fraction=1.0)  # only late heads jump: P1/P2 share
    assert shared.before == ((), (0,), (0,), (0, 1, 2))
    assert shared.weights == (0.0, 8.0, 4.0, 0.0) and shared.shares_with(1, 2)
    assert not shared.shares_with(1, 3) and not shared.shares_with(0, 1)
    assert order("fcfs") == FLAT_ORDER
    assert order("strict").before == ((), (0,), (0, 1), (0, 1, 2))
    assert order("drr").weights == (8.0, 4.0, 2.0, 1.0) and not order("drr").tenant_fair
    assert order("wfq").weights == (16.0, 8.0, 4.0, 2.0) and order("wfq").tenant_fair


def test_strict_order_counts_the_classes_before_the_own_queue_and_running_prefills():
    load = Load(
        waiting_tokens=(1000, 2000, 3000, 500),
        running_prefill=(50, 100, 200, 300),
        arrival_rate=(100.0, 400.0, 0.0, 0.0),
        prefill_rate=1100.0,
        step_s=0.2,
        order=order("hybrid", tenant_fairness=False),
    )
    # P1: P0's queue + its own + all running prefills (theirs go first, but for P0's tokens),
    # served at R minus P0's arrivals.
    assert predict_ttft(load, P1, 500) == pytest.approx((1000 + 2000 + 500 + 650) / 1000 + 0.2)
    # P0: only its own class and its own running prefill (the others leave budget for it);
    # served first, it waits for half the step in flight on average, not a whole step.
    assert predict_ttft(load, P0, 500) == pytest.approx((1000 + 500 + 50) / 1100 + 0.1)
    # P2: P0 and P1 before it, and both keep arriving.
    assert predict_ttft(load, P2, 500) == pytest.approx(
        (1000 + 2000 + 3000 + 500 + 650) / 600 + 0.2
    )
    # A waiting request with 700 tokens of its class ahead of it (the re-check).
    assert predict_ttft(load, P1, 500, ahead=700) == pytest.approx(
        (1000 + 700 + 500 + 650) / 1000 + 0.2
    )


def test_a_class_sharing_by_weight_gets_its_share_bounded_by_the_other_classes_backlog():
    base = dict(
        prefill_rate=1000.0,
        step_s=0.0,
        order=order("hybrid", sla_urgency_fraction=1.0, tenant_fairness=False),
    )
    # P1 (weight 8) with 3000 tokens to go; P2 (weight 4) has plenty: it gets half as much.
    busy = Load(waiting_tokens=(0, 2000, 9000, 0), **base)
    assert predict_ttft(busy, P1, 1000) == pytest.approx((3000 + 1500) / 1000)
    # P2 with only 600 waiting and no arrivals: it cannot take more than it has.
    light = Load(waiting_tokens=(0, 2000, 600, 0), **base)
    assert predict_ttft(light, P1, 1000) == pytest.approx((3000 + 600) / 1000)
    # ...unless it keeps arriving: 100 tokens/s over the wait (at most 4.5 s, the full share).
    arriving = Load(waiting_tokens=(0, 2000, 600, 0), arrival_rate=(0, 0, 100.0, 0), **base)
    assert predict_ttft(arriving, P1, 1000) == pytest.approx((3000 + 600 + 450) / 1000)
    # P2 sees P1 the other way round: twice its own work, bounded the same way.
    assert predict_ttft(busy, P2, 1000) == pytest.approx((10000 + 2000) / 1000)


def test_tenant_fair_class_counts_the_own_tenant_queue_and_the_others_up_to_it():
    tenants = (
        (),
        (
            TenantBacklog("a", 1000, 1000),
            TenantBacklog("b", 5000, 5000),
            TenantBacklog("c", 0, 200),
        ),
        (),
        (),
    )
    load = Load(
        waiting_tokens=(0, 6200, 0, 0),
        promoted_tokens=(0, 200, 0, 0),
        tenants=tenants,
        prefill_rate=1000.0,
        order=order("hybrid"),
    )
    # Tenant a: its 1000 + 500 of its own; b gets as much (it has more), c only its 200.
    assert predict_ttft(load, P1, 500, tenant="a") == pytest.approx((1500 + 1500 + 200) / 1000)
    # A new tenant: nothing of its own ahead, the others up to its 500 each.
    assert predict_ttft(load, P1, 500, tenant="d") == pytest.approx((500 + 500 + 500 + 200) / 1000)
    # Without a tenant: the class's own queue (promoted requests wait behind it).
    assert predict_ttft(load, P1, 500) == pytest.approx((6000 + 500) / 1000)


def test_fcfs_is_one_queue_and_unknown_or_saturated_rates_are_explicit():
    load = Load(waiting_tokens=(10, 20, 30, 40), running_prefill=(1, 2, 3, 4), prefill_rate=10.0)
    assert predict_ttft(load, P0, 100) == pytest.approx((100 + 100 + 10) / 10)
    assert predict_ttft(Load(), P1, 100) is None  # no rate measured or seeded yet
    full = Load(
        waiting_tokens=(100, 0, 0, 0),
        arrival_rate=(1000.0, 0, 0, 0),
        prefill_rate=900.0,
        order=order("hybrid"),
    )
    assert predict_ttft(full, P1, 10) == math.inf  # P0 alone fills the engine
    assert predict_ttft(full, P0, 10) == pytest.approx(110 / 900)
    # An empty engine never predicts an infinite wait (issue 21): P0's arrival rate was
    # measured in a burst that has ended; served as they come, P0 takes at most half.
    empty = replace(full, waiting_tokens=(0, 0, 0, 0))
    assert predict_ttft(empty, P1, 10) == pytest.approx(10 / 450)


def test_load_edits_keep_the_tenant_view_consistent():
    load = Load(order=order("hybrid")).with_waiting(P1, 300, "a").with_waiting(P1, 200, "a")
    assert load.waiting_tokens[P1] == 500
    assert load.tenants[P1] == (TenantBacklog("a", 500, 500),)
    trimmed = load.with_waiting(P2, 50, "b").only_classes_upto(P0)
    assert trimmed.waiting_tokens == (0, 0, 0, 0) and trimmed.tenants == ((),) * 4


# -- the load meter ---------------------------------------------------------------------------


def test_meter_starts_from_the_executors_speed_and_measures_backlogged_steps():
    m = LoadMeter(seed_prefill_rate=5000.0, tau_s=5.0)
    assert m.prefill_rate == 5000.0 and m.step_s == 0.0
    m.on_step(0.0, 0.5, 1000, backlog=True)  # 2000 tokens/s measured over 0.5 s
    keep = math.exp(-0.5 / 5.0)
    assert m.prefill_rate == pytest.approx((keep * 5000 * SEED_WEIGHT_S + 1000) / (keep + 0.5))
    assert m.step_s == 0.5
    before = m.prefill_rate
    m.on_step(0.5, 1.0, 50, backlog=False)  # no queue: the step says nothing about the rate
    assert m.prefill_rate == before
    for i in range(200):  # a long backlog at 2000 tokens/s: the seed is forgotten
        m.on_step(1.0 + 0.5 * i, 1.5 + 0.5 * i, 1000, backlog=True)
    assert m.prefill_rate == pytest.approx(2000.0, rel=1e-3)


def test_meter_step_interval_runs_from_the_previous_step_while_a_backlog_waited():
    m = LoadMeter(tau_s=1e9)  # no decay: plain averages
    m.on_step(0.0, 1.0, 100, backlog=True)
    m.on_step(1.5, 2.0, 100, backlog=True)  # 0.5 s between steps: the queue waited through it
    assert m.prefill_rate == pytest.approx(200 / 2.0)
    m.on_step(2.0, 3.0, 100, backlog=False)  # the queue is empty after this one...
    m.on_step(10.0, 11.0, 100, backlog=True)  # ...so the engine may have idled: the step only
    assert m.prefill_rate == pytest.approx(300 / 3.0)


def test_meter_arrival_rates_per_class_decay_with_time():
    m = LoadMeter(arrival_tau_s=10.0)
    assert m.arrival_rates(0.0) == (0.0, 0.0, 0.0, 0.0)
    m.on_add(P1, 500, 0.0, "a")
    assert m.arrival_rates(0.0)[P1] == pytest.approx(50.0)  # a burst: spread over tau
    assert m.arrival_rates(10.0)[P1] == pytest.approx(50.0 / math.e)
    for t in range(1, 200):  # 100 tokens/s for a long time, from tenant b
        m.on_add(P1, 100, float(t), "b")
    assert m.arrival_rates(199.0)[P1] == pytest.approx(100 / 10 / (1 - math.exp(-0.1)), rel=1e-3)
    assert m.tenant_rate(P1, "b", 199.0) == pytest.approx(m.arrival_rates(199.0)[P1], rel=1e-6)
    assert m.tenant_rate(P1, "a", 199.0) < 1e-6 and m.tenant_rate(P2, "b", 199.0) == 0.0
    assert m.arrival_rates(199.0)[P2] == 0.0
    assert m.arrival_rates(299.0)[P1] < 1.0  # 100 s of silence
