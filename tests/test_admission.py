"""Token buckets, drain-rate meter and the admission controller, under a manual clock."""

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierserve.admission import AdmissionController, RateMeter, TokenBucket
from tierserve.clock import ManualClock
from tierserve.config import AdmissionConfig, BucketConfig, ConfigError, PriorityConfig
from tierserve.priority import Priority

P0, P1, P2, P3 = Priority


class FakeQueue:
    def __init__(self):
        self.depth = [0, 0, 0, 0]
        self.tokens = [0, 0, 0, 0]
        self.waiting: list[Priority] = []  # classes of the requests waiting
        self.served = [(0, 0)] * 4

    def queue_depth(self, p):
        return self.depth[p]

    def queued_tokens(self, p):
        return self.tokens[p]

    def can_shed(self, below):
        return any(p > below for p in self.waiting)

    def dequeued(self, p):
        return self.served[p]

    def serve(self, p, tokens):
        n, t = self.served[p]
        self.served[p] = (n + 1, t + tokens)


# -- token bucket ----------------------------------------------------------------------------------


def test_bucket_refill_arithmetic_is_exact():
    b = TokenBucket(BucketConfig(rate=100.0, burst=500.0), now=0.0)
    b.take(500, 0.0)
    assert b.level(0.0) == 0.0
    assert b.level(1.5) == pytest.approx(150.0)
    assert b.wait_for(250, 1.5) == pytest.approx(1.0)
    assert b.level(100.0) == 500.0  # never past the burst


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 1e4),
    burst=st.floats(1, 1e5),
    events=st.lists(st.tuples(st.floats(0, 50), st.floats(0, 2e5)), max_size=40),
)
def test_bucket_never_exceeds_burst_and_retry_after_is_exact(rate, burst, events):
    b = TokenBucket(BucketConfig(rate=rate, burst=burst), now=0.0)
    now = 0.0
    for dt, cost in events:
        now += dt
        level = b.level(now)
        assert 0.0 <= level <= burst + 1e-9
        wait = b.wait_for(cost, now)
        if cost > burst:
            assert wait == math.inf
        elif wait == 0:
            b.take(cost, now)
        else:
            # Just before the promised time the tokens are not there; at it, they are.
            # (Probe copies: reading a bucket at a later time moves its clock.)
            assert copy.copy(b).wait_for(cost, now + wait * 0.999) > 0
            assert copy.copy(b).wait_for(cost, now + wait * (1 + 1e-9) + 1e-9) == 0


def test_bad_bucket_config_is_refused():
    with pytest.raises(ConfigError, match="rate"):
        BucketConfig(rate=0, burst=10)
    with pytest.raises(ConfigError, match="burst"):
        BucketConfig(rate=1, burst=-1)


# -- drain meter -----------------------------------------------------------------------------------


def test_rate_meter_windows_and_decay():
    m = RateMeter(window_s=1.0, alpha=0.5)
    m.add(0, 0.0)
    for t in (0.1, 0.2, 0.3, 0.4):
        m.add(1, t)
    assert m.rate(0.9) is None  # first window not complete
    assert m.rate(1.0) == pytest.approx(4.0)
    m.add(2, 1.5)
    assert m.rate(2.0) == pytest.approx(0.5 * 2 + 0.5 * 4)
    assert m.rate(4.0) == pytest.approx(3.0 * 0.25)  # two empty windows


# -- admission -------------------------------------------------------------------------------------


def controller(**kw):
    clock = ManualClock()
    q = FakeQueue()
    return AdmissionController(AdmissionConfig(**kw), q, clock), q, clock


def test_admits_when_nothing_is_limited():
    ac, _q, _c = controller()
    d = ac.decide(P2, "t", 100)
    assert d.admitted and d.status == 200


def test_tenant_rate_limit_gives_429_with_exact_retry_after_and_refunds_nothing():
    ac, _q, clock = controller(tenant_bucket=BucketConfig(rate=10, burst=100))
    assert ac.decide(P1, "a", 80).admitted
    d = ac.decide(P1, "a", 50)
    assert (d.admitted, d.status, d.error_type) == (False, 429, "rate_limited")
    assert d.retry_after_s == pytest.approx(3.0)  # 30 missing tokens at 10/s
    assert ac.decide(P1, "b", 50).admitted  # another tenant has its own bucket
    clock.advance(3.0)
    assert ac.decide(P1, "a", 50).admitted


def test_cost_above_burst_is_a_clear_400():
    ac, _q, _c = controller(global_bucket=BucketConfig(rate=10, burst=100))
    d = ac.decide(P1, "a", 101)
    assert d.status == 400 and "burst" in d.reason and "max_tokens" in d.reason


def test_queue_limit_gives_503_with_retry_after_from_measured_drain_rate():
    ac, q, clock = controller(max_queued_requests=(4, 10, 10, 10), drain_window_s=1.0)
    q.depth[P1] = 10
    d = ac.decide(P1, "a", 10)
    assert (d.status, d.error_type) == (503, "resource_exhausted")
    assert d.retry_after_s == AdmissionConfig().initial_retry_after_s  # nothing measured yet
    assert d.queue_depth == 10 and "online (P1) queue is full" in d.reason
    for i in range(5):  # 5 requests per second leave the P1 queue, seen by a decision each
        clock.set(i * 0.2)
        q.serve(P1, 100)
        ac.decide(P1, "a", 10)
    clock.set(1.0)
    d = ac.decide(P1, "a", 10)
    assert d.retry_after_s == pytest.approx(1 / 5)
    assert ac.drain_rate(P1) == pytest.approx(5.0)
    assert ac.estimate_wait(P1) == pytest.approx(10 / 5)


def test_rate_limit_tokens_are_not_taken_when_the_queue_rejects():
    ac, q, _c = controller(
        tenant_bucket=BucketConfig(rate=1, burst=100), max_queued_requests=(1, 1, 1, 1)
    )
    q.depth[P2] = 1
    assert ac.decide(P2, "a", 100).status == 503
    q.depth[P2] = 0
    assert ac.decide(P2, "a", 100).admitted  # the bucket is still full


def test_p0_overflow_sheds_the_lowest_class_waiting_request():
    ac, q, _c = controller(max_queued_requests=(1, 10, 10, 10))
    q.depth[P0] = 1
    q.waiting = [P1, P3, P2]
    d = ac.decide(P0, "a", 10)
    assert d.admitted and d.shed
    q.waiting = [P0]
    assert ac.decide(P0, "a", 10).status == 503  # nobody lower to shed


def test_shedding_can_be_turned_off():
    ac, q, _c = controller(max_queued_requests=(1, 10, 10, 10), shed_for_p0=False)
    q.depth[P0] = 1
    q.waiting = [P3]
    assert ac.decide(P0, "a", 10).status == 503


def test_sla_miss_rejection_uses_the_estimated_wait():
    ac, q, clock = controller(reject_on_sla_miss=True, drain_window_s=1.0)
    q.serve(P0, 1)
    ac.decide(P0, "a", 10)  # seen at t=0
    clock.set(1.0)  # P0 drains 1 request/s
    q.depth[P0] = 3
    d = ac.decide(P0, "a", 10)  # 4 s wait > 0.5 s SLA
    assert d.status == 503 and "SLA" in d.reason
    q.depth[P0] = 0
    assert ac.decide(P0, "a", 10).admitted
    assert ac.decide(P3, "a", 10).admitted  # P3 has no SLA
    assert PriorityConfig().sla(P3) is None


def test_rejections_are_counted_by_reason_and_class():
    ac, q, _c = controller(max_queued_requests=(1, 1, 1, 1))
    q.depth[P2] = 5
    ac.decide(P2, "a", 1)
    ac.decide(P2, "a", 1)
    assert ac.rejections[("resource_exhausted", P2)] == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_queued_requests": (1, 2, 3)}, "4 values"),
        ({"drain_alpha": 0}, "drain_alpha"),
        ({"max_queued_tokens": (1, -2, 3, 4)}, "negative"),
        ({"p0_rate_reserve": 1.0}, "p0_rate_reserve"),
        ({"p0_rate_reserve": -0.1}, "p0_rate_reserve"),
    ],
)
def test_bad_admission_config_is_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        AdmissionConfig(**kwargs)


# -- the P0 reserve of the global bucket ---------------------------------------------------------


def _flood(ac, clock, seconds, p0_every_s, p0_cost, p3_cost, p3_every_s=0.01):
    """A P3 flood far above the global rate, with a P0 request every `p0_every_s` seconds;
    returns (P0 admitted, P0 sent, P3 tokens admitted)."""
    p0_ok = p0_sent = p3_tokens = 0
    steps = round(seconds / p3_every_s)
    per_p0 = round(p0_every_s / p3_every_s)
    for i in range(1, steps + 1):
        clock.set(i * p3_every_s)
        if ac.decide(P3, "bulk", p3_cost).admitted:
            p3_tokens += p3_cost
        if i % per_p0 == 0:
            p0_sent += 1
            p0_ok += ac.decide(P0, "chat", p0_cost).admitted
    return p0_ok, p0_sent, p3_tokens


def test_p0_gets_through_a_lower_class_flood_under_the_global_rate_limit():
    """--rate-limit 300 --burst 600: background requests arrive 100 times a second, far above
    the rate. Every realtime request still passes at once (the default 20% reserve holds 120
    tokens for P0), and the flood still gets the rest of the rate."""
    ac, _q, clock = controller(global_bucket=BucketConfig(rate=300, burst=600))
    p0_ok, p0_sent, p3_tokens = _flood(
        ac, clock, seconds=20, p0_every_s=0.5, p0_cost=100, p3_cost=60
    )
    assert p0_sent == 40 and p0_ok == 40
    # Tokens the bucket could hand out over 20 s (burst + refill), less what P0 used: P3
    # gets nearly all of it.
    assert p3_tokens >= 0.9 * (600 + 300 * 20 - 40 * 100)


def test_without_the_reserve_the_flood_starves_p0():
    """The same flood with the reserve off: the behaviour the reserve fixes."""
    ac, _q, clock = controller(global_bucket=BucketConfig(rate=300, burst=600), p0_rate_reserve=0.0)
    p0_ok, p0_sent, _ = _flood(ac, clock, seconds=20, p0_every_s=0.5, p0_cost=100, p3_cost=60)
    assert p0_ok <= p0_sent // 4


def test_lower_classes_stop_at_the_reserve_with_exact_retry_after():
    ac, _q, clock = controller(global_bucket=BucketConfig(rate=10, burst=100))  # reserve 20
    assert ac.decide(P2, "a", 80).admitted  # leaves exactly the reserve
    d = ac.decide(P1, "a", 5)
    assert (d.status, d.error_type) == (429, "rate_limited") and "kept for realtime" in d.reason
    assert d.retry_after_s == pytest.approx(0.5)  # 5 tokens above the reserve at 10/s
    assert ac.decide(P0, "a", 20).admitted  # P0 may empty the bucket
    clock.advance(2.0)  # 20 tokens: all below the reserve, so P0's alone
    assert ac.decide(P3, "a", 1).status == 429
    assert ac.decide(P0, "a", 20).admitted


def test_a_request_larger_than_burst_minus_reserve_waits_for_a_full_bucket():
    ac, _q, clock = controller(global_bucket=BucketConfig(rate=10, burst=100))
    assert ac.decide(P0, "a", 10).admitted
    d = ac.decide(P1, "a", 95)  # could never leave the reserve: needs the whole burst
    assert d.status == 429 and d.retry_after_s == pytest.approx(1.0)
    clock.advance(1.0)
    assert ac.decide(P1, "a", 95).admitted
    assert ac.decide(P1, "a", 101).status == 400  # above the burst: never
