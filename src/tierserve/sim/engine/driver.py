"""Drive an EngineCore with a workload: the same loop for the simulator (virtual clock, cost
model executor) and for the real engine (wall clock, torch executor) in the fidelity check.

Loop: admit every arrival due by now (through the real AdmissionController), run one engine
step, record what finished (a closed-loop client sends its next request at that moment), and
when the engine is idle, wait for the next arrival. A request's arrival time is its event time,
so time spent before the loop notices it counts as waiting, as it would for a client.

A refused closed-loop client obeys the Retry-After it was given (whole seconds, as the header
says): it sends the same request again then, at most `max_retries` times, and after that gives
up on it and sends its next one. Each attempt is a record (`attempt` counts the retries).
With SLA admission on, the driver also runs the re-check of waiting requests after each step
(``LateRequestCheck``, the same code as the server's engine thread).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from tierserve.admission import AdmissionController
from tierserve.admission.controller import Decision
from tierserve.admission.sla import retry_after_seconds
from tierserve.cluster.signals import ClassWindow
from tierserve.engine.core import EngineCore, StepStats
from tierserve.engine.load import LateRequestCheck
from tierserve.priority import Priority
from tierserve.request import FinishReason, Request, RequestStatus
from tierserve.sim.engine.events import EventKind, EventQueue
from tierserve.workloads.synthetic import Workload


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
    outcome: str = "pending"  # completed | rejected | failed | ended_early | pending
    attempt: int = 0  # 0: first sent; n: the n-th retry after a refusal
    predicted_ttft: float | None = None  # SLA admission's prediction when admitted
    demoted: bool = False  # admitted as P3 instead of its class (tenant opted in)
    tenant: str = ""


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


@dataclass(frozen=True)
class SlaClients:
    """What the simulated tenants opted into under SLA admission, and how clients retry."""

    demote_tenants: frozenset[str] = frozenset()  # late P1/P2 requests become P3
    end_early_tenants: frozenset[str] = frozenset()  # late waiting requests are ended
    recheck: LateRequestCheck | None = None


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
        tenant=req.tenant,
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
        sla: SlaClients | None = None,
        window: ClassWindow | None = None,
    ) -> None:
        self.engine = engine
        self.window = window  # a fleet replica's autoscaling signals (cluster/signals.py)
        self.admission = admission
        self.result = result
        self.on_finish = on_finish
        self.sla = sla or SlaClients()
        self.live: dict[str, RequestRecord] = {}

    def submit(
        self, req: Request, now: float, attempt: int = 0, decision: Decision | None = None
    ) -> float | None:
        """Record `req` and admit it, or reject it: then return when its client may retry.
        `decision`: already made (a fleet's ingress admits); else this engine's admission."""
        rec = record_of(req)
        rec.attempt = attempt
        self.result.records.append(rec)
        d = decision or self.decide(req)
        if d.predicted_ttft_s is not None and math.isfinite(d.predicted_ttft_s):
            rec.predicted_ttft = d.predicted_ttft_s
        if not d.admitted:
            rec.outcome = "rejected"
            return req.arrival_time + retry_after_seconds(d.retry_after_s)
        if d.demoted_from is not None:
            req.priority = req.base_priority = d.priority
            rec.demoted = True
        req.end_if_late = req.tenant in self.sla.end_early_tenants
        if d.shed:
            shed = self.engine.shed_lowest(req.priority, "shed for a P0 request")
            if shed is not None and shed.request_id in self.live:
                self._finished(shed, now)
        self.engine.add_request(req)
        self.live[req.request_id] = rec
        if self.window is not None:
            self.window.on_added(req.request_id, req.priority, req.arrival_time)
        return None

    def decide(self, req: Request) -> Decision:
        """`req` judged by this engine's admission controller."""
        cost = req.num_prompt_tokens + req.sampling_params.max_tokens
        demote = req.tenant in self.sla.demote_tenants
        return self.admission.decide(req.priority, req.tenant, cost, req.num_prompt_tokens, demote)

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
                if self.window is not None:
                    ttft = rec.first_token - req.arrival_time
                    self.window.on_first_token(req.request_id, req.priority, ttft, rec.first_token)
            if req.is_finished:
                self._finished(req, engine.clock.now())
        self._end_late()
        return True

    def _end_late(self) -> None:
        """The SLA re-check: end the waiting requests predicted to miss their SLA (opted in)."""
        if self.sla.recheck is None:
            return
        for req, _late, message in self.sla.recheck.poll(self.engine):
            if self.engine.fail_request(req.request_id, message) is not None:
                rec = self.live.get(req.request_id)
                self._finished(req, self.engine.clock.now())
                if rec is not None:
                    rec.outcome = "ended_early"

    def _finished(self, req: Request, when: float) -> None:
        rec = self.live.pop(req.request_id)
        rec.finish = when
        if self.window is not None:
            self.window.on_finished(req.request_id, when)
        rec.output_tokens = req.num_output_tokens
        rec.preemptions = req.num_preemptions
        # Ended by EOS (a drawn length), or by max_tokens; "length" short of it: cut off.
        ended = req.finish_reason == FinishReason.STOP
        truncated = not ended and req.num_output_tokens < req.sampling_params.max_tokens
        ok = req.status == RequestStatus.FINISHED and not truncated
        rec.outcome = "completed" if ok else "failed"
        self.on_finish(when)

    def _sample(self, started: float, changed: list[Request]) -> None:
        engine = self.engine
        stats: StepStats | None = engine.last_stats
        if stats is None:
            return
        now = engine.clock.now()
        part = stats.scheduler.kv.partitions
        self.result.samples.append(
            StepSample(
                now,
                now - started,
                # a token per request that got one, plus the drafts verification accepted
                sum(1 for r in changed if r.output_token_ids)
                + (sum(c[1] for c in stats.spec.step) if stats.spec else 0),
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


def resend(req: Request, now: float, attempt: int) -> Request:
    """A refused client's retry: the same request, sent again at `now`."""
    return Request(
        f"{req.request_id.split('~')[0]}~{attempt}",
        req.prompt_token_ids,
        req.sampling_params,
        priority=req.base_priority,
        tenant=req.tenant,
        arrival_time=now,
        deadline=req.deadline,
    )


def drive(
    engine: EngineCore,
    workload: Workload,
    admission: AdmissionController,
    idle_until: Callable[[float], None],
    progress: Callable[[float], None] | None = None,
    max_retries: int = 0,
    sla: SlaClients | None = None,
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

    feed = EngineFeed(engine, admission, result, on_finish, sla)

    def _admit_due(due: list) -> None:
        now = clock.now()
        for t, _kind, again in due:
            if t >= end:
                continue  # arrivals stop; a closed-loop client retires
            req, attempt = (workload.make(t), 0) if again is None else again
            if again is not None:
                req = resend(req, t, attempt)
            retry = feed.submit(req, now, attempt)
            if retry is not None and cfg.arrival == "closed":
                give_up = attempt >= max_retries
                events.push(retry, EventKind.ARRIVAL, None if give_up else (req, attempt + 1))
            if cfg.arrival != "closed":
                events.push(t + workload.gap(), EventKind.ARRIVAL)

    while True:
        now = clock.now()
        # COMPLETION (a closed-loop client's next request) and ARRIVAL both bring a request;
        # an ARRIVAL with a payload is a refused request sent again. An open-loop arrival
        # schedules the next one, which may be due already (gaps shorter than the step that
        # just ran): pop until nothing is due, so arrivals keep their rate whatever the step.
        while due := events.pop_due(now):
            _admit_due(due)
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
