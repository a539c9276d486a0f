"""The Ray Serve request router of the engine deployment: ranks replicas with
``tierserve.routing.make_router(name)`` -- for ``priority-aware``, ``rank_replicas``, the same pure
function the fleet simulator calls -- on the ``ReplicaStats`` each replica reports through
``record_routing_stats``.

Each handle (one per ingress replica, or per driver) holds one router. For a request it reads
the payload's ``route`` (wire.py: the RouteRequest computed at the ingress, replicas to avoid,
an optional pin), ranks the replicas that have reported stats, and returns them one per rank,
best first; Ray Serve sends the request to the first whose ``max_ongoing_requests`` is not
reached. Replicas that have not reported yet (just started) follow, then the avoided ones
(a retry after a failure avoids the replica that failed; a replica Serve knows is dead is not a
candidate at all). A pinned request goes only to its replica while that replica is a candidate.
The router writes its ranking into the payload so the chosen replica can report the reason.

Stats are as old as the report period (``request_routing_stats_period_s``) plus the controller's
broadcast; between reports, the router adds the prompt tokens it has itself sent to a replica to
that replica's waiting tokens (``LocalLoad``), so a burst does not all land on the replica that
looked idle in the last report.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from tierserve.cluster import wire
from tierserve.cluster.local_load import LocalLoad
from tierserve.routing import ReplicaStats, RoutingConfig, make_router

log = logging.getLogger("tierserve.cluster")


class TierRequestRouter(RequestRouter):
    def initialize_state(self, router: str = "priority-aware", hold_s: float = 1.0, **config):
        self.router_name = router
        self._rank = make_router(router, RoutingConfig(**config))
        self._local = LocalLoad(hold_s)

    def _stats(self, replica: RunningReplica) -> ReplicaStats | None:
        raw = replica.routing_stats
        if not raw:
            return None
        try:
            return ReplicaStats.from_dict({**raw, "replica_id": replica.replica_id.unique_id})
        except (TypeError, ValueError) as exc:
            log.warning("bad routing stats from %s: %s", replica.replica_id.unique_id, exc)
            return None

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        payload: dict[str, Any] | None = None
        if pending_request is not None and pending_request.args:
            first = pending_request.args[0]
            if isinstance(first, dict) and "route" in first:
                payload = first
        if payload is None:  # not a generate call (spec, ...): any replica will do
            return [[r] for r in candidate_replicas]
        route, avoid, pin = wire.route_of(payload)
        if pin is not None:
            if pin in by_id:
                wire.annotate(payload, [(pin, wire.PINNED)])
                return [[by_id[pin]]]
            return []  # wait (with Serve's backoff) for the pinned replica
        now = time.monotonic()
        stats = [s for r in candidate_replicas if (s := self._stats(r)) is not None]
        stats = [self._local.adjust(s, now) for s in stats if s.replica_id not in avoid]
        ranking = self._rank(route, stats)
        ranked = {rid for rid, _ in ranking}
        rest = sorted(rid for rid in by_id if rid not in ranked and rid not in avoid)
        ranking += [(rid, wire.UNRANKED) for rid in rest]
        ranking += [(rid, "avoided") for rid in sorted(avoid) if rid in by_id]
        # Released from the ingress's wait for room it saw on some replicas: those first (in
        # the ranking's order). The board's view can be fresher than these stats; without this a
        # request let go for a seat that just freed was ranked onto a replica still full.
        prefer = set(wire.prefer_of(payload)) - avoid
        if prefer:
            ranking.sort(key=lambda x: x[0] not in prefer)  # stable
        wire.annotate(payload, ranking)
        if ranking:
            self._local.sent(ranking[0][0], route.prompt_tokens, route.priority, now)
        return [[by_id[rid]] for rid, _ in ranking]

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id.unique_id for r in replicas}
        self._local.forget_except(live)
