"""Load shapes: a closed loop of N clients (each sends its next request when the last one ends)
or an open loop (arrivals at Poisson / gamma gaps, whatever the server does), for a duration or
a number of requests.

Measurement, as the simulator does it: in duration mode, requests sent in [warmup, duration)
are measured and the window for rates is [warmup, duration); at `duration` no new request is
sent, and the ones in flight get `drain_timeout` seconds to finish (then they are cancelled and
count as unfinished). In request-count mode, the first `warmup_requests` are not measured, the
next `num_requests` are, and the window runs from the first measured send to the last measured
end. A closed-loop client whose request is refused (429/503) waits for the Retry-After it got
(1 s without one, at most 30 s) before its next request, as a well-behaved client does; with
`backoff` off it sends at once. A `Control` stops everything early: Ctrl-C, or too many
failures in a row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tierserve.loadgen.client import RequestRecord
from tierserve.loadgen.workload import RequestSpec

SendFn = Callable[[RequestSpec, RequestRecord], Awaitable[None]]
POLL_S = 0.1
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class Level:
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, requests per second

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.rate is None else f"rate {self.rate:g}/s"


@dataclass(frozen=True)
class Limits:
    duration_s: float | None = 60.0
    num_requests: int | None = None
    warmup_s: float = 0.0
    warmup_requests: int = 0
    drain_timeout_s: float = 60.0
    max_consecutive_errors: int = 10  # 0: never stop for errors
    backoff: bool = True  # closed loop: a refused client waits for its Retry-After

    def __post_init__(self) -> None:
        if (self.duration_s is None) == (self.num_requests is None):
            raise ValueError("give exactly one of --duration and --num-requests")
        if self.duration_s is not None and not 0 <= self.warmup_s < self.duration_s:
            raise ValueError(f"--warmup {self.warmup_s} must lie in [0, --duration)")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"--num-requests must be at least 1, got {self.num_requests}")


class Control:
    """Why and when to stop early; shared by every level of a run."""

    def __init__(self, max_consecutive_errors: int = 10) -> None:
        self.max_errors = max_consecutive_errors
        self.reason: str | None = None
        self.interrupted = False
        self._streak = 0

    @property
    def stopped(self) -> bool:
        return self.reason is not None

    def halt(self, reason: str, interrupted: bool = False) -> None:
        if self.reason is None:
            self.reason, self.interrupted = reason, interrupted

    def observe(self, rec: RequestRecord) -> None:
        if rec.outcome == "completed":
            self._streak = 0
        elif rec.outcome == "failed":
            self._streak += 1
            if self.max_errors and self._streak >= self.max_errors:
                self.halt(f"{self._streak} requests failed in a row; the last one: {rec.error}")


@dataclass
class LevelResult:
    level: Level
    records: list[RequestRecord]
    window: tuple[float, float] | None
    elapsed_s: float


class _Level:
    """The bookkeeping of one level: who is measured, whether to send more, the window."""

    def __init__(self, limits: Limits, control: Control, clock: Callable[[], float]) -> None:
        self.limits, self.control, self.clock = limits, control, clock
        self.records: list[RequestRecord] = []
        self.tasks: set[asyncio.Task] = set()
        self.measured_sent = 0

    def may_send(self, at: float | None = None) -> bool:
        lim, now = self.limits, self.clock() if at is None else at
        if self.control.stopped:
            return False
        if lim.duration_s is not None:
            return now < lim.duration_s
        return self.measured_sent < lim.num_requests

    def record(self, spec: RequestSpec) -> RequestRecord:
        now, lim = self.clock(), self.limits
        measured = now >= lim.warmup_s and len(self.records) >= lim.warmup_requests
        self.measured_sent += measured
        rec = RequestRecord(
            spec.index, int(spec.priority), now, spec.prompt_tokens, spec.max_tokens, measured
        )
        rec.template, rec.stop_after = spec.template, spec.stop_after
        self.records.append(rec)
        return rec

    def window(self, end: float) -> tuple[float, float] | None:
        lim = self.limits
        if lim.duration_s is not None:
            hi = min(lim.duration_s, end)
            return (lim.warmup_s, hi) if hi > lim.warmup_s else None
        m = [r for r in self.records if r.measured]
        if not m:
            return None
        ends = [r.finish if r.finish is not None else end for r in m]
        return min(r.arrival for r in m), max(ends)


async def _send_one(state: _Level, send: SendFn, spec: RequestSpec) -> RequestRecord:
    rec = state.record(spec)
    await send(spec, rec)
    state.control.observe(rec)
    return rec


async def _closed(state: _Level, n: int, next_spec, send: SendFn) -> None:
    lim = state.limits

    async def client() -> None:
        while state.may_send():
            rec = await _send_one(state, send, next_spec())
            if rec.outcome == "rejected" and lim.backoff:
                wait = min(MAX_BACKOFF_S, rec.retry_after or 1.0)
                if lim.duration_s is not None:
                    wait = min(wait, lim.duration_s - state.clock())
                await asyncio.sleep(max(0.0, wait))

    state.tasks.update(asyncio.create_task(client()) for _ in range(n))


async def _open(state: _Level, gaps, next_spec, send: SendFn) -> None:
    t_next = 0.0
    while True:
        t_next += gaps.next()
        if not state.may_send(at=t_next):
            return
        while (delay := t_next - state.clock()) > 0 and not state.control.stopped:
            await asyncio.sleep(min(delay, POLL_S))
        if not state.may_send(at=t_next):
            return
        state.tasks.add(asyncio.create_task(_send_one(state, send, next_spec())))


async def run_level(
    level: Level,
    next_spec: Callable[[], RequestSpec],
    send: SendFn,
    limits: Limits,
    control: Control,
    clock: Callable[[], float],
    gaps=None,
    progress=None,
) -> LevelResult:
    """Run one level; `clock` reads seconds since the level's start."""
    state = _Level(limits, control, clock)
    arrivals = None
    if level.rate is None:
        await _closed(state, level.concurrency, next_spec, send)
    else:
        arrivals = asyncio.create_task(_open(state, gaps, next_spec, send))
    dur, total = limits.duration_s, limits.duration_s or limits.num_requests
    if progress:
        progress.start(level.label, total, "s" if dur is not None else "req")
    try:
        while not control.stopped:
            busy = [t for t in state.tasks if not t.done()]
            if not busy and (arrivals is None or arrivals.done()):
                break
            if dur is not None and clock() >= dur + limits.drain_timeout_s:
                break
            await asyncio.wait([*busy, *([arrivals] if arrivals else [])], timeout=POLL_S)
            if progress:
                done = clock() if dur is not None else sum(r.measured for r in state.records)
                progress.update(done, state.records)
    finally:
        end = clock()
        for t in [*state.tasks, *([arrivals] if arrivals else [])]:
            t.cancel()
        await asyncio.gather(
            *state.tasks, *([arrivals] if arrivals else []), return_exceptions=True
        )
        for r in state.records:
            if r.outcome == "unfinished":
                r.error = control.reason or "still running when the drain timeout ended"
        if progress:
            progress.close()
    for t in state.tasks:  # a bug in our own code must not pass silently
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()
    return LevelResult(level, state.records, state.window(end), end)
