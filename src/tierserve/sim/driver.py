"""Drive an EngineCore with a workload: the same loop for the simulator (virtual clock, cost
model executor) and for the real engine (wall clock, torch executor) in the fidelity check.

Loop: admit every arrival due by now (through the real AdmissionController), run one engine
step, record what finished (a closed-loop client sends its next request at that moment), and
when the engine is idle, wait for the next arrival. A request's arrival time is its event time,
so time spent before the loop notices it counts as waiting, as it would for a client.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from tierserve.admission import AdmissionController
from tierserve.engine.core import EngineCore, StepStats
from tierserve.priority import Priority
from tierserve.request import Request, RequestStatus
from tierserve.sim.events import EventKind, EventQueue
from tierserve.sim.workload import Workload


@dataclass
class RequestRecord:
    request_id: str
    priority: Priority
    arrival: float
    prompt_tokens: int
    max_tokens: int
    first_token: float | None = None
    finish: float | None = None
    output_tokens: int = 0
    preemptions: int = 0
    outcome: str = "pending"  # completed | rejected | failed | pending


@dataclass
class StepSample:
    time: float  # end of the step
    duration: float
    tokens_out: int
    tokens_total: int  # prompt + generated tokens computed in the step
    kv_usage: float
    floor_used: int
    reserve_used: int
    shared_used: int
    borrowed: int
    running: int
    waiting: int
    swapped: int


@dataclass
class DriveResult:
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[StepSample] = field(default_factory=list)
    end_time: float = 0.0


def record_of(req: Request) -> RequestRecord:
    return RequestRecord(
        req.request_id,
        req.base_priority,
        req.arrival_time,
        req.num_prompt_tokens,
        req.sampling_params.max_tokens,
    )


class EngineFeed:
    """One engine under a driver: admits requests through its admission controller, runs its
    steps and keeps every request's record. Shared by ``drive`` (one engine) and the fleet
    driver (sim/fleet.py); `on_finish(when)` hears of every request that ends."""

    def __init__(
        self,
        engine: EngineCore,
        admission: AdmissionController,
        result: DriveResult,
        on_finish: Callable[[float], None],
    ) -> None:
        self.engine = engine
        self.admission = admission
        self.result = result
        self.on_finish = on_finish
        self.live: dict[str, RequestRecord] = {}

    def submit(self, req: Request, now: float) -> float | None:
        """Record `req` and admit it, or reject it: then return when its client may retry."""
        rec = record_of(req)
        self.result.records.append(rec)
        cost = req.num_prompt_tokens + req.sampling_params.max_tokens
        d = self.admission.decide(req.priority, req.tenant, cost)
        if not d.admitted:
            rec.outcome = "rejected"
            return req.arrival_time + (d.retry_after_s or 1.0)
        if d.shed:
            shed = self.engine.shed_lowest(req.priority, "shed for a P0 request")
            if shed is not None and shed.request_id in self.live:
                self._finished(shed, now)
        self.engine.add_request(req)
        self.live[req.request_id] = rec
        return None

    def step(self) -> bool:
        """Run one engine step and record what it did; False when nothing could be scheduled
        and nothing ended (the engine waits for an event). A step may end requests even when
        it runs nothing (finished inside schedule()): those are recorded too."""
        engine = self.engine
        started = engine.clock.now()
        changed = engine.step()
        if engine.last_stats is None and not changed:
            return False
        self._sample(started, changed)
        for req in changed:
            rec = self.live.get(req.request_id)
            if rec is None:
                continue
            if rec.first_token is None and req.first_token_time is not None:
                rec.first_token = req.first_token_time
            if req.is_finished:
                self._finished(req, engine.clock.now())
        return True

    def _finished(self, req: Request, when: float) -> None:
        rec = self.live.pop(req.request_id)
        rec.finish = when
        rec.output_tokens = req.num_output_tokens
        rec.preemptions = req.num_preemptions
        truncated = req.num_output_tokens < req.sampling_params.max_tokens
        ok = req.status == RequestStatus.FINISHED and not truncated
        rec.outcome = "completed" if ok else "failed"
        self.on_finish(when)

    def _sample(self, started: float, changed: list[Request]) -> None:
        engine = self.engine
        stats: StepStats | None = engine.last_stats
        if stats is None:
            return
        now = engine.clock.now()
        part = engine.scheduler.kv.ledger.usage()
        self.result.samples.append(
            StepSample(
                now,
                now - started,
                sum(1 for r in changed if r.output_token_ids),
                stats.num_tokens,
                stats.kv_usage,
                part.floor_used,
                part.reserve_used,
                part.shared_used,
                part.borrowed,
                stats.running,
                stats.waiting,
                stats.swapped,
            )
        )


def first_arrivals(workload: Workload, events: EventQueue, start: float) -> None:
    """Seed the event queue: each closed-loop client's first request, spread over the ramp, or
    the first open-loop arrival."""
    cfg = workload.cfg
    if cfg.arrival == "closed":
        ramp = random.Random(cfg.seed + 1)
        for _ in range(cfg.concurrency):
            events.push(start + ramp.uniform(0, cfg.ramp_s), EventKind.ARRIVAL)
    else:
        events.push(start + workload.gap(), EventKind.ARRIVAL)


def drive(
    engine: EngineCore,
    workload: Workload,
    admission: AdmissionController,
    idle_until: Callable[[float], None],
    progress: Callable[[float], None] | None = None,
) -> DriveResult:
    cfg = workload.cfg
    clock = engine.clock
    events = EventQueue()
    result = DriveResult()
    start = clock.now()
    first_arrivals(workload, events, start)
    end = start + cfg.duration_s

    def on_finish(when: float) -> None:
        if cfg.arrival == "closed":
            events.push(when, EventKind.COMPLETION)

    feed = EngineFeed(engine, admission, result, on_finish)
    while True:
        now = clock.now()
        # COMPLETION (a closed-loop client's next request) and ARRIVAL both bring a request.
        for t, _kind, _ in events.pop_due(now):
            if t >= end:
                continue  # arrivals stop; a closed-loop client retires
            retry = feed.submit(workload.make(t), now)
            if retry is not None and cfg.arrival == "closed":
                events.push(retry, EventKind.ARRIVAL)
            if cfg.arrival != "closed":
                events.push(t + workload.gap(), EventKind.ARRIVAL)
        if engine.has_unfinished():
            if not feed.step():  # nothing could be scheduled: wait for an event
                nxt = events.peek_time()
                if nxt is None:
                    raise RuntimeError("the engine has work it cannot schedule and none arrives")
                idle_until(nxt)
                continue
            if progress:
                progress(clock.now() - start)
            continue
        nxt = events.peek_time()
        if nxt is None:
            break
        idle_until(nxt)
    result.end_time = clock.now()
    return result
