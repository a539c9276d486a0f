"""Per-class and total figures of one run, measured over requests that arrived in the
measurement window [warmup, duration).

A record is one attempt: a refused client's retry is a record of its own (`attempt` > 0). So
`requests` counts arrivals (retries included), `refused` the attempts refused, `retries` the
attempts that were retries. `sla_attainment` is over *admitted* requests only (served in their
own class: not refused, not demoted): the share whose first token came within the class's SLA
(a request ended early by the SLA re-check counts as a miss); `sla_attainment_all` counts every
attempt that ended, refusals as misses. `goodput_requests_per_s`: admitted requests that met the
SLA (P3, with none: completed), per second of the window.
"""

from __future__ import annotations

from tierserve.config import PriorityConfig
from tierserve.priority import Priority
from tierserve.sim.engine.driver import DriveResult, RequestRecord

GOODPUT_CLASSES = (Priority.P0, Priority.P1, Priority.P2)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(-(-q * len(v) // 100)) - 1))
    return v[k]


def _met(r: RequestRecord, sla: float | None) -> bool:
    if r.first_token is None or r.outcome in ("rejected", "ended_early") or r.demoted:
        return False
    return sla is None or r.first_token - r.arrival <= sla


def class_stats(result: DriveResult, prio: Priority, lo: float, hi: float, sla: float | None):
    recs = [r for r in result.records if r.priority == prio and lo <= r.arrival < hi]
    done = [r for r in recs if r.outcome == "completed"]
    own = [r for r in recs if not r.demoted]  # served in their own class
    ttft = [r.first_token - r.arrival for r in own if r.first_token is not None]
    e2e = [r.finish - r.arrival for r in done]
    tpot = [(r.finish - r.first_token) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    counted = [r for r in recs if r.outcome != "pending"]
    admitted = [r for r in counted if r.outcome != "rejected" and not r.demoted]
    met = sum(1 for r in admitted if _met(r, sla))
    err = [
        abs(r.first_token - r.arrival - r.predicted_ttft)
        for r in own
        if r.first_token is not None and r.predicted_ttft is not None
    ]
    refused = sum(1 for r in recs if r.outcome == "rejected")
    return {
        "requests": len(recs),
        "completed": len(done),
        "rejected": refused,
        "refused": refused,
        "retries": sum(1 for r in recs if r.attempt > 0),
        "demoted": sum(1 for r in recs if r.demoted),
        "ended_early": sum(1 for r in recs if r.outcome == "ended_early"),
        "failed": sum(1 for r in recs if r.outcome == "failed"),
        "unfinished": sum(1 for r in recs if r.outcome == "pending"),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else None,
        "ttft_max_s": max(ttft) if ttft else None,  # the worst wait for a first token
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p95_s": percentile(tpot, 95),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p95_s": percentile(e2e, 95),
        "sla_s": sla,
        "sla_attainment": (met / len(admitted)) if admitted else None,
        "sla_attainment_all": (met / len(counted)) if counted else None,
        "goodput_requests_per_s": met / (hi - lo),
        "ttft_prediction_abs_error_p50_s": percentile(err, 50),
        "ttft_prediction_abs_error_p90_s": percentile(err, 90),
        "preemptions": sum(r.preemptions for r in recs),
    }


def run_stats(result: DriveResult, lo: float, hi: float, priorities: PriorityConfig) -> dict:
    classes = {p.label: class_stats(result, p, lo, hi, priorities.sla(p)) for p in Priority}
    window = [s for s in result.samples if lo <= s.time < hi]
    tokens = sum(s.tokens_out for s in window)
    arrivals = sum(c["requests"] for c in classes.values())
    retries = sum(c["retries"] for c in classes.values())
    return {
        "classes": classes,
        "throughput_tokens_per_s": tokens / (hi - lo),
        "throughput_total_tokens_per_s": sum(s.tokens_total for s in window) / (hi - lo),
        "goodput_requests_per_s": sum(
            classes[p.label]["goodput_requests_per_s"] for p in GOODPUT_CLASSES
        ),
        "completed": sum(c["completed"] for c in classes.values()),
        "rejected": sum(c["rejected"] for c in classes.values()),
        "refused": sum(c["refused"] for c in classes.values()),
        "retries": retries,
        "retry_share": retries / arrivals if arrivals else 0.0,
        "demoted": sum(c["demoted"] for c in classes.values()),
        "ended_early": sum(c["ended_early"] for c in classes.values()),
        "failed": sum(c["failed"] for c in classes.values()),
        "unfinished": sum(c["unfinished"] for c in classes.values()),
        "kv_usage_mean": (sum(s.kv_usage for s in window) / len(window)) if window else 0.0,
    }
