"""Admission control before a request reaches the queue.

Checks, in order: the request's cost against bucket bursts (400: it could never pass), the
tenant's and the global token buckets (429 + retry-after from the refill arithmetic), the class's
queue limits in requests and tokens (503 + retry-after from the class's measured drain rate), and
optionally whether the class's TTFT SLA can still be met (503). Tokens are taken from the buckets
only when the request is admitted.

With SLA admission on (``AdmissionConfig.sla_admission``), the predicted TTFT is checked before
the queue limits (admission/sla.py): a P1 or P2 request predicted later than margin x SLA is
refused (503, code ``sla_unreachable``, Retry-After from the predicted drain), or demoted to P3
when its tenant opted in (``demote_ok``); a P0 request only when its own class alone is too late.

The global bucket keeps a reserve for P0 (`p0_rate_reserve` x burst, 20% by default): a lower
class may take its cost only while the bucket then still holds the reserve (or, for a request
larger than burst - reserve, only from a full bucket). So a lower-class flood can drain the
bucket down to the reserve and no further: a realtime request finds the reserve at once, and the
refill below it is P0's alone. P0 itself may use the whole bucket.

A P0 request that finds the P0 queue full is not refused while a lower-class request waits: the
decision says to shed one (the caller fails the latest arrival of the least urgent class).

The controller reads the queue only through ``QueueView`` and keeps its own measurements: drain
rates come from the view's cumulative served counts, read at each decision. In the server the
view is the engine's published snapshot, so nothing here is shared with the engine thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from tierserve.admission.fleet_load import FleetLoad
from tierserve.admission.rate_meter import RateMeter
from tierserve.admission.sla import MAX_RETRY_AFTER_S, SlaGate
from tierserve.admission.token_bucket import TokenBucket
from tierserve.admission.ttft import SLA_DEMOTED, SLA_UNREACHABLE, Load
from tierserve.clock import Clock
from tierserve.config import AdmissionConfig, BucketConfig, PriorityConfig
from tierserve.priority import ALL_PRIORITIES, Priority


class QueueView(Protocol):
    """What admission needs to know about the waiting queue (the scheduler, or in the server
    the engine's published snapshot, provides it)."""

    def queue_depth(self, priority: Priority) -> int: ...

    def queued_tokens(self, priority: Priority) -> int: ...

    def can_shed(self, below: Priority) -> bool:
        """Whether a request of a class less urgent than `below` waits and could be shed."""

    def dequeued(self, priority: Priority) -> tuple[int, int]:
        """Requests and prompt tokens of `priority` that left the queue for the running batch,
        counted since the start (monotonic)."""

    def load(self) -> Load | FleetLoad:
        """The TTFT predictor's inputs (engine/load.py measure_load); SLA admission only. A
        cluster ingress gives one per replica (admission/fleet_load.py)."""


@dataclass(frozen=True)
class Decision:
    admitted: bool
    priority: Priority
    status: int = 200
    error_type: str | None = None  # "rate_limited" | "resource_exhausted" | "invalid_request"
    reason: str = ""
    retry_after_s: float | None = None
    queue_depth: int = 0
    shed: bool = False  # admitted by shedding one lower-class waiter
    code: str | None = None  # finer reason: "sla_unreachable"
    predicted_ttft_s: float | None = None  # SLA admission: the prediction it was judged on
    demoted_from: Priority | None = None  # admitted as P3 instead of this class (opt-in)


class AdmissionController:
    def __init__(
        self,
        config: AdmissionConfig,
        queue: QueueView,
        clock: Clock,
        priorities: PriorityConfig | None = None,
    ) -> None:
        self.config = config
        self.queue = queue
        self.clock = clock
        self.priorities = priorities or PriorityConfig()
        now = clock.now()
        self._global = TokenBucket(config.global_bucket, now) if config.global_bucket else None
        gb = config.global_bucket
        self._p0_reserve = config.p0_rate_reserve * gb.burst if gb else 0.0
        self._tenant_cfg: dict[str, BucketConfig | None] = {}
        self._tenants: dict[str, TokenBucket] = {}
        w, a = config.drain_window_s, config.drain_alpha
        self._drain_reqs = [RateMeter(w, a) for _ in ALL_PRIORITIES]
        self._drain_tokens = [RateMeter(w, a) for _ in ALL_PRIORITIES]
        self._seen = [queue.dequeued(p) for p in ALL_PRIORITIES]
        self.sla = SlaGate(self.priorities, config.sla_margin)
        # (reason, class) -> count: error types, or "sla_unreachable" / "sla_demoted".
        self.rejections: dict[tuple[str, Priority], int] = {}

    # -- configuration -------------------------------------------------------------------------
    def set_tenant_bucket(self, tenant: str, bucket: BucketConfig | None) -> None:
        self._tenant_cfg[tenant] = bucket
        self._tenants.pop(tenant, None)

    def _tenant_bucket(self, tenant: str, now: float) -> TokenBucket | None:
        b = self._tenants.get(tenant)
        if b is None:
            cfg = self._tenant_cfg.get(tenant, self.config.tenant_bucket)
            if cfg is None:
                return None
            b = self._tenants[tenant] = TokenBucket(cfg, now)
        return b

    # -- measurements ----------------------------------------------------------------------
    def _measure(self, now: float) -> None:
        """Feed what left the queues since the last look into the drain meters."""
        for p in ALL_PRIORITIES:
            reqs, tokens = self.queue.dequeued(p)
            seen_r, seen_t = self._seen[p]
            if reqs != seen_r:
                self._drain_reqs[p].add(reqs - seen_r, now)
                self._drain_tokens[p].add(tokens - seen_t, now)
                self._seen[p] = (reqs, tokens)

    def queue_depth(self, priority: Priority) -> int:
        return self.queue.queue_depth(priority)

    def drain_rate(self, priority: Priority) -> float | None:
        """Requests per second leaving the queue of `priority` (None until measured)."""
        now = self.clock.now()
        self._measure(now)
        return self._drain_reqs[priority].rate(now)

    def estimate_wait(self, priority: Priority) -> float | None:
        """Seconds a new request of `priority` would wait: the queued requests of its class and
        the more urgent ones, over their measured drain rate. None until a rate is measured."""
        now = self.clock.now()
        self._measure(now)
        ahead = 0
        rate = 0.0
        measured = False
        for p in ALL_PRIORITIES[: int(priority) + 1]:
            ahead += self.queue.queue_depth(p)
            r = self._drain_reqs[p].rate(now)
            if r is not None:
                measured = True
                rate += r
        if ahead == 0:
            return 0.0
        if not measured:
            return None
        return math.inf if rate <= 0 else ahead / rate

    def _retry_after(self, meter: RateMeter, excess: float, now: float) -> float:
        rate = meter.rate(now)
        if rate is None:
            return self.config.initial_retry_after_s
        if rate <= 0:
            return MAX_RETRY_AFTER_S
        return min(MAX_RETRY_AFTER_S, max(excess, 1.0) / rate)

    # -- the decision ------------------------------------------------------------------------
    def decide(
        self,
        priority: Priority,
        tenant: str,
        cost_tokens: int,
        prompt_tokens: int | None = None,
        demote_ok: bool = False,
        waited_s: float = 0.0,
    ) -> Decision:
        """Admit or refuse a request of `priority` costing `cost_tokens` (prompt + max_tokens,
        all choices); `prompt_tokens` (default: the cost) is what it must prefill; `demote_ok`:
        its tenant takes best effort rather than a refusal when its SLA cannot be met;
        `waited_s`: how long it has been at the server already (its clock started at its first
        byte: the door's time counts against its SLA)."""
        now = self.clock.now()
        self._measure(now)
        depth = self.queue.queue_depth(priority)

        def reject(status, kind, reason, retry, code=None) -> Decision:
            key = (code or kind, priority)
            self.rejections[key] = self.rejections.get(key, 0) + 1
            return Decision(False, priority, status, kind, reason, retry, depth, code=code)

        keep = 0.0 if priority == Priority.P0 else self._p0_reserve  # of the global bucket
        buckets = [
            (name, b, k)
            for name, b, k in (
                ("tenant", self._tenant_bucket(tenant, now), 0.0),
                ("global", self._global, keep),
            )
            if b is not None
        ]
        for name, b, _ in buckets:
            if cost_tokens > b.burst:
                return reject(
                    400,
                    "invalid_request",
                    f"request costs {cost_tokens} tokens (prompt + max_tokens), more than the "
                    f"{name} rate limit's burst of {b.burst:g}; lower max_tokens",
                    None,
                )
        waits = [(b.wait_for(cost_tokens, now, k), name, k) for name, b, k in buckets]
        worst = max(waits, default=(0.0, "", 0.0))
        if worst[0] > 0:
            kept = f" ({worst[2]:g} kept for realtime requests)" if worst[2] else ""
            return reject(
                429,
                "rate_limited",
                f"{worst[1]} rate limit: {cost_tokens} tokens needed{kept}, refill takes "
                f"{worst[0]:.2f} s",
                worst[0],
            )

        predicted, demoted_from = None, None
        if self.config.sla_admission:
            work = prompt_tokens or cost_tokens
            v = self.sla.check(self.queue.load(), priority, work, now, tenant, waited_s)
            predicted = v.predicted_s
            if v.late and demote_ok and priority in (Priority.P1, Priority.P2):
                demoted_from, priority, predicted = priority, Priority.P3, None
                depth = self.queue.queue_depth(priority)
            elif v.late:
                sla = self.priorities.sla(priority)
                return reject(
                    503,
                    "resource_exhausted",
                    f"the {priority.tier} ({priority.label}) TTFT SLA of {sla:g} s cannot be met: "
                    f"first token predicted in {v.predicted_s:.2f} s (limit {v.limit_s:.2f} s); "
                    f"retry after {v.retry_after_s:.1f} s",
                    v.retry_after_s,
                    SLA_UNREACHABLE,
                )

        shed = False
        lim_n = self.config.max_queued_requests[priority]
        lim_t = self.config.max_queued_tokens[priority]
        queued_t = self.queue.queued_tokens(priority)
        full = depth + 1 > lim_n or queued_t + cost_tokens > lim_t
        if full and priority == Priority.P0 and self.config.shed_for_p0:
            shed = self.queue.can_shed(below=priority)
        if full and not shed:
            if depth + 1 > lim_n:
                retry = self._retry_after(self._drain_reqs[priority], depth + 1 - lim_n, now)
                what = f"{depth} requests queued, limit {lim_n}"
            else:
                excess = queued_t + cost_tokens - lim_t
                retry = self._retry_after(self._drain_tokens[priority], excess, now)
                what = f"{queued_t} tokens queued, limit {lim_t}"
            return reject(
                503,
                "resource_exhausted",
                f"the {priority.tier} ({priority.label}) queue is full: {what}",
                retry,
            )

        if self.config.reject_on_sla_miss and not shed:
            sla = self.priorities.sla(priority)
            wait = self.estimate_wait(priority)
            if sla is not None and wait is not None and wait > sla:
                return reject(
                    503,
                    "resource_exhausted",
                    f"the {priority.tier} ({priority.label}) TTFT SLA of {sla:g} s cannot be "
                    f"met: estimated wait {wait:.2f} s",
                    min(MAX_RETRY_AFTER_S, wait - sla),
                )

        for _, b, k in buckets:
            b.take(cost_tokens, now, k)
        if demoted_from is not None:
            key = (SLA_DEMOTED, demoted_from)
            self.rejections[key] = self.rejections.get(key, 0) + 1
        return Decision(
            True,
            priority,
            queue_depth=depth,
            shed=shed,
            predicted_ttft_s=predicted,
            demoted_from=demoted_from,
        )
