"""Routers to compare the priority-aware rule with, and the registry of routers by name.

A router is a callable ``(RouteRequest, Sequence[ReplicaStats]) -> list[(replica_id, reason)]``
ranking every replica, best first. All but round-robin are pure functions of their inputs.

* ``round-robin``: replicas in id order, starting one further at each call.
* ``least-loaded``: the seed design's ``_balance_load``, greedy token balancing: the replica with
  the fewest outstanding tokens (queued plus what running requests still compute).
* ``prefix-only``: the replica holding the longest run of the request's first prompt blocks;
  among equals (and when none holds any), least-loaded. No load margin: hot prefixes pile up.
* ``priority-aware``: ``rank_replicas`` (rank.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from tierserve.routing.rank import DEFAULT_ROUTING, PREFIX, Choice, RoutingConfig, rank_replicas
from tierserve.routing.types import ReplicaStats, RouteRequest

Router = Callable[[RouteRequest, Sequence[ReplicaStats]], list[Choice]]


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def __call__(self, request: RouteRequest, stats: Sequence[ReplicaStats]) -> list[Choice]:
        ids = sorted(s.replica_id for s in stats)
        if not ids:
            return []
        k = self._next % len(ids)
        self._next += 1
        return [(rid, "round-robin") for rid in ids[k:] + ids[:k]]


def least_loaded(request: RouteRequest, stats: Sequence[ReplicaStats]) -> list[Choice]:
    order = sorted(stats, key=lambda s: (s.outstanding_tokens, s.replica_id))
    return [(s.replica_id, "least-loaded") for s in order]


def prefix_only(request: RouteRequest, stats: Sequence[ReplicaStats]) -> list[Choice]:
    scored = sorted(
        ((s.prefix_match(request), s) for s in stats),
        key=lambda x: (-x[0], x[1].outstanding_tokens, x[1].replica_id),
    )
    return [(s.replica_id, PREFIX if m else "no-prefix") for m, s in scored]


ROUTER_NAMES = ("round-robin", "least-loaded", "prefix-only", "priority-aware")


def make_router(name: str, config: RoutingConfig = DEFAULT_ROUTING) -> Router:
    """A fresh router by name (round-robin keeps its own position)."""
    if name == "round-robin":
        return RoundRobin()
    if name == "least-loaded":
        return least_loaded
    if name == "prefix-only":
        return prefix_only
    if name == "priority-aware":
        return functools.partial(rank_replicas, config=config)
    raise ValueError(f"unknown router {name!r}; choose one of {', '.join(ROUTER_NAMES)}")
