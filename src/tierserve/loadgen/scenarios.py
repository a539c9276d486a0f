"""`--scenario flood`: priority isolation, for any server.

Phase 1 (idle): P0 probes alone, one every `probe_interval` seconds -> the idle P0 TTFT.
Phase 2 (flood): `streams` background (P3) clients run back to back; after `settle` seconds
(everyone admitted and decoding) P0 probes arrive every `probe_interval` seconds until
`duration`. When the phase ends the background streams are cut (they count as unfinished).
Reported: P0's loaded TTFT over its idle TTFT (P50 and P95), and the background throughput
inside the probe window [settle, duration).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tierserve.loadgen.client import RequestRecord
from tierserve.loadgen.metrics import run_stats
from tierserve.loadgen.runner import Control, Level, LevelResult, SendFn
from tierserve.sim.engine.stats import percentile


@dataclass(frozen=True)
class FloodOptions:
    streams: int = 16
    probe_interval_s: float = 2.0
    idle_probes: int = 5
    settle_s: float = 5.0
    duration_s: float = 60.0

    def __post_init__(self) -> None:
        if self.streams < 1 or self.idle_probes < 1 or self.probe_interval_s <= 0:
            raise ValueError("flood: --flood-streams, --idle-probes, --probe-interval must be > 0")
        if not 0 <= self.settle_s < self.duration_s:
            raise ValueError(f"flood: --flood-settle {self.settle_s} must lie in [0, --duration)")


async def _probes(start: float, until: float, interval: float, probe, control, clock, tasks):
    """Launch one probe every `interval` s from `start` while `until` is not reached (into
    `tasks`, which the caller cancels if a stop comes first); wait for them to end."""
    t = start
    while t < until and not control.stopped:
        while (delay := t - clock()) > 0 and not control.stopped:
            await asyncio.sleep(min(delay, 0.1))
        if control.stopped:
            return
        tasks.append(asyncio.create_task(probe()))
        t += interval
    while not control.stopped and not all(x.done() for x in tasks):
        await asyncio.wait(tasks, timeout=0.1)


async def _phase(
    opts: FloodOptions, p0_spec, p3_spec, send: SendFn, control: Control, clock, loaded: bool
) -> LevelResult:
    records: list[RequestRecord] = []

    async def one(spec) -> None:
        now = clock()
        rec = RequestRecord(
            spec.index, int(spec.priority), now, spec.prompt_tokens, spec.max_tokens
        )
        records.append(rec)
        await send(spec, rec)
        control.observe(rec)

    async def background() -> None:
        while not control.stopped:
            await one(p3_spec())

    bg = [asyncio.create_task(background()) for _ in range(opts.streams if loaded else 0)]
    probes: list[asyncio.Task] = []
    start = opts.settle_s if loaded else 0.0
    until = opts.duration_s if loaded else opts.probe_interval_s * (opts.idle_probes - 0.5)
    try:
        await _probes(
            start, until, opts.probe_interval_s, lambda: one(p0_spec()), control, clock, probes
        )
    finally:
        end = clock()
        for t in bg + probes:
            t.cancel()
        await asyncio.gather(*bg, *probes, return_exceptions=True)
        for r in records:
            if r.outcome == "unfinished":
                r.error = control.reason or "background stream cut at the end of the phase"
    window = (start, min(end, until)) if loaded else (0.0, end)
    return LevelResult(Level(concurrency=len(bg)), records, window, end)


def _p0_ttfts(res: LevelResult) -> list[float]:
    return [
        r.first_token - r.arrival
        for r in res.records
        if r.priority == 0 and r.first_token is not None and r.outcome == "completed"
    ]


async def run_flood(
    opts: FloodOptions,
    p0_spec: Callable,
    p3_spec: Callable,
    make_send: Callable[[Callable[[], float]], SendFn],
    control: Control,
    new_clock: Callable[[], Callable[[], float]],
    progress=None,
) -> list[LevelResult]:
    """Both phases. `new_clock()` gives a clock reading seconds since that call (one per
    phase); `make_send(clock)` the function that sends a request timed by that clock."""
    out = []
    for loaded in (False, True):
        if control.stopped:
            break
        if progress:
            progress.start("flood" if loaded else "idle probes", 1, "phase")
        clock = new_clock()
        res = await _phase(opts, p0_spec, p3_spec, make_send(clock), control, clock, loaded)
        if progress:
            progress.update(1, res.records)
            progress.close()
        out.append(res)
    return out


def flood_summary(opts: FloodOptions, phases: list[LevelResult], ttft_sla, tpot_slo) -> dict | None:
    """The scenario's figures (None for a phase that did not run)."""
    idle = _p0_ttfts(phases[0]) if phases else []
    loaded = _p0_ttfts(phases[1]) if len(phases) > 1 else []
    bg = None
    if len(phases) > 1:
        bg = run_stats(phases[1].records, phases[1].window, ttft_sla, tpot_slo)

    def ratio(q: float) -> float | None:
        a, b = percentile(loaded, q), percentile(idle, q)
        return a / b if a is not None and b else None

    p3 = bg["classes"]["P3"] if bg else {}
    return {
        "streams": opts.streams,
        "probe_interval_s": opts.probe_interval_s,
        "settle_s": opts.settle_s,
        "duration_s": opts.duration_s,
        "idle_probes": len(idle),
        "loaded_probes": len(loaded),
        "p0_idle_ttft_p50_s": percentile(idle, 50),
        "p0_idle_ttft_p95_s": percentile(idle, 95),
        "p0_loaded_ttft_p50_s": percentile(loaded, 50),
        "p0_loaded_ttft_p95_s": percentile(loaded, 95),
        "p0_ttft_ratio_p50": ratio(50),
        "p0_ttft_ratio_p95": ratio(95),
        "background_throughput_tokens_per_s": p3.get("throughput_tokens_per_s"),
        "background_throughput_total_tokens_per_s": p3.get("throughput_total_tokens_per_s"),
        # the probes' decode under the flood (what speculative decoding is for)
        "p0_loaded_tpot_mean_s": (bg["classes"]["P0"].get("tpot_mean_s") if bg else None),
    }
