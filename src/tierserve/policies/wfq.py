"""Start-time fair queueing across classes, with continuous aging, EDF inside a class and
optional per-tenant fairness; and ``hybrid``, the default, built from the same parts.

SFQ: a virtual time ``V`` and, per class, the finish tag ``F[c]`` of its last service. The next
service of class ``c`` starts at ``S[c] = max(V, F[c])``; the class with the smallest start tag is
served, then ``F[c] = S[c] + cost / weight[c]`` and ``V = S[c]``. Under a permanent backlog each
class receives a token share proportional to its weight; a class that was idle re-enters at the
current virtual time instead of cashing in the time it was away.

Aging: a request that has waited in class ``c`` longer than ``aging_thresholds_s[c]`` moves to
``c - 1``; this is re-checked at every decision, so a request promoted once keeps aging.
"""

from __future__ import annotations

from tierserve.policies.base import ClassedPolicy, SchedulerState
from tierserve.policies.registry import register_policy
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import Request


class _SFQPolicy(ClassedPolicy):
    uses_aging = True
    uses_tenant_fairness = True
    # Classes served strictly before the fair ones, and ones served only when nothing else
    # waits and seats are idle.
    strict_classes: frozenset[int] = frozenset()
    best_effort_classes: frozenset[int] = frozenset()

    def __init__(self, config, priorities=None) -> None:
        super().__init__(config, priorities)
        self.weights = list(config.wfq_weights)
        self.vtime = 0.0
        self.finish = [0.0] * NUM_PRIORITIES

    def order_key(self, request: Request) -> tuple:
        # Earliest deadline first inside a class; requests without an SLA go last, by arrival.
        return (self.deadline(request), request.arrival_time, request.arrival_seq)

    def _choose(self, state: SchedulerState) -> tuple | None:
        backlog = [c for c in range(NUM_PRIORITIES) if len(self.queues[c])]
        if not backlog:
            return None
        for c in backlog:
            if c in self.strict_classes:
                return (c, None)
        fair = [c for c in backlog if c not in self.best_effort_classes]
        if fair:
            start, c = min((max(self.vtime, self.finish[c]), c) for c in fair)
            return (c, start)
        if state.idle_seats > 0:
            return (backlog[0], None)
        return None

    def _commit(self, pick: tuple, request: Request, cost: int) -> None:
        c, start = pick
        if start is not None:
            self.finish[c] = start + cost / self.weights[c]
            self.vtime = start


@register_policy("wfq")
class WFQPolicy(_SFQPolicy):
    pass


@register_policy("hybrid")
class HybridPolicy(_SFQPolicy):
    """P0 strict (and backed by its reserved memory): it never waits behind another class.
    P1-P2 weighted fair (SFQ, tenant-fair, EDF, aging P2 -> P1). P3 best effort: served only when
    nothing else waits and seats are idle, and it ages into P2 so it never starves. Aging stops
    at P1: realtime capacity is not handed to traffic that was not sent as realtime."""

    p0_strict = True
    strict_classes = frozenset({int(Priority.P0)})
    best_effort_classes = frozenset({int(Priority.P3)})
    top_promotion_class = Priority.P1
