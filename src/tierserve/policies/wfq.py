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

from dataclasses import dataclass, replace

from tierserve.config import PolicyConfig
from tierserve.policies.base import ClassedPolicy, SchedulerState
from tierserve.policies.order import STRICT_BY_CLASS, ServiceOrder
from tierserve.policies.registry import register_policy
from tierserve.policies.traits import Pick, PolicySettings
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import Request


@dataclass(frozen=True)
class WFQConfig(PolicySettings):
    weights: tuple[float, ...]  # per class
    # Seconds a request waits in a class before promotion by one class (None: never); None in
    # all: no aging.
    aging_thresholds_s: tuple[float | None, ...] | None
    tenant_fairness: bool

    @classmethod
    def of(cls, config: PolicyConfig) -> WFQConfig:
        aging = config.aging_thresholds_s if config.aging else None
        return cls(
            config.max_expected_output_tokens, config.wfq_weights, aging, config.tenant_fairness
        )


@dataclass(frozen=True)
class HybridConfig(WFQConfig):
    # A P1/P2 head that has used this fraction of its TTFT SLA goes before the fair share.
    sla_urgency_fraction: float

    @classmethod
    def of(cls, config: PolicyConfig) -> HybridConfig:
        return cls(**vars(WFQConfig.of(config)), sla_urgency_fraction=config.sla_urgency_fraction)


@dataclass(frozen=True)
class SFQPick(Pick):
    start: float | None  # the class's start tag; None: served outside the fair share


class _SFQPolicy(ClassedPolicy):
    # Classes served strictly before the fair ones, and ones served only when nothing else
    # waits and seats are idle.
    strict_classes: frozenset[int] = frozenset()
    best_effort_classes: frozenset[int] = frozenset()

    def __init__(self, config: WFQConfig, priorities=None) -> None:
        super().__init__(config, priorities, config.aging_thresholds_s, config.tenant_fairness)
        self.weights = list(config.weights)
        self.vtime = 0.0
        self.finish = [0.0] * NUM_PRIORITIES
        # SLA urgency (hybrid): a class head that has used this fraction (default 1/5) of its
        # TTFT SLA is urgent; urgent heads go before the fair share, the most urgent class
        # first. Under overload the tighter SLA is protected and looser ones absorb the queueing.
        self.urgency: float | None = None

    def order_key(self, request: Request, entered: float | None = None) -> tuple:
        # Inside a class: the class's own requests before ones promoted into it by aging (aging
        # raises a request's share, not its precedence over on-time traffic of that class), then
        # earliest deadline first (no SLA: last), then arrival; both shifted by the predictive
        # shift (0 unless predictive ordering is on: then shorter predicted work first among
        # requests due / arrived within the aging bound of each other).
        promoted = request.priority != request.base_priority
        shift = self.work_shift(request)
        return (
            promoted,
            self.deadline(request, entered) + shift,
            request.arrival_time + shift,
            request.arrival_seq,
        )

    def _choose(self, state: SchedulerState) -> SFQPick | None:
        backlog = [c for c in range(NUM_PRIORITIES) if len(self.queues[c])]
        if not backlog:
            return None
        for c in backlog:
            if c in self.strict_classes:
                return SFQPick(c, None)
        fair = [c for c in backlog if c not in self.best_effort_classes]
        frac = self.urgency
        if fair and frac is not None:
            for c in fair:  # in class order: the most urgent class first
                head = self.queues[c].peek()
                due = self._deadlines[head.request_id]
                urgent_at = head.arrival_time + frac * (due - head.arrival_time)
                if urgent_at <= state.now:
                    return SFQPick(c, max(self.vtime, self.finish[c]))
        if fair:
            start, c = min((max(self.vtime, self.finish[c]), c) for c in fair)
            return SFQPick(c, start)
        if state.idle_seats > 0:
            return SFQPick(backlog[0], None)
        return None

    def class_tags(self) -> tuple[float, ...]:
        return tuple(max(self.vtime, f) for f in self.finish)

    def _commit(self, pick: SFQPick, request: Request, cost: int) -> None:
        c, start = pick.priority, pick.start
        if start is not None:
            self.finish[c] = start + cost / self.weights[c]
            self.vtime = start


@register_policy("wfq")
class WFQPolicy(_SFQPolicy):
    config_class = WFQConfig

    def service_order(self, weights=None) -> ServiceOrder:
        return super().service_order(tuple(self.weights))


@register_policy("hybrid")
class HybridPolicy(_SFQPolicy):
    """P0 strict (and backed by its reserved memory): it never waits behind another class.
    P1-P2 weighted fair (SFQ, tenant-fair, EDF inside a class, aging P2 -> P1), except that a
    head that has used a fifth of its TTFT SLA goes first, the more urgent class first: under
    overload P1's 5 s SLA is protected and P2 (60 s) absorbs the queueing. P3 best effort:
    served only when nothing else waits and seats are idle; it ages into P2 and then P1, so it
    is served whenever those queues drain. Aging stops at P1: realtime capacity is not handed to
    traffic that was not sent as realtime."""

    config_class = HybridConfig
    p0_strict = True
    strict_classes = frozenset({int(Priority.P0)})
    best_effort_classes = frozenset({int(Priority.P3)})
    top_promotion_class = Priority.P1

    def __init__(self, config: HybridConfig, priorities=None) -> None:
        super().__init__(config, priorities)
        self.urgency = config.sla_urgency_fraction

    def service_order(self, weights=None) -> ServiceOrder:
        # P3 (best effort) comes after everyone. P1 and P2 share by SFQ weight until a head has
        # used `sla_urgency_fraction` of its SLA; with the default fifth (1 s of P1's 5 s), P1
        # waits longer than that under the load where admission matters, so P1 goes before P2.
        # At 1.0 only a late head jumps the fair share: P1 and P2 share by weight.
        if self.config.sla_urgency_fraction < 1.0:
            return replace(super().service_order(), before=STRICT_BY_CLASS)
        shared = tuple(w if c in (1, 2) else 0.0 for c, w in enumerate(self.weights))
        return replace(super().service_order(shared), before=((), (0,), (0,), (0, 1, 2)))
