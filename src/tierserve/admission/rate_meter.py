"""Measured drain rate: amount per second over fixed windows, smoothed by an EWMA."""

from __future__ import annotations


class RateMeter:
    def __init__(self, window_s: float, alpha: float) -> None:
        self.window_s = window_s
        self.alpha = alpha
        self._start: float | None = None
        self._acc = 0.0
        self._rate: float | None = None

    def add(self, amount: float, now: float) -> None:
        self._roll(now)
        self._acc += amount

    def rate(self, now: float) -> float | None:
        """Smoothed rate, or None before the first full window."""
        self._roll(now)
        return self._rate

    def _roll(self, now: float) -> None:
        if self._start is None:
            self._start = now
            return
        n = int((now - self._start) // self.window_s)
        if n < 1:
            return
        r = self._acc / self.window_s
        rate = r if self._rate is None else self.alpha * r + (1 - self.alpha) * self._rate
        # The n - 1 windows after the first were empty: each decays the average once.
        self._rate = rate * (1 - self.alpha) ** (n - 1)
        self._acc = 0.0
        self._start += n * self.window_s
