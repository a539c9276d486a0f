"""Metrics: turns engine events, step stats and snapshots into the families of families.py.

Each server owns one (no process globals); every layer reports through it, none depends on it
for logic. Request events and step stats arrive on the engine thread, rejections on the event
loop; prometheus_client's metrics are thread-safe, and the little state kept here (the last
token time of each running request, the last prefix-cache totals, the sliding windows of the
hit-rate and SLA gauges) is engine-thread only.

Label values never come from unauthenticated input: the `tenant` label is a tenant the server
was configured with (a tenants file's names, or "default"), and any other name (an open
server's `x-tenant-id`) is counted under "other", so no client can grow the series.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import generate_latest

from tierserve.config import PriorityConfig
from tierserve.core.speculation import SpecStepStats
from tierserve.engine.core import StepStats
from tierserve.engine.events import (
    EndedLate,
    EngineEvent,
    Finished,
    FirstToken,
    RequestInfo,
    Tokens,
)
from tierserve.engine.snapshot import EngineSnapshot
from tierserve.metrics.families import PARTITIONS, Families
from tierserve.metrics.window import DEFAULT_WINDOW_S, WindowRatio
from tierserve.priority import ALL_PRIORITIES, NUM_PRIORITIES, Priority

DEFAULT_MODEL_NAME = "tierserve"
DEFAULT_TENANT = "default"
OTHER_TENANT = "other"  # every tenant the server was not configured with


class Metrics:
    def __init__(
        self,
        priorities: PriorityConfig | None = None,
        model_name: str = DEFAULT_MODEL_NAME,
        tenants: Iterable[str] = (),
        window_s: float = DEFAULT_WINDOW_S,
    ) -> None:
        """`tenants`: the configured tenant names, the only `tenant` label values besides
        "default" and "other"; `window_s`: the sliding window of the ratio gauges."""
        self.priorities = priorities or PriorityConfig()
        self.model_name = model_name
        self.tenants = frozenset({DEFAULT_TENANT, *tenants})
        f = self.f = Families(model_name)
        self.registry = f.registry
        self._last_token: dict[str, float] = {}  # engine thread only
        self._prefix_seen = ([0] * NUM_PRIORITIES, [0] * NUM_PRIORITIES)
        self._hits = [WindowRatio(window_s) for _ in ALL_PRIORITIES]  # engine thread only
        self._sla_window = [WindowRatio(window_s, empty=1.0) for _ in ALL_PRIORITIES]
        # Make every labelled series visible from the start, at zero.
        for q in ALL_PRIORITIES:
            for fam in (f.queue_depth, f.running, f.waiting, f.prefix_queries, f.prefix_hits):
                fam.labels(q.label)
            f.sla_met.labels(q.label, q.tier)
            f.sla_total.labels(q.label, q.tier)
            f.sla_ended.labels(q.label)
            f.hit_rate.labels(q.label)
            f.sla_attainment.labels(q.label, q.tier).set(1.0)
        for part in PARTITIONS:
            for state in ("used", "free"):
                f.kv_blocks.labels(part, state)
        f.kv_blocks.labels("reserve", "borrowed")
        for fam in (f.v_running, f.v_waiting, f.v_kv_usage, f.v_prefix_queries, f.v_prefix_hits):
            fam.labels()
        for fam in (f.v_preemptions, f.v_prompt, f.v_generation):
            fam.labels()

    # -- the event loop -------------------------------------------------------------------
    def on_rejected(self, kind: str, priority: Priority) -> None:
        self.f.rejections.labels(kind, priority.label).inc()

    # -- the engine thread: request events ----------------------------------------------------
    def on_event(self, event: EngineEvent) -> None:
        """An engine event (engine/events.py), on the engine thread."""
        match event:
            case FirstToken(info, at):
                self.on_first_token(info, at)
            case Tokens(info, n, at):
                self.on_tokens(info, n, at)
            case Finished(info):
                self.on_finished(info)
            case EndedLate(info):
                self.on_ended_late(info)

    def on_first_token(self, req: RequestInfo, now: float) -> None:
        """The first output token of `req` reached its stream at `now`."""
        f, label = self.f, req.priority.label
        ttft = now - req.arrival_time
        f.ttft.labels(label).observe(ttft)
        f.v_ttft.labels().observe(ttft)
        if req.predicted_ttft is not None:
            f.ttft_error.labels(label).observe(abs(ttft - req.predicted_ttft))
        if req.first_scheduled_time is not None:
            queued = req.first_scheduled_time - req.arrival_time
            f.wait.labels(label).observe(queued)
            f.v_queue.labels().observe(queued)
            f.prefill_time.labels(label).observe(now - req.first_scheduled_time)
            f.v_prefill.labels().observe(now - req.first_scheduled_time)
        f.tokens_in.labels(label).inc(req.num_prompt_tokens)
        f.v_prompt.labels().inc(req.num_prompt_tokens)
        self._last_token[req.request_id] = now

    def on_tokens(self, req: RequestInfo, n: int, now: float) -> None:
        """`n` more output tokens of `req` (after the first) reached its stream at `now`."""
        f, label = self.f, req.priority.label
        last = self._last_token.get(req.request_id, now)
        gap = (now - last) / n
        for _ in range(n):
            f.itl.labels(label).observe(gap)
            f.v_itl.labels().observe(gap)
        self._last_token[req.request_id] = now

    def on_finished(self, req: RequestInfo) -> None:
        f, label = self.f, req.priority.label
        self._last_token.pop(req.request_id, None)
        reason = req.finish_reason or "unknown"
        out = req.num_output_tokens
        f.finished.labels(label, reason).inc()
        f.tokens_out.labels(label).inc(out)
        f.v_generation.labels().inc(out)
        tenant = req.tenant if req.tenant in self.tenants else OTHER_TENANT
        f.tenant_in.labels(tenant).inc(req.num_prompt_tokens)
        f.tenant_out.labels(tenant).inc(out)
        if reason in ("stop", "length", "abort"):
            f.v_success.labels(reason).inc()
        f.prompt_hist.labels(label).observe(req.num_prompt_tokens)
        f.generation_hist.labels(label).observe(out)
        f.v_prompt_hist.labels().observe(req.num_prompt_tokens)
        f.v_generation_hist.labels().observe(out)
        if req.length_observed and req.predicted_output is not None:
            f.length_error.labels(label).observe(abs(out - req.predicted_output))
        end, first, sched = req.finished_time, req.first_token_time, req.first_scheduled_time
        if end is not None:
            f.e2e.labels(label).observe(end - req.arrival_time)
            f.v_e2e.labels().observe(end - req.arrival_time)
            if first is not None:
                f.decode_time.labels(label).observe(end - first)
                f.v_decode.labels().observe(end - first)
            if sched is not None:
                f.inference_time.labels(label).observe(end - sched)
                f.v_inference.labels().observe(end - sched)
            if first is not None and out > 1:
                per = (end - first) / (out - 1)
                f.tpot.labels(label).observe(per)
                f.v_tpot.labels().observe(per)
        self._sla(req)

    def _sla(self, req: RequestInfo) -> None:
        p = req.priority
        sla = self.priorities.sla(p)
        if sla is None or req.finish_reason is None:
            return
        self.f.sla_total.labels(p.label, p.tier).inc()
        first = req.first_token_time
        met = first is not None and first - req.arrival_time <= sla
        if met:
            self.f.sla_met.labels(p.label, p.tier).inc()
        now = req.finished_time if req.finished_time is not None else req.arrival_time
        self._sla_window[p].add(now, float(met), 1.0)
        self.f.sla_attainment.labels(p.label, p.tier).set(self._sla_window[p].value(now))

    def on_ended_late(self, req: RequestInfo) -> None:
        """The SLA re-check ended a waiting request (engine thread)."""
        self.f.sla_ended.labels(req.priority.label).inc()

    def on_preempted(self, victim_priority: Priority, reason: str, n: int = 1) -> None:
        self.f.preemptions.labels(victim_priority.label, reason).inc(n)
        self.f.v_preemptions.labels().inc(n)

    # -- the engine thread: steps and snapshots -------------------------------------------
    def on_step(self, stats: StepStats, swap_seconds: tuple[float, float]) -> None:
        """After each step that ran something."""
        f = self.f
        for p in stats.preemptions:
            self.on_preempted(p.priority, p.mode)
        f.schedule_time.labels().observe(stats.schedule_s)
        if stats.cut_in:
            f.cut_ins.labels().inc()
        f.iteration_tokens.labels().observe(stats.num_tokens)
        f.v_iteration.labels().observe(stats.num_tokens)
        if stats.swapped_in_blocks:
            f.swap.labels("in").observe(swap_seconds[0])
        if stats.swapped_out_blocks:
            f.swap.labels("out").observe(swap_seconds[1])
        if stats.spec is not None:
            self._spec(stats.spec)

    def _spec(self, spec: SpecStepStats) -> None:
        f = self.f
        for q in ALL_PRIORITIES:
            drafted, accepted, emitted, verifications = spec.step[q]
            if not verifications:
                continue
            f.spec_draft.labels(q.label).inc(drafted)
            f.spec_accepted.labels(q.label).inc(accepted)
            f.spec_emitted.labels(q.label).inc(emitted)
            f.v_spec_drafts.labels().inc(verifications)
            f.v_spec_draft_tokens.labels().inc(drafted)
            f.v_spec_accepted.labels().inc(accepted)
            total = spec.total[q]
            f.spec_acceptance.labels(q.label).set(total[1] / total[0] if total[0] else 0.0)

    def on_snapshot(self, snap: EngineSnapshot) -> None:
        """Gauges (and prefix-cache counters) from the engine's published snapshot: after every
        step, batch of commands and idle tick, so they follow aborts even when no step runs."""
        f, kv = self.f, snap.kv
        for q in ALL_PRIORITIES:
            f.running.labels(q.label).set(snap.running[q])
            f.waiting.labels(q.label).set(snap.waiting[q])
            f.queue_depth.labels(q.label).set(snap.waiting[q])
        f.v_running.labels().set(snap.num_running)
        f.v_waiting.labels().set(sum(snap.waiting))
        f.swapped.labels().set(snap.swapped)
        self._prefix_counters(kv.prefix_queries, kv.prefix_hits, snap.taken_at)
        self._window_gauges(snap.taken_at)
        part = kv.partitions
        f.kv_blocks.labels("floor", "used").set(part.floor_used)
        f.kv_blocks.labels("floor", "free").set(part.floor - part.floor_used)
        f.kv_blocks.labels("reserve", "used").set(part.reserve_used)
        f.kv_blocks.labels("reserve", "free").set(part.reserve - part.reserve_used)
        f.kv_blocks.labels("reserve", "borrowed").set(part.borrowed)
        f.kv_blocks.labels("shared", "used").set(part.shared_used)
        f.kv_blocks.labels("shared", "free").set(part.shared - part.shared_used)
        f.kv_usage.labels().set(kv.usage)
        f.v_kv_usage.labels().set(kv.usage)

    def _window_gauges(self, now: float) -> None:
        """The ratio gauges as of `now`: events older than the window drop out even when
        nothing happens (snapshots come at least every idle tick)."""
        for q in ALL_PRIORITIES:
            self.f.hit_rate.labels(q.label).set(self._hits[q].value(now))
            self.f.sla_attainment.labels(q.label, q.tier).set(self._sla_window[q].value(now))

    def _prefix_counters(self, queries: tuple[int, ...], hits: tuple[int, ...], now: float) -> None:
        seen_q, seen_h = self._prefix_seen
        for q in ALL_PRIORITIES:
            dq, dh = queries[q] - seen_q[q], hits[q] - seen_h[q]
            self._hits[q].add(now, dh, dq)
            if dq:
                self.f.prefix_queries.labels(q.label).inc(dq)
                self.f.v_prefix_queries.labels().inc(dq)
            if dh:
                self.f.prefix_hits.labels(q.label).inc(dh)
                self.f.v_prefix_hits.labels().inc(dh)
            seen_q[q], seen_h[q] = queries[q], hits[q]

    def render(self) -> bytes:
        return generate_latest(self.registry)
