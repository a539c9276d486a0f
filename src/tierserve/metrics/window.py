"""A ratio over a sliding time window, for the gauges the seed names (`llm_kv_cache_hit_rate`,
`llm_sla_attainment`): hits / lookups, or met / ended, over the last `window_s` seconds.

Events are kept in arrival order with running sums, so adding one and reading the ratio are
O(1) amortized. One owner thread (the engine thread in the server): no locking.
"""

from __future__ import annotations

from collections import deque

DEFAULT_WINDOW_S = 60.0


class WindowRatio:
    def __init__(self, window_s: float = DEFAULT_WINDOW_S, empty: float = 0.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self.empty = empty  # the value when the window holds nothing
        self._events: deque[tuple[float, float, float]] = deque()
        self._num = 0.0
        self._den = 0.0

    def add(self, t: float, num: float, den: float) -> None:
        """`num` of `den` at time `t` (times must not go backwards)."""
        if den <= 0 and num <= 0:
            return
        self._events.append((t, num, den))
        self._num += num
        self._den += den

    def value(self, now: float) -> float:
        """num / den over (now - window_s, now]; `empty` when nothing is left in the window."""
        horizon = now - self.window_s
        ev = self._events
        while ev and ev[0][0] <= horizon:
            _, num, den = ev.popleft()
            self._num -= num
            self._den -= den
        if not ev or self._den <= 0:
            self._num = self._den = 0.0  # no float drift survives an empty window
            return self.empty
        return self._num / self._den
