"""Each policy's choices agree with the service order it declares (issue 22 item 5).

The TTFT predictor and SLA admission read ``PolicyTraits.service_order`` instead of asking which
policy runs, so a policy whose ``_choose`` drifted from its declaration would make admission
decide on a queue that is not the real one. Properties, on random backlogs:

* precedence: ``_choose`` never picks class ``c`` while a class the policy always serves first
  (``strict_before[c]``) waits, nor, in the regime the order describes (every head with an SLA
  has used its urgency fraction), while a class in ``before[c]`` waits;
* sharing: two classes the order says share capacity, both backlogged, receive service in the
  ratio of their declared weights, within the policy's fairness bound;
* a class-blind policy serves the whole queue in arrival order.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import make_request
from tierserve.admission.sla import policy_for_sla_admission
from tierserve.config import PolicyConfig
from tierserve.policies import SchedulerState, create_policy
from tierserve.policies.drr import DRRPolicy
from tierserve.priority import NUM_PRIORITIES, Priority

CLASSED = ["strict", "drr", "wfq", "hybrid", "hybrid-sla"]
WEIGHTS = st.tuples(*[st.integers(1, 16)] * NUM_PRIORITIES)


def build(name: str, weights=(8, 4, 2, 1)):
    cfg = PolicyConfig(
        name=name.removesuffix("-sla"), drr_weights=weights, wfq_weights=weights, aging=False
    )
    if name.endswith("-sla"):
        cfg = policy_for_sla_admission(cfg)
    return create_policy(replace(cfg, tenant_fairness=False))


@pytest.mark.parametrize("name", CLASSED)
@settings(max_examples=60, deadline=None)
@given(
    weights=WEIGHTS,
    backlog=st.lists(  # per class: (prompt tokens, arrival) of its waiting requests
        st.lists(st.tuples(st.integers(1, 400), st.floats(0, 50)), max_size=6),
        min_size=NUM_PRIORITIES,
        max_size=NUM_PRIORITIES,
    ),
    late=st.booleans(),
)
def test_choose_never_passes_over_a_class_declared_before(name, weights, backlog, late):
    p = build(name, weights)
    traits = p.traits
    for prio, reqs in zip(Priority, backlog, strict=True):
        for prompt, arrival in reqs:
            p.add(make_request(prompt, prio, max_tokens=1, arrival=arrival))
    waiting = {c for c, n in enumerate(p.waiting_by_class()) if n}
    # late: long after every arrival, each head with an SLA has used its urgency fraction.
    state = SchedulerState(now=1e6 if late else 0.0, idle_seats=1)
    served = []
    while True:
        pick = p._choose(state)
        if pick is None:
            break
        c = pick.priority
        ahead = waiting & set(traits.strict_before[c])
        if late:
            ahead |= waiting & set(traits.service_order.before[c])
        assert not ahead, f"{name} served P{c} while {ahead} waited"
        req = p.peek(state)
        p.commit(req)
        served.append(req)
        waiting = {c for c, n in enumerate(p.waiting_by_class()) if n}
    assert len(served) == sum(map(len, backlog)) and not waiting


def _shared_pairs(name: str, weights) -> list[tuple[int, int]]:
    order = build(name, weights).traits.service_order
    classes = range(NUM_PRIORITIES)
    return [(c, k) for c in classes for k in classes if c < k and order.shares_with(c, k)]


@pytest.mark.parametrize("name", ["drr", "wfq", "hybrid-sla"])
@settings(max_examples=40, deadline=None)
@given(
    weights=WEIGHTS,
    which=st.integers(0, 5),
    costs=st.lists(st.integers(1, 400), min_size=2, max_size=2),
)
def test_classes_declared_to_share_get_service_in_their_declared_weights(
    name, weights, which, costs
):
    pairs = _shared_pairs(name, weights)
    assert pairs, f"{name} declares no classes sharing by weight"
    c, k = pairs[which % len(pairs)]
    p = build(name, weights)
    w = p.traits.service_order.weights
    state = SchedulerState(now=0.0, idle_seats=1)  # no head is late
    cost = {c: costs[0] + 1, k: costs[1] + 1}  # prompt + 1 output token
    served = {c: 0, k: 0}
    for cls in (c, k):  # a permanent backlog of both, nobody else
        for _ in range(80):
            p.add(make_request(cost[cls] - 1, Priority(cls), max_tokens=1))
    for _ in range(60):
        req = p.peek(state)
        p.commit(req)
        served[int(req.priority)] += cost[int(req.priority)]
    lmax = max(cost.values())
    if isinstance(p, DRRPolicy):  # a round's quantum, plus what a deficit may carry over
        bound = p.config.quantum_tokens + lmax / w[c] + lmax / w[k]
    else:  # start-time fair queueing's bound
        bound = cost[c] / w[c] + cost[k] / w[k]
    gap = abs(served[c] / w[c] - served[k] / w[k])
    assert gap <= bound + 1e-6, f"{name} P{c}/P{k}: normalized service apart by {gap:.1f}"


@settings(max_examples=40, deadline=None)
@given(
    backlog=st.lists(
        st.tuples(st.sampled_from(list(Priority)), st.floats(0, 50)), min_size=1, max_size=24
    )
)
def test_a_class_blind_policy_serves_everything_in_arrival_order(backlog):
    p = create_policy(PolicyConfig(name="fcfs"))
    assert not p.traits.service_order.class_aware and not p.traits.class_aware
    reqs = [make_request(8, prio, arrival=t) for prio, t in backlog]
    for r in reqs:
        p.add(r)
    state = SchedulerState()
    order = [p.pop_next(state) for _ in reqs]
    assert order == sorted(reqs, key=lambda r: (r.arrival_time, r.arrival_seq))
