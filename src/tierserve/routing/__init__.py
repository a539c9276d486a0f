"""Routing requests over engine replicas (torch-, Ray- and FastAPI-free): the stats a replica
reports, the priority-aware ranking, and the baselines it is compared with. The Ray Serve
router and the fleet simulator both call ``rank_replicas``."""

from tierserve.routing.baselines import ROUTER_NAMES, Router, make_router
from tierserve.routing.rank import DEFAULT_ROUTING, Choice, RoutingConfig, rank_replicas
from tierserve.routing.stats import replica_stats
from tierserve.routing.types import ReplicaStats, RouteRequest, prefix_hashes

__all__ = [
    "DEFAULT_ROUTING",
    "ROUTER_NAMES",
    "Choice",
    "ReplicaStats",
    "RouteRequest",
    "Router",
    "RoutingConfig",
    "make_router",
    "prefix_hashes",
    "rank_replicas",
    "replica_stats",
]
