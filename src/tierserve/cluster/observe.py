"""The ingress's ``/metrics``: the cluster, one replica per ``replica`` label.

Every engine replica keeps its own ``Metrics`` registry (the single-process server's metric
names: TTFT, queue depth, KV blocks, preemptions, SLA attainment...) and pushes its text to the
fleet board about once a second. The ingress re-exposes each family once, with every replica's
samples labelled ``replica="<Serve replica id>"``; sums across replicas are left to the
Prometheus query (``sum without (replica) (...)``), which keeps histograms exact. Its own
families come first: admission rejections (the ingress admits), routing decisions by reason,
replica failures seen by streams, the number of live replicas, and the requests waiting in the
ingress queue by class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tierserve.priority import Priority

# Families the ingress owns; the copies in the replicas' texts (always zero there) are dropped.
INGRESS_FAMILIES = ("llm_admission_rejections",)


class ReplicaCollector:
    """Collects the replicas' metric texts (``source()``: replica id -> exposition text) as
    families with a ``replica`` label."""

    def __init__(self, source: Callable[[], dict[str, str]], exclude=INGRESS_FAMILIES) -> None:
        self.source = source
        self.exclude = {n for base in exclude for n in (base, f"{base}_created")}

    def describe(self) -> list:
        return []  # unknown until replicas report; no name clash checks at registration

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for rid, text in sorted(self.source().items()):
            for f in text_string_to_metric_families(text):
                if f.name in self.exclude:
                    continue
                m = families.get(f.name)
                if m is None:
                    m = families[f.name] = Metric(f.name, f.documentation, f.type, f.unit)
                for s in f.samples:
                    m.add_sample(s.name, {**s.labels, "replica": rid}, s.value, s.timestamp)
        yield from families.values()


class IngressMetrics:
    """What ``ServerState.metrics`` is on a cluster ingress (``on_rejected`` and ``render``,
    as the API layer uses them), plus routing and failure counters."""

    def __init__(
        self,
        replica_texts: Callable[[], dict[str, str]],
        ingress_queued: Callable[[Priority], int] | None = None,
    ) -> None:
        """`ingress_queued`: requests of a class waiting in the ingress queue (None: no
        queue, the gauge stays 0)."""
        self.registry = r = CollectorRegistry()
        self.rejections = Counter(
            "llm_admission_rejections_total",
            "Requests refused before the queue",
            ["reason", "priority"],
            registry=r,
        )
        self.routed = Counter(
            "tierserve_routed_requests_total",
            "Requests sent to an engine replica, by the reason the router ranked it there",
            ["replica", "reason"],
            registry=r,
        )
        self.failures = Counter(
            "tierserve_replica_failures_total",
            "Streams whose replica failed: retried elsewhere (no token sent yet) or ended with "
            "an error (tokens already sent)",
            ["outcome"],
            registry=r,
        )
        self.replicas = Gauge(
            "tierserve_replicas", "Engine replicas reporting to the fleet board", registry=r
        )
        self.ingress_queue = Gauge(
            "tierserve_ingress_queue_depth",
            "Requests waiting at the ingress for a free seat (--ingress-queue on), by class",
            ["priority"],
            registry=r,
        )
        for p in Priority:
            g = self.ingress_queue.labels(p.label)
            if ingress_queued is not None:
                g.set_function(partial(ingress_queued, p))
        for outcome in ("retried", "ended"):
            self.failures.labels(outcome)
        r.register(ReplicaCollector(replica_texts))

    def on_rejected(self, kind: str, priority: Priority) -> None:
        self.rejections.labels(kind, priority.label).inc()

    def on_routed(self, replica: str, reason: str) -> None:
        self.routed.labels(replica, reason).inc()

    def on_replica_failure(self, retried: bool) -> None:
        self.failures.labels("retried" if retried else "ended").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
