"""Per-class and total figures of one run, measured over requests that arrived in the
measurement window [warmup, duration)."""

from __future__ import annotations

from tierserve.config import PriorityConfig
from tierserve.priority import Priority
from tierserve.sim.driver import DriveResult


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(-(-q * len(v) // 100)) - 1))
    return v[k]


def class_stats(result: DriveResult, prio: Priority, lo: float, hi: float, sla: float | None):
    recs = [r for r in result.records if r.priority == prio and lo <= r.arrival < hi]
    done = [r for r in recs if r.outcome == "completed"]
    ttft = [r.first_token - r.arrival for r in recs if r.first_token is not None]
    e2e = [r.finish - r.arrival for r in done]
    tpot = [(r.finish - r.first_token) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    counted = [r for r in recs if r.outcome != "pending"]
    met = sum(
        1
        for r in counted
        if r.first_token is not None
        and (sla is None or r.first_token - r.arrival <= sla)
        and r.outcome != "rejected"
    )
    return {
        "requests": len(recs),
        "completed": len(done),
        "rejected": sum(1 for r in recs if r.outcome == "rejected"),
        "failed": sum(1 for r in recs if r.outcome == "failed"),
        "unfinished": sum(1 for r in recs if r.outcome == "pending"),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p95_s": percentile(tpot, 95),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p95_s": percentile(e2e, 95),
        "sla_s": sla,
        "sla_attainment": (met / len(counted)) if counted else None,
        "preemptions": sum(r.preemptions for r in recs),
    }


def run_stats(result: DriveResult, lo: float, hi: float, priorities: PriorityConfig) -> dict:
    classes = {p.label: class_stats(result, p, lo, hi, priorities.sla(p)) for p in Priority}
    window = [s for s in result.samples if lo <= s.time < hi]
    tokens = sum(s.tokens_out for s in window)
    return {
        "classes": classes,
        "throughput_tokens_per_s": tokens / (hi - lo),
        "throughput_total_tokens_per_s": sum(s.tokens_total for s in window) / (hi - lo),
        "completed": sum(c["completed"] for c in classes.values()),
        "rejected": sum(c["rejected"] for c in classes.values()),
        "failed": sum(c["failed"] for c in classes.values()),
        "unfinished": sum(c["unfinished"] for c in classes.values()),
        "kv_usage_mean": (sum(s.kv_usage for s in window) / len(window)) if window else 0.0,
    }
