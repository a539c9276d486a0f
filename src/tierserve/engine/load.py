"""The TTFT predictor's view of an engine, read on the thread that steps it.

``load_of`` is the one function that turns an engine's state -- the scheduler's record
(``Scheduler.make_stats(with_queue=True)``, core/stats.py) and the rates the engine measured --
into the predictor's ``Load``: the engine thread calls it for every published snapshot (the
server's admission reads it there), and the simulator calls it directly (``measure_load``,
through ``CoreQueueView``). So admission decides by the same numbers, computed by the same code,
in the simulator and in the server.

``late_requests`` is the re-check of requests already admitted: walking each class's queue in
the policy's order, it predicts every waiting request's first token with the same predictor and
returns those that opted in (``Request.end_if_late``) and can no longer make their class's SLA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierserve.admission.engine_rate import EngineShape
from tierserve.admission.load_meter import LoadMeter
from tierserve.admission.ttft import SLA_UNREACHABLE, Load, TenantBacklog, predict_ttft
from tierserve.config import PriorityConfig
from tierserve.core.stats import QueueStats, SchedulerStats
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import Request

if TYPE_CHECKING:
    from tierserve.engine.core import EngineCore


def measure_load(core: EngineCore) -> Load:
    """The predictor's inputs, from the engine's live state. O(running + waiting)."""
    return load_of(core, core.scheduler.make_stats(with_queue=True))


def load_of(core: EngineCore, stats: SchedulerStats) -> Load:
    """The predictor's inputs: the scheduler's record (made `with_queue`) and the rates the
    engine measured. Waiting work counts in the class it waits in now (aging may have promoted
    it there: it waits behind that class's own), and by tenant when tenants share a class."""
    q, meter, now = stats.queue, core.load_meter, stats.time
    if q is None:
        raise ValueError("the TTFT predictor needs a scheduler record made with_queue")
    engine = engine_shape(core, stats, q)
    return Load(
        waiting_tokens=q.waiting_tokens,
        promoted_tokens=q.promoted_tokens,
        tenants=tuple(
            _tenants(meter, Priority(c), q.tenants[c], dict(q.tenant_counters[c]), now)
            for c in range(NUM_PRIORITIES)
        ),
        running_prefill=stats.prefill_tokens,
        arrival_rate=meter.arrival_rates(now),
        prefill_rate=meter.prefill_rate_at(now, engine.rate(0)),
        step_s=meter.step_s,
        order=core.service_order,
        class_tags=q.class_tags,
        engine=engine,
        computed_share=meter.computed_share(
            core.scheduler.prompt_tokens_started, core.scheduler.prompt_tokens_cached
        ),
    )


def engine_shape(core: EngineCore, stats: SchedulerStats, q: QueueStats) -> EngineShape:
    """The engine's shape for the predicted rates (admission/engine_rate.py): the step-time
    model and its bound, the seats, the decodes running and the work waiting behind them, from
    the scheduler's record and its step-time model (read on the engine thread)."""
    s = core.scheduler
    return EngineShape(
        coef=s.step_time.coefficients,
        bound_s=s.step_bound_s,
        token_budget=stats.max_num_batched_tokens,
        max_num_seqs=stats.max_num_seqs,
        decodes=stats.num_running,
        decode_context=stats.decode_context,
        waiting_requests=q.requests,
        waiting_context=sum(q.waiting_tokens),
        seat_rate=core.load_meter.seat_rate(stats.time, s.seats_freed),
        remaining_output=stats.remaining_output,
        waiting_output=q.output_tokens,
    )


def _tenants(
    meter: LoadMeter,
    c: Priority,
    waiting: tuple[tuple[str, int, int], ...],
    counters: dict[str, float],
    now: float,
) -> tuple[TenantBacklog, ...]:
    """The backlogged tenants of class `c`, and the idle ones whose counter is above the lowest
    backlogged one (a tenant that starts waiting keeps such a counter: it is not lifted)."""
    if not waiting:
        return ()
    backlog = {t: (own, n) for t, own, n in waiting}
    floor = min(counters.get(t, 0.0) for t in backlog)
    names = set(backlog) | {t for t, v in counters.items() if v > floor}
    rate = meter.tenant_rate
    return tuple(
        TenantBacklog(t, *backlog.get(t, (0, 0)), rate(c, t, now), counters.get(t, 0.0))
        for t in sorted(names)
    )


class CoreQueueView:
    """Admission's ``QueueView`` read straight from an engine, for a single-threaded driver
    (the simulator). The server's is ``AsyncEngine``, which reads the published snapshot."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.scheduler = core.scheduler

    def queue_depth(self, priority: Priority) -> int:
        return self.scheduler.queue_depth(priority)

    def queued_tokens(self, priority: Priority) -> int:
        return self.scheduler.queued_tokens(priority)

    def can_shed(self, below: Priority) -> bool:
        return self.scheduler.can_shed(below)

    def dequeued(self, priority: Priority) -> tuple[int, int]:
        return self.scheduler.dequeued(priority)

    def load(self) -> Load:
        return measure_load(self.core)


def late_requests(
    core: EngineCore, priorities: PriorityConfig, margin: float
) -> list[tuple[Request, float]]:
    """Waiting requests that opted in to being ended early and are now predicted to miss their
    class's TTFT SLA (by more than `margin` x SLA when the margin exceeds 1), with how late each
    is predicted to be (seconds). O(waiting log waiting); nothing is computed while no waiting
    request has opted in."""
    policy = core.scheduler.policy
    waiting = policy.requests()
    if not any(r.end_if_late for r in waiting):
        return []
    load = measure_load(core)
    now = core.clock.now()
    order = load.order
    # The queues whose order decides who is ahead: per class (and tenant, when tenants share a
    # class), or one in all for a class-blind policy.
    groups: dict[tuple, list[Request]] = {}
    for r in waiting:
        key = (int(r.priority), r.tenant if order.tenant_fair else None)
        groups.setdefault(key if order.class_aware else (), []).append(r)
    late = []
    for group in groups.values():
        group.sort(key=policy.queue_key)
        ahead = 0
        for r in group:
            sla = priorities.sla(r.base_priority)
            if r.end_if_late and sla is not None:
                t = predict_ttft(load, r.priority, r.num_tokens, ahead, r.tenant)
                due = r.arrival_time + sla * max(1.0, margin)
                if t is not None and now + t > due:
                    late.append((r, now + t - due))
            ahead += r.num_tokens
    return late


def late_message(request: Request, sla: float, late_s: float) -> str:
    p = request.base_priority
    return (
        f"{SLA_UNREACHABLE}: the {p.tier} ({p.label}) TTFT SLA of {sla:g} s can no longer be "
        f"met (first token predicted {late_s:.1f} s late); the request was ended early, "
        "retry later"
    )


class LateRequestCheck:
    """``late_requests`` paced to at most once every `every_s` seconds of engine time, with the
    message each late request is ended with. Used by the server's engine thread and by the
    simulator's driver alike."""

    def __init__(self, priorities: PriorityConfig, margin: float, every_s: float = 0.5) -> None:
        self.priorities, self.margin, self.every_s = priorities, margin, every_s
        self._next = -float("inf")

    def poll(self, core: EngineCore) -> list[tuple[Request, float, str]]:
        now = core.clock.now()
        if now < self._next:
            return []
        self._next = now + self.every_s
        late = late_requests(core, self.priorities, self.margin)
        return [
            (r, s, late_message(r, self.priorities.sla(r.base_priority) or 0.0, s)) for r, s in late
        ]
