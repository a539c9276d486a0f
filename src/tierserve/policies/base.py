"""The policy interface: the waiting queue's order *and* the choice of preemption victims.

The scheduler never asks which policy it runs; it calls ``peek`` to see who is next, and
``commit`` to serve exactly that request once it has memory and a seat (possibly after preempting
victims, which go back into the queue in between); ``pop_next`` is ``peek`` + ``commit``.
``select_victims`` chooses whom to preempt when memory or seats are short. What else the
scheduler needs to know of a policy is its frozen ``traits`` (policies/traits.py).
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from tierserve.config import PriorityConfig
from tierserve.policies.order import FLAT_ORDER, ServiceOrder
from tierserve.policies.queues import ClassQueue
from tierserve.policies.traits import Pick, PolicySettings, PolicyTraits, arrival_key
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import Request, RequestStatus

_EMPTY = ClassQueue()  # stands in for a skipped class's queue while a class is chosen

__all__ = ["ClassedPolicy", "Policy", "SchedulerState", "VictimCandidate", "arrival_key"]


@dataclass(frozen=True)
class SchedulerState:
    """A read-only snapshot of the engine, given to the policy at each decision."""

    now: float = 0.0
    idle_seats: int = 1
    running_by_class: tuple[int, ...] = (0, 0, 0, 0)
    # Blocks each class could be charged now (partition headroom).
    headroom_by_class: tuple[int, ...] = (0, 0, 0, 0)
    # Classes whose head cannot be admitted now (predictive reservation): choose among the
    # others, as if these had nothing waiting (class-blind policies ignore it).
    skip_classes: frozenset[int] = frozenset()


@dataclass(frozen=True)
class VictimCandidate:
    request: Request
    # Blocks the asking request's class gains if this one lets go (from the KV reclaim order).
    useful_blocks: int


class Policy(ABC):
    """Besides ordering and victims, a policy declares its traits (``PolicyTraits``, frozen in
    ``traits``) from the class attributes and methods below, so that no class rule lives
    outside the policy. Each policy is configured by its own settings class (``config_class``,
    built from the flat ``PolicyConfig`` by the registry)."""

    name: str = ""
    config_class: type[PolicySettings] = PolicySettings
    class_aware: bool = True
    p0_strict: bool = False
    tenant_fair: bool = False  # tenants share each class equally (ClassedPolicy with VTC lanes)

    def strict_before(self, priority: Priority) -> tuple[Priority, ...]:
        """Classes whose waiting requests this policy always serves before `priority`."""
        if self.p0_strict and priority != Priority.P0:
            return (Priority.P0,)
        return ()

    def __init__(self, config: PolicySettings, priorities: PriorityConfig | None = None) -> None:
        self.config = config
        self.priorities = priorities or PriorityConfig()
        # Whether a class can ever hold a request's KV; the scheduler binds its RequestLimits.
        self.can_hold: Callable[[Request, Priority], bool] = lambda request, priority: True
        # Seconds added to a waiting request's arrival (and deadline) in its class's order, in
        # [0, aging bound]: predictive ordering binds it (core/predictive.py); 0: none.
        self.work_shift: Callable[[Request], float] = lambda request: 0.0

    @cached_property
    def traits(self) -> PolicyTraits:
        """The declared traits, frozen on first use (after construction)."""
        classes = list(Priority)
        return PolicyTraits(
            class_aware=self.class_aware,
            p0_strict=self.p0_strict,
            strict_before=tuple(self.strict_before(c) for c in classes),
            cap_exempt=frozenset({Priority.P0}) if self.class_aware else frozenset(),
            tenant_fair=self.tenant_fair,
            service_order=self.service_order(),
        )

    def service_order(self, weights: tuple[float, ...] | None = None) -> ServiceOrder:
        """How waiting work is ordered across classes, for the TTFT predictor (see
        policies/order.py): by default the classes ``strict_before`` names go first and the
        others share by `weights` (if given)."""
        if not self.class_aware:
            return FLAT_ORDER
        yields = tuple(
            tuple(int(k) for k in self.strict_before(Priority(c))) for c in range(NUM_PRIORITIES)
        )
        return ServiceOrder(
            before=yields,
            weights=tuple(float(w) for w in (weights or (0.0,) * NUM_PRIORITIES)),
            yields_to=yields,
            tenant_fair=self.tenant_fair,
        )

    def queue_key(self, request: Request) -> tuple:
        """A waiting request's place in its class's queue (smaller: served sooner): preempted
        requests first, then arrival. For the SLA re-check, which walks a queue in order."""
        return (request.status != RequestStatus.PREEMPTED, *arrival_key(request))

    def tenant_counters(self, priority: Priority) -> dict[str, float]:
        """Tenant-fair classes: each tenant's virtual token counter (read-only view)."""
        return {}

    def class_tags(self) -> tuple[float, ...] | None:
        """Classes sharing by weight with start-time fair queueing: each class's start tag for
        its next service (None: the policy keeps none)."""
        return None

    # -- queue ---------------------------------------------------------------------------------
    @abstractmethod
    def add(self, request: Request) -> None: ...

    @abstractmethod
    def peek(self, state: SchedulerState) -> Request | None: ...

    @abstractmethod
    def commit(self, request: Request) -> None:
        """Serve `request`, which the last ``peek`` returned, and account for it."""

    def pop_next(self, state: SchedulerState) -> Request | None:
        req = self.peek(state)
        if req is not None:
            self.commit(req)
        return req

    @abstractmethod
    def remove(self, request: Request) -> bool:
        """Take a waiting request out (abort). Returns False if it was not queued."""

    @abstractmethod
    def requeue_preempted(self, request: Request) -> None:
        """Put a preempted request back at the head of its class."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, request_id: str) -> bool: ...

    @abstractmethod
    def waiting_by_class(self) -> tuple[int, ...]: ...

    @abstractmethod
    def requests(self) -> list[Request]: ...

    # -- cost ----------------------------------------------------------------------------------
    def cost(self, request: Request) -> int:
        """Token cost used by fair-share policies: prompt + expected output."""
        out = min(request.sampling_params.max_tokens, self.config.max_expected_output_tokens)
        return request.num_prompt_tokens + out

    # -- victims -------------------------------------------------------------------------------
    def may_preempt(self, for_request: Request, victim: Request) -> bool:
        """Default: a strictly more urgent class preempts; a running request that cannot grow
        may also push out later arrivals of its own class."""
        if victim.priority > for_request.priority:
            return True
        return (
            for_request.status == RequestStatus.RUNNING
            and victim.priority == for_request.priority
            and arrival_key(victim) > arrival_key(for_request)
        )

    def select_victims(
        self,
        candidates: Sequence[VictimCandidate],
        for_request: Request,
        blocks_needed: int,
    ) -> list[Request]:
        """Choose whom to preempt so `for_request` gets `blocks_needed` blocks (0: a seat).
        `candidates` come in the KV manager's reclaim order (borrowed first, lowest class
        first, cheapest first). Returns [] when the eligible victims cannot cover the need:
        preempting some and still failing would waste their work."""
        chosen: list[Request] = []
        got = 0
        for c in candidates:
            if not self.may_preempt(for_request, c.request):
                continue
            if blocks_needed > 0 and c.useful_blocks <= 0:
                continue
            chosen.append(c.request)
            got += c.useful_blocks
            if got >= blocks_needed:
                return chosen
        return []


class ClassedPolicy(Policy):
    """Common machinery of the per-class policies: one ``ClassQueue`` per class, a head lane for
    preempted requests, O(log n) add/pop and O(1) remove, continuous aging (promotion one class
    up after a per-class wait: `aging_thresholds_s`, None for no aging), and per-tenant
    fairness inside a class (`tenant_fair`).

    Subclasses choose *which class* serves next (``_choose``, a ``Pick``) and account for it
    (``_commit``); the choice is computed once per state change so ``peek`` and ``pop_next``
    always agree.
    """

    # Promotion by aging never goes above this class.
    top_promotion_class = Priority.P0

    def __init__(
        self,
        config: PolicySettings,
        priorities: PriorityConfig | None = None,
        aging_thresholds_s: tuple[float | None, ...] | None = None,
        tenant_fair: bool = False,
    ) -> None:
        super().__init__(config, priorities)
        self.tenant_fair = tenant_fair
        self.queues = [ClassQueue(tenant_fair=tenant_fair) for _ in range(NUM_PRIORITIES)]
        self._where: dict[str, int] = {}
        self._reqs: dict[str, Request] = {}
        self._charged: set[str] = set()  # served once already: no second charge on requeue
        self._aging = aging_thresholds_s
        self._entered: dict[str, float] = {}  # time the request entered its current class
        self._deadlines: dict[str, float] = {}
        self._age_heaps: list[list[tuple[float, int, str]]] = [[] for _ in range(NUM_PRIORITIES)]
        self._age_seq = 0
        self._peeked: tuple[Pick, Request] | None = None
        self._now = 0.0
        self.promotions = 0

    # -- keys ----------------------------------------------------------------------------------
    def deadline(self, request: Request, entered: float | None = None) -> float:
        """When the first token is due: the request's own deadline, else its submitted class's
        SLA from arrival (inf without one). Aging moves a request to a more urgent class but
        keeps this deadline, so inside that class it stays behind requests due sooner: a
        promoted batch request cannot crowd out online traffic that is on time, and is served
        whenever that class's queue drains (it cannot starve unless that class alone exceeds
        capacity)."""
        d = request.deadline if request.deadline is not None else math.inf
        sla = self.priorities.sla(request.base_priority)
        if sla is not None:
            d = min(d, request.arrival_time + sla)
        return d

    def order_key(self, request: Request, entered: float | None = None) -> tuple:
        """Order inside a class: arrival, plus the predictive shift (subclasses may use
        deadlines)."""
        return (request.arrival_time + self.work_shift(request), request.arrival_seq)

    def queue_key(self, request: Request) -> tuple:
        entered = self._entered.get(request.request_id)
        return (request.status != RequestStatus.PREEMPTED, *self.order_key(request, entered))

    # -- queue operations ------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self._push(request, head=False, entered=request.arrival_time)

    def requeue_preempted(self, request: Request) -> None:
        self._charged.add(request.request_id)
        self._push(request, head=True, entered=self._entered_time_for_requeue(request))

    def _entered_time_for_requeue(self, request: Request) -> float:
        # Aging counts time spent waiting: a preempted request starts a fresh wait now.
        return max(request.arrival_time, self._now)

    def _push(self, request: Request, head: bool, entered: float) -> None:
        rid = request.request_id
        if rid in self._where:
            raise ValueError(f"request {rid} is already waiting")
        c = int(request.priority)
        key = self.order_key(request, entered)
        if head:
            self.queues[c].push_head(request, key)
        else:
            self.queues[c].push(request, key)
        self._where[rid] = c
        self._reqs[rid] = request
        self._entered[rid] = entered
        self._deadlines[rid] = self.deadline(request, entered)
        if self._aging is not None and c > self.top_promotion_class:
            heapq.heappush(self._age_heaps[c], (entered, self._age_seq, rid))
            self._age_seq += 1

    def remove(self, request: Request) -> bool:
        c = self._where.pop(request.request_id, None)
        if c is None:
            return False
        self.queues[c].remove(request.request_id)
        del self._reqs[request.request_id]
        self._entered.pop(request.request_id, None)
        self._deadlines.pop(request.request_id, None)
        self._charged.discard(request.request_id)
        return True

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._where

    def waiting_by_class(self) -> tuple[int, ...]:
        return tuple(len(q) for q in self.queues)

    def requests(self) -> list[Request]:
        return [r for q in self.queues for r in q.requests()]

    def tenant_counters(self, priority: Priority) -> dict[str, float]:
        return self.queues[priority].counters

    def peek(self, state: SchedulerState) -> Request | None:
        self.refresh(state.now)
        pick = self._choose_among(state)
        if pick is None:
            self._peeked = None
            return None
        req = self.queues[pick.priority].peek()
        self._peeked = (pick, req)
        return req

    def commit(self, request: Request) -> None:
        if self._peeked is None or self._peeked[1] is not request:
            raise ValueError(f"commit of {request.request_id}, which the last peek did not return")
        pick, _ = self._peeked
        self._peeked = None
        c = pick.priority
        charged = request.request_id in self._charged
        cost = 0 if charged else self.cost(request)
        popped = self.queues[c].pop(lambda r: cost)
        if popped is not request:
            raise ValueError(f"{request.request_id} is no longer the head of its class")
        rid = request.request_id
        del self._where[rid]
        del self._reqs[rid]
        self._entered.pop(rid, None)
        self._deadlines.pop(rid, None)
        self._charged.discard(rid)
        self._commit(pick, request, cost)

    def _choose_among(self, state: SchedulerState) -> Pick | None:
        """``_choose`` with the classes of ``state.skip_classes`` seen as empty."""
        if not state.skip_classes:
            return self._choose(state)
        hidden = {c: self.queues[c] for c in state.skip_classes}
        for c in hidden:
            self.queues[c] = _EMPTY
        try:
            return self._choose(state)
        finally:
            for c, q in hidden.items():
                self.queues[c] = q

    # -- aging -------------------------------------------------------------------------------
    def refresh(self, now: float) -> None:
        """Promote every request that has waited past its class's threshold (continuously:
        called at each decision, not only at enqueue). The time it entered the new class is the
        moment it crossed the threshold, so promotion chains do not drift with call timing."""
        self._now = max(self._now, now)
        th = self._aging
        if th is None:
            return
        for c in range(NUM_PRIORITIES - 1, int(self.top_promotion_class), -1):
            t = th[c]
            if t is None:
                continue
            heap = self._age_heaps[c]
            while heap and heap[0][0] + t <= now:
                entered, _, rid = heapq.heappop(heap)
                if self._where.get(rid) != c or self._entered.get(rid) != entered:
                    continue  # stale: served, removed or promoted already
                if not self.can_hold(self._reqs[rid], Priority(c - 1)):
                    continue  # the next class could never hold it: it stays (and ages no more)
                self._promote(rid, c, entered + t)

    def _promote(self, rid: str, c: int, entered: float) -> None:
        q = self.queues[c]
        req = self._reqs[rid]
        in_head = rid in q.head
        q.remove(rid)
        del self._where[rid]
        del self._reqs[rid]
        req.priority = Priority(c - 1)
        self.promotions += 1
        self._push(req, head=in_head, entered=entered)

    # -- class choice (subclasses) ---------------------------------------------------------
    @abstractmethod
    def _choose(self, state: SchedulerState) -> Pick | None:
        """The class to serve next (and what ``_commit`` needs), changing nothing."""

    def _commit(self, pick: Pick, request: Request, cost: int) -> None:
        """Account for serving `request` of class ``pick.priority`` (deficits, tags)."""
