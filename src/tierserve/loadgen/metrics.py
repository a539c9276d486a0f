"""Figures from request records: pure functions of the recorded times, so every figure can be
checked exactly (tests/test_loadgen_metrics.py). Field names follow the simulator's
(`sim/stats.py`) where they mean the same thing.

Definitions (seconds, times from the run's origin):
- TTFT = first text chunk - send; ITL = gaps between successive text chunks (a chunk carrying
  several tokens is one gap, as `vllm bench serve` counts); TPOT = (finish - first chunk) /
  (output tokens - 1) for completed requests with more than one token; E2E = finish - send.
- Latencies are over measured requests (not warm-up); nearest-rank percentiles, the
  simulator's `percentile`.
- SLA attainment, counted as the simulator does: of the measured requests that ended (not
  `unfinished`), the share that got a first token within their class's TTFT SLA and were not
  refused (a class with no SLA: any first token counts).
- Goodput (DistServe): measured requests that completed and met all their SLOs (the TTFT SLA of
  their class; the TPOT SLO when one is set), per second of the window.
- Throughput: tokens that arrived inside the window [lo, hi], per second, from every request
  (warm-up included: its tokens are real load). A request's output tokens are spread evenly
  over its text chunks (usage may count more tokens than chunks); its prompt tokens count when
  its first chunk arrives (the prefill is done then).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from itertools import pairwise

from tierserve.loadgen.client import RequestRecord
from tierserve.sim.engine.stats import percentile

CLASSES = ("P0", "P1", "P2", "P3")
Window = tuple[float, float]


def ttft(r: RequestRecord) -> float | None:
    return None if r.first_token is None else r.first_token - r.arrival


def itls(r: RequestRecord) -> list[float]:
    t = r.chunk_times
    return [b - a for a, b in pairwise(t)]


def tpot(r: RequestRecord) -> float | None:
    if r.outcome != "completed" or r.output_tokens < 2 or r.first_token is None:
        return None
    return (r.finish - r.first_token) / (r.output_tokens - 1)


def e2e(r: RequestRecord) -> float | None:
    return r.finish - r.arrival if r.outcome == "completed" else None


def tokens_in_window(r: RequestRecord, lo: float, hi: float) -> tuple[float, float]:
    """(output tokens, prompt + output tokens) of `r` that arrived in [lo, hi]."""
    n = len(r.chunk_times)
    if n == 0:
        return 0.0, 0.0
    inside = sum(1 for t in r.chunk_times if lo <= t <= hi)
    out = r.output_tokens * inside / n
    prompt = r.prompt_tokens if lo <= r.chunk_times[0] <= hi else 0
    return out, out + prompt


def meets_slos(r: RequestRecord, ttft_sla: float | None, tpot_slo: float | None) -> bool:
    if r.outcome != "completed" or r.first_token is None:
        return False
    if ttft_sla is not None and ttft(r) > ttft_sla:
        return False
    t = tpot(r)
    return tpot_slo is None or t is None or t <= tpot_slo


def met_ttft_sla(r: RequestRecord, sla: float | None) -> bool:
    return r.first_token is not None and r.outcome != "rejected" and (sla is None or ttft(r) <= sla)


def _dist(name: str, values: list[float]) -> dict:
    return {
        f"{name}_mean_s": sum(values) / len(values) if values else None,
        f"{name}_p50_s": percentile(values, 50),
        f"{name}_p95_s": percentile(values, 95),
        f"{name}_p99_s": percentile(values, 99),
    }


def _rate(x: float, window: Window | None) -> float | None:
    if window is None or window[1] <= window[0]:
        return None
    return x / (window[1] - window[0])


def group_stats(
    records: Iterable[RequestRecord],
    window: Window | None,
    sla_of: Callable[[int], float | None],
    tpot_slo_of: Callable[[int], float | None],
) -> dict:
    """Figures of one group of requests (a class, or all); `records` includes warm-up ones."""
    allr = list(records)
    recs = [r for r in allr if r.measured]
    done = [r for r in recs if r.outcome == "completed"]
    counted = [r for r in recs if r.outcome != "unfinished"]
    met = sum(1 for r in counted if met_ttft_sla(r, sla_of(r.priority)))
    good = sum(1 for r in done if meets_slos(r, sla_of(r.priority), tpot_slo_of(r.priority)))
    lo, hi = window if window else (0.0, -1.0)
    toks = [tokens_in_window(r, lo, hi) for r in allr]
    refused = [r for r in recs if r.outcome == "rejected"]
    failed = [r for r in recs if r.outcome == "failed"]
    retry = [r.retry_after for r in refused if r.retry_after is not None]
    return {
        "requests": len(recs),
        "completed": len(done),
        "rejected": len(refused),
        "failed": len(failed),
        "unfinished": sum(1 for r in recs if r.outcome == "unfinished"),
        **_dist("ttft", [ttft(r) for r in recs if r.first_token is not None]),
        **_dist("itl", [g for r in recs for g in itls(r)]),
        **_dist("tpot", [t for r in done if (t := tpot(r)) is not None]),
        **_dist("e2e", [e2e(r) for r in done]),
        "sla_attainment": met / len(counted) if counted else None,
        "goodput_requests_per_s": _rate(good, window),
        "request_throughput_per_s": _rate(len(done), window),
        "throughput_tokens_per_s": _rate(sum(t[0] for t in toks), window),
        "throughput_total_tokens_per_s": _rate(sum(t[1] for t in toks), window),
        "input_tokens": sum(r.prompt_tokens for r in done),
        "output_tokens": sum(r.output_tokens for r in done),
        "refusals_by_status": dict(sorted(Counter(str(r.status) for r in refused).items())),
        "errors": dict(sorted(Counter(_error_kind(r) for r in failed).items())),
        "retry_after_p50_s": percentile(retry, 50),
        "retry_after_max_s": max(retry) if retry else None,
    }


def _error_kind(r: RequestRecord) -> str:
    if r.status is not None and r.status != 200:
        return str(r.status)
    err = r.error or ""
    for kind in ("cannot connect", "malformed", "truncated", "error event", "timed out"):
        if err.startswith(kind):
            return kind.replace(" ", "_")
    return "stream_broken"


def run_stats(
    records: list[RequestRecord],
    window: Window | None,
    ttft_sla: tuple[float | None, ...],
    tpot_slo: tuple[float | None, ...] = (None,) * 4,
) -> dict:
    """Per class and overall; the overall figures sit at the top level too, under the
    simulator's names (`throughput_tokens_per_s`, `completed`, ...)."""

    def sla_of(p: int) -> float | None:
        return ttft_sla[p]

    def tpot_of(p: int) -> float | None:
        return tpot_slo[p]

    classes = {
        f"P{p}": group_stats([r for r in records if r.priority == p], window, sla_of, tpot_of)
        for p in range(4)
    }
    for p, c in enumerate(classes.values()):
        c["sla_s"], c["tpot_slo_s"] = ttft_sla[p], tpot_slo[p]
    overall = group_stats(records, window, sla_of, tpot_of)
    keys = ("completed", "rejected", "failed", "unfinished", "goodput_requests_per_s")
    keys += ("throughput_tokens_per_s", "throughput_total_tokens_per_s", "request_throughput_per_s")
    return {
        "window_s": None if window is None else [window[0], window[1]],
        "classes": classes,
        "overall": overall,
        **{k: overall[k] for k in keys},
    }
