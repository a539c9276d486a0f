"""The Batch API's metric series, registered beside the server's `llm_*` ones."""

from __future__ import annotations

from prometheus_client import Counter, Gauge


class BatchMetrics:
    def __init__(self, registry) -> None:
        self.lines = Counter(
            "llm_batch_lines",
            "Batch lines by outcome: ok, error (answered 4xx/5xx), refused (admission said "
            "later: run again), retried (a server error: run again)",
            ["outcome"],
            registry=registry,
        )
        self.batches = Counter(
            "llm_batches_finished",
            "Batches that reached a terminal status",
            ["status"],
            registry=registry,
        )
        self.at_risk = Gauge(
            "llm_batches_at_risk",
            "Batches in progress projected to finish after their completion window",
            registry=registry,
        )
        self.in_flight = Gauge(
            "llm_batch_lines_in_flight", "Batch lines submitted and not finished", registry=registry
        )
        for outcome in ("ok", "error", "refused", "retried"):
            self.lines.labels(outcome)
        for status in ("completed", "expired", "cancelled", "failed"):
            self.batches.labels(status)
