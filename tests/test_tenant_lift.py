"""Tenant fair share without a newcomer's windfall (issue 46, item 7): a tenant that starts
waiting while nobody waits is lifted to the counter of the tenant served last (VTC's lift), so
the service another tenant had alone is not held against it; a property test over arrival
patterns bounds the service gap between tenants that keep waiting."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import make_request
from tierserve.policies.queues import ClassQueue

COST = 10.0


def push(q: ClassQueue, tenant: str, n: int = 1) -> None:
    for _ in range(n):
        r = make_request(4, tenant=tenant)
        q.push(r, (r.arrival_time, r.request_id))


def test_a_tenant_that_ran_alone_is_not_held_back_by_a_newcomers_flood():
    q = ClassQueue(tenant_fair=True)
    for _ in range(40):  # B runs alone: one request at a time, each served at once
        push(q, "B")
        assert q.pop(lambda r: COST).tenant == "B"
    push(q, "A", 24)  # A's flood begins while nothing waits
    assert q.counters["A"] == q.counters["B"]  # lifted to B's, not 0
    assert q.pop(lambda r: COST).tenant == "A"
    push(q, "B")  # B's next request
    served = [q.pop(lambda r: COST).tenant for _ in range(3)]
    assert "B" in served[:2], served  # before: 40 of A's went first


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["push", "pop"]), st.sampled_from("ABC"), st.integers(1, 4)),
        min_size=1,
        max_size=120,
    )
)
def test_the_served_tenant_has_the_lowest_counter_and_joiners_are_lifted(ops):
    q = ClassQueue(tenant_fair=True)
    waiting: dict[str, int] = {}
    for op, tenant, n in ops:
        if op == "push":
            before = {t for t, k in waiting.items() if k > 0}
            joins = waiting.get(tenant, 0) == 0
            floor = min((q.counters[t] for t in before), default=q.last_served)
            push(q, tenant, n)
            waiting[tenant] = waiting.get(tenant, 0) + n
            if joins and floor is not None:
                assert q.counters[tenant] >= floor  # no windfall, no banked idle time
        else:
            backlogged = {t: q.counters[t] for t, k in waiting.items() if k > 0}
            r = q.pop(lambda r: COST)
            if not backlogged:
                assert r is None
                continue
            assert backlogged[r.tenant] == min(backlogged.values())
            waiting[r.tenant] -= 1
        # the tenants that wait stay within one request's cost of each other (equal costs):
        # the service gap between backlogged tenants is bounded, whatever the arrivals
        backlogged = [q.counters[t] for t, k in waiting.items() if k > 0]
        if backlogged:
            assert max(backlogged) - min(backlogged) <= COST
