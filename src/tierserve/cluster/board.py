"""The fleet board as a Ray Serve deployment (one replica): engine replicas push their load and
metrics and get the ingress's held backlog back; the ingress pushes that backlog and pulls the
view (fleet.py). Its methods are coroutines, so they all run on the replica's one event loop
and never race on the board's state."""

from __future__ import annotations

import time
from typing import Any

from tierserve.cluster.fleet import EXPIRE_S, FleetBoard


class Board:
    def __init__(self, expire_s: float = EXPIRE_S) -> None:
        self._board = FleetBoard(expire_s)

    async def report(
        self,
        replica_id: str,
        load: dict[str, Any],
        metrics: str | None,
        signals: dict[str, float] | None = None,
    ) -> dict[str, float]:
        """An engine replica's report; the reply is the ingress's held backlog."""
        now = time.monotonic()
        self._board.report(replica_id, load, metrics, now, signals)
        return self._board.held(now)

    async def report_held(self, ingress_id: str, held: dict[str, float]) -> None:
        self._board.report_held(ingress_id, held, time.monotonic())

    async def leave(self, replica_id: str) -> None:
        self._board.leave(replica_id)

    async def view(self) -> dict[str, Any]:
        return self._board.view(time.monotonic())
