"""Prometheus metrics with priority labels. Each server owns its registry (no process globals);
every layer reports through ``Metrics``, none depends on it for logic."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tierserve.config import PriorityConfig
from tierserve.engine.core import StepStats
from tierserve.engine.snapshot import EngineSnapshot
from tierserve.priority import ALL_PRIORITIES, Priority
from tierserve.request import Request

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
STEP_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05, 0.1, 0.5)
PARTITIONS = ("floor", "reserve", "shared")


class Metrics:
    def __init__(self, priorities: PriorityConfig | None = None) -> None:
        self.priorities = priorities or PriorityConfig()
        self.registry = r = CollectorRegistry()
        p = ["priority"]
        self.queue_depth = Gauge("llm_scheduler_queue_depth", "Waiting requests", p, registry=r)
        self.wait = Histogram(
            "llm_scheduler_wait_seconds",
            "Queue time: arrival to first scheduled",
            p,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.hit_rate = Gauge("llm_kv_cache_hit_rate", "Prefix-cache token hit rate", p, registry=r)
        self.preemptions = Counter(
            "llm_preemption_total", "Preempted requests", ["victim_priority", "reason"], registry=r
        )
        self.sla = Gauge(
            "llm_sla_attainment",
            "Finished requests whose TTFT met the class SLA",
            ["priority", "tier"],
            registry=r,
        )
        self.swap = Histogram(
            "llm_kv_swap_seconds",
            "KV swap copy time per step",
            ["direction"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "llm_ttft_seconds", "Time to first token", p, buckets=LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "llm_time_per_output_token_seconds",
            "Time per output token after the first",
            p,
            buckets=(*STEP_BUCKETS, 1.0, 2.0),
            registry=r,
        )
        self.e2e = Histogram(
            "llm_e2e_seconds", "Arrival to finish", p, buckets=LATENCY_BUCKETS, registry=r
        )
        self.tokens_in = Counter("llm_prompt_tokens_total", "Prompt tokens", p, registry=r)
        self.tokens_out = Counter("llm_generation_tokens_total", "Generated tokens", p, registry=r)
        self.finished = Counter(
            "llm_requests_total", "Ended requests", ["priority", "finish_reason"], registry=r
        )
        self.running = Gauge("llm_requests_running", "Running requests", p, registry=r)
        self.waiting = Gauge("llm_requests_waiting", "Waiting requests", p, registry=r)
        self.swapped = Gauge("llm_requests_swapped", "Requests swapped to host memory", registry=r)
        self.kv_blocks = Gauge(
            "llm_kv_blocks", "KV blocks per partition", ["partition", "state"], registry=r
        )
        self.kv_usage = Gauge("llm_kv_cache_usage", "Fraction of KV blocks in use", registry=r)
        self.schedule_time = Histogram(
            "llm_schedule_seconds", "Scheduler time per step", buckets=STEP_BUCKETS, registry=r
        )
        self.rejections = Counter(
            "llm_admission_rejections_total",
            "Requests refused before the queue",
            ["reason", "priority"],
            registry=r,
        )
        self._sla_met = {q: 0 for q in ALL_PRIORITIES}
        self._sla_total = {q: 0 for q in ALL_PRIORITIES}
        for q in ALL_PRIORITIES:  # make every labelled series visible from the start
            for m in (self.queue_depth, self.hit_rate, self.running, self.waiting):
                m.labels(q.label)
            self.sla.labels(q.label, q.tier)
        for part in PARTITIONS:
            for state in ("used", "free"):
                self.kv_blocks.labels(part, state)
        self.kv_blocks.labels("reserve", "borrowed")

    # -- events -------------------------------------------------------------------------------
    def on_rejected(self, kind: str, priority: Priority) -> None:
        self.rejections.labels(kind, priority.label).inc()

    def on_first_token(self, req: Request) -> None:
        label = req.base_priority.label
        ttft = req.first_token_time - req.arrival_time
        self.ttft.labels(label).observe(ttft)
        if req.first_scheduled_time is not None:
            self.wait.labels(label).observe(req.first_scheduled_time - req.arrival_time)
        self.tokens_in.labels(label).inc(req.num_prompt_tokens)

    def on_finished(self, req: Request) -> None:
        label = req.base_priority.label
        reason = req.finish_reason.value if req.finish_reason else "unknown"
        self.finished.labels(label, reason).inc()
        self.tokens_out.labels(label).inc(req.num_output_tokens)
        if req.finished_time is not None:
            self.e2e.labels(label).observe(req.finished_time - req.arrival_time)
        if req.first_token_time is not None and req.finished_time and req.num_output_tokens > 1:
            per = (req.finished_time - req.first_token_time) / (req.num_output_tokens - 1)
            self.tpot.labels(label).observe(per)
        sla = self.priorities.sla(req.base_priority)
        if sla is not None and req.finish_reason is not None:
            p = req.base_priority
            self._sla_total[p] += 1
            if req.first_token_time is not None and req.first_token_time - req.arrival_time <= sla:
                self._sla_met[p] += 1
            self.sla.labels(p.label, p.tier).set(self._sla_met[p] / self._sla_total[p])

    def on_step(self, stats: StepStats, swap_seconds: tuple[float, float]) -> None:
        """Called from the engine thread after each step that ran something."""
        self.schedule_time.observe(stats.schedule_s)
        if stats.swapped_in_blocks:
            self.swap.labels("in").observe(swap_seconds[0])
        if stats.swapped_out_blocks:
            self.swap.labels("out").observe(swap_seconds[1])

    def on_snapshot(self, snap: EngineSnapshot) -> None:
        """Gauges from the engine's published snapshot (after every step, batch of commands
        and idle tick), so they follow aborts and drains even when no step runs."""
        kv = snap.kv
        for q in ALL_PRIORITIES:
            self.running.labels(q.label).set(snap.running[q])
            self.waiting.labels(q.label).set(snap.waiting[q])
            self.queue_depth.labels(q.label).set(snap.waiting[q])
            self.hit_rate.labels(q.label).set(kv.hit_rate(q))
        self.swapped.set(snap.swapped)
        part = kv.partitions
        self.kv_blocks.labels("floor", "used").set(part.floor_used)
        self.kv_blocks.labels("floor", "free").set(part.floor - part.floor_used)
        self.kv_blocks.labels("reserve", "used").set(part.reserve_used)
        self.kv_blocks.labels("reserve", "free").set(part.reserve - part.reserve_used)
        self.kv_blocks.labels("reserve", "borrowed").set(part.borrowed)
        self.kv_blocks.labels("shared", "used").set(part.shared_used)
        self.kv_blocks.labels("shared", "free").set(part.shared - part.shared_used)
        self.kv_usage.set(kv.usage)

    def on_preempted(self, victim_priority: Priority, reason: str, n: int = 1) -> None:
        self.preemptions.labels(victim_priority.label, reason).inc(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
