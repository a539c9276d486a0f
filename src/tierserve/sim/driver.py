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


def _record(req: Request) -> RequestRecord:
    return RequestRecord(
        req.request_id,
        req.base_priority,
        req.arrival_time,
        req.num_prompt_tokens,
        req.sampling_params.max_tokens,
    )


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
    live: dict[str, RequestRecord] = {}
    start = clock.now()
    if cfg.arrival == "closed":
        ramp = random.Random(cfg.seed + 1)
        for _ in range(cfg.concurrency):
            events.push(start + ramp.uniform(0, cfg.ramp_s), EventKind.ARRIVAL)
    else:
        events.push(start + workload.gap(), EventKind.ARRIVAL)
    end = start + cfg.duration_s

    def finished(req: Request, when: float) -> None:
        rec = live.pop(req.request_id)
        rec.finish = when
        rec.output_tokens = req.num_output_tokens
        rec.preemptions = req.num_preemptions
        truncated = req.num_output_tokens < req.sampling_params.max_tokens
        ok = req.status == RequestStatus.FINISHED and not truncated
        rec.outcome = "completed" if ok else "failed"
        if cfg.arrival == "closed":
            events.push(when, EventKind.COMPLETION)

    def sample(started: float, changed: list[Request]) -> None:
        stats: StepStats | None = engine.last_stats
        if stats is None:
            return
        part = engine.scheduler.kv.ledger.usage()
        result.samples.append(
            StepSample(
                clock.now(),
                clock.now() - started,
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

    while True:
        now = clock.now()
        # COMPLETION (a closed-loop client's next request) and ARRIVAL both bring a request.
        for t, _kind, _ in events.pop_due(now):
            if t >= end:
                continue  # arrivals stop; a closed-loop client retires
            req = workload.make(t)
            rec = _record(req)
            result.records.append(rec)
            cost = req.num_prompt_tokens + req.sampling_params.max_tokens
            d = admission.decide(req.priority, req.tenant, cost)
            if not d.admitted:
                rec.outcome = "rejected"
                retry = t + (d.retry_after_s or 1.0)
                if cfg.arrival == "closed":
                    events.push(retry, EventKind.ARRIVAL)
            else:
                if d.shed:
                    shed = engine.shed_lowest(req.priority, "shed for a P0 request")
                    if shed is not None and shed.request_id in live:
                        finished(shed, now)
                engine.add_request(req)
                live[req.request_id] = rec
            if cfg.arrival != "closed":
                events.push(t + workload.gap(), EventKind.ARRIVAL)
        if engine.has_unfinished():
            started = clock.now()
            changed = engine.step()  # may end requests even when it runs nothing
            if engine.last_stats is None and not changed:  # nothing could be scheduled
                nxt = events.peek_time()
                if nxt is None:
                    raise RuntimeError("the engine has work it cannot schedule and none arrives")
                idle_until(nxt)
                continue
            sample(started, changed)
            for req in changed:
                rec = live.get(req.request_id)
                if rec is None:
                    continue
                if rec.first_token is None and req.first_token_time is not None:
                    rec.first_token = req.first_token_time
                if req.is_finished:
                    finished(req, clock.now())
            if progress:
                progress(clock.now() - start)
            continue
        nxt = events.peek_time()
        if nxt is None:
            break
        idle_until(nxt)
    result.end_time = clock.now()
    return result
