"""A decaying histogram of output lengths on log-spaced buckets: the predictor's only statistic.

Bucket ``i`` holds lengths in ``[edge(i), edge(i + 1))`` with ``edge(i) = floor(RATIO ** i)``
made strictly increasing, so lengths 1..8 get a bucket each and larger ones share buckets about
``RATIO`` wide (a relative error of at most ~``RATIO - 1`` on a quantile). A sketch holds at most
``NUM_BUCKETS`` floats, sparse, whatever it has seen.

Decay: every weight halves each ``half_life_s`` seconds of the injected clock, applied lazily at
the next update, so the sketch follows a workload that drifts. Quantiles interpolate linearly
inside the bucket they fall in.
"""

from __future__ import annotations

import math

RATIO = 1.25
MAX_LENGTH = 1 << 21  # longer outputs are counted in the last bucket


def _edges() -> tuple[int, ...]:
    out = [0, 1]
    i = 1
    while out[-1] < MAX_LENGTH:
        nxt = max(out[-1] + 1, math.floor(RATIO**i))
        i += 1
        if nxt > out[-1]:
            out.append(nxt)
    return tuple(out)


EDGES = _edges()  # EDGES[i]: lower edge of bucket i; bucket 0 is length 0
NUM_BUCKETS = len(EDGES)


def bucket_of(length: int) -> int:
    """The bucket holding `length` (binary search on EDGES)."""
    n = min(max(0, int(length)), MAX_LENGTH)
    lo, hi = 0, NUM_BUCKETS - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if EDGES[mid] <= n:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DecayingHistogram:
    """Weights per bucket (sparse dict), decayed to time ``t``."""

    __slots__ = ("t", "weights")

    def __init__(self, t: float = 0.0, weights: dict[int, float] | None = None) -> None:
        self.t = t
        self.weights: dict[int, float] = dict(weights or {})

    def decay_to(self, now: float, half_life_s: float) -> None:
        if now <= self.t:
            return
        f = 0.5 ** ((now - self.t) / half_life_s)
        self.t = now
        w = self.weights
        for b in list(w):
            w[b] *= f
            if w[b] < 1e-6:
                del w[b]

    def add(self, length: int, now: float, half_life_s: float, weight: float = 1.0) -> None:
        self.decay_to(now, half_life_s)
        b = bucket_of(length)
        self.weights[b] = self.weights.get(b, 0.0) + weight

    def total(self, now: float | None = None, half_life_s: float | None = None) -> float:
        """The (decayed) weight seen; with `now`, as it will be at `now` (nothing changed)."""
        s = sum(self.weights.values())
        if now is not None and half_life_s and now > self.t:
            s *= 0.5 ** ((now - self.t) / half_life_s)
        return s

    def quantile(self, q: float) -> float:
        """The `q`-quantile of the lengths seen (0 if empty), interpolated in its bucket."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must lie in [0, 1], got {q}")
        total = sum(self.weights.values())
        if total <= 0:
            return 0.0
        target = q * total
        acc = 0.0
        for b in sorted(self.weights):
            w = self.weights[b]
            if acc + w >= target:
                lo = EDGES[b]
                hi = EDGES[b + 1] - 1 if b + 1 < NUM_BUCKETS else MAX_LENGTH
                frac = (target - acc) / w if w > 0 else 1.0
                return lo + frac * (hi - lo)
            acc += w
        b = max(self.weights)
        return float(EDGES[b])

    def quantile_above(self, q: float, floor: int) -> tuple[float, float]:
        """The `q`-quantile of the lengths seen that exceed `floor`, and the weight of those
        lengths: a bucket straddling `floor` counts the part above it, as if uniform inside.
        ``(0, 0)`` when nothing seen exceeds `floor`. A request that has produced `floor`
        tokens and runs on is predicted by this conditional distribution (its survival)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must lie in [0, 1], got {q}")
        parts: list[tuple[float, float, float]] = []  # (lo, hi, weight) above floor, ascending
        for b in sorted(self.weights):
            lo = EDGES[b]
            hi = EDGES[b + 1] - 1 if b + 1 < NUM_BUCKETS else MAX_LENGTH
            if hi <= floor:
                continue
            w = self.weights[b]
            if lo <= floor:  # straddles: keep (floor, hi]
                w *= (hi - floor) / (hi - lo + 1)
                lo = floor + 1
            parts.append((lo, hi, w))
        total = sum(w for _, _, w in parts)
        if total <= 0:
            return 0.0, 0.0
        target, acc = q * total, 0.0
        for lo, hi, w in parts:
            if acc + w >= target:
                frac = (target - acc) / w if w > 0 else 1.0
                return lo + frac * (hi - lo), total
            acc += w
        return parts[-1][1], total

    def to_json(self) -> dict:
        return {"t": self.t, "w": {str(b): round(w, 6) for b, w in self.weights.items()}}

    @classmethod
    def from_json(cls, data: dict) -> DecayingHistogram:
        """Raise ValueError when `data` is not a sketch this code wrote."""
        if not isinstance(data, dict) or not isinstance(data.get("w"), dict):
            raise ValueError("a sketch needs a 'w' object of bucket weights")
        t = float(data.get("t", 0.0))
        weights: dict[int, float] = {}
        for k, v in data["w"].items():
            b, w = int(k), float(v)
            if not (0 <= b < NUM_BUCKETS) or not math.isfinite(w) or w < 0:
                raise ValueError(f"bad bucket {k!r}: {v!r}")
            weights[b] = w
        if not math.isfinite(t):
            raise ValueError(f"bad sketch time {t!r}")
        return cls(t, weights)
