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

    def wait_for(self, cost: float, now: float) -> float:
        """Seconds until `cost` tokens are available (0 if now; inf if cost exceeds burst)."""
        if cost > self.burst:
            return math.inf
        missing = cost - self.level(now)
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, cost: float, now: float) -> None:
        level = self.level(now)
        if cost > level:
            raise ValueError(f"bucket holds {level:.1f} tokens, cannot take {cost}")
        self._tokens = level - cost
