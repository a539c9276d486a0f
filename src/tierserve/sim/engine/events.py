"""A timed event queue whose order at equal times is explicit (vidur's heap keys on
(time, id, type), so the type order it documents never applies; here the order is the key):

1. earlier time first;
2. at equal times, lower ``EventKind`` first: finishing work frees memory and seats before new
   arrivals ask for them (``COMPLETION`` < ``ARRIVAL``);
3. then insertion order.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import Any


class EventKind(IntEnum):
    COMPLETION = 0
    ARRIVAL = 1


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()

    def push(self, time: float, kind: EventKind, payload: Any = None) -> None:
        heapq.heappush(self._heap, (time, int(kind), next(self._seq), payload))

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[tuple[float, EventKind, Any]]:
        """Every event with time <= now, in queue order."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            t, k, _, p = heapq.heappop(self._heap)
            out.append((t, EventKind(k), p))
        return out

    def __len__(self) -> int:
        return len(self._heap)
