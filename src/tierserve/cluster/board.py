"""The fleet board as a Ray Serve deployment (one replica): engine replicas push their load and
metrics, the ingress pulls the view (fleet.py). Its methods are coroutines, so they all run on
the replica's one event loop and never race on the board's state."""

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
    ) -> None:
        self._board.report(replica_id, load, metrics, time.monotonic(), signals)

    async def leave(self, replica_id: str) -> None:
        self._board.leave(replica_id)

    async def view(self) -> dict[str, Any]:
        return self._board.view(time.monotonic())
