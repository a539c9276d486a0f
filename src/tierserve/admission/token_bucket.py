"""Token bucket with continuous refill, driven by the caller's clock readings."""

from __future__ import annotations

import math

from tierserve.config import BucketConfig


class TokenBucket:
    def __init__(self, config: BucketConfig, now: float) -> None:
        self.rate = config.rate
        self.burst = config.burst
        self._tokens = config.burst
        self._last = now

    def level(self, now: float) -> float:
        """Tokens available at `now` (refills `rate` per second, capped at `burst`)."""
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
        return self._tokens

    def need(self, cost: float, keep: float = 0.0) -> float:
        """The level at which `cost` may be taken by a caller that must leave `keep` tokens:
        `cost + keep`, but never more than the burst (a large request waits for a full bucket
        rather than never passing)."""
        return min(cost + keep, self.burst) if cost <= self.burst else math.inf

    def wait_for(self, cost: float, now: float, keep: float = 0.0) -> float:
        """Seconds until `cost` tokens may be taken leaving `keep` (see `need`; 0 if now; inf if
        cost exceeds burst)."""
        missing = self.need(cost, keep) - self.level(now)
        if math.isinf(missing):
            return math.inf
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, cost: float, now: float, keep: float = 0.0) -> None:
        level = self.level(now)
        if self.need(cost, keep) > level:
            raise ValueError(f"bucket holds {level:.1f} tokens, cannot take {cost} keeping {keep}")
        self._tokens = level - cost
