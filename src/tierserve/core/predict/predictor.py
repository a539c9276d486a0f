"""The online output-length predictor: learns from finished requests, predicts P50 and P90.

Every finished request adds its output length to one decaying histogram (sketch.py) per key of
its features (features.py: full key, tenant+template, tenant+class, class, global). A prediction
walks the keys finest first and answers from the first whose decayed weight reaches
``min_weight``; with none (a cold start), it predicts ``max_tokens`` for both quantiles, the
conservative guess. A prediction never exceeds the request's ``max_tokens``.

Memory is bounded: the fine keys live in an LRU of at most ``max_keys`` sketches (each at most
``NUM_BUCKETS`` floats); the class and global sketches are never evicted. Time comes from the
caller (the scheduler's injected clock), so the simulator and the server decay alike.

The predictor also records its own error per class (predicted P50 vs actual, and how often the
actual length stayed within P90): ``error_stats()``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tierserve.core.predict.features import LEVELS, Features
from tierserve.core.predict.sketch import DecayingHistogram
from tierserve.priority import NUM_PRIORITIES
from tierserve.request import Request

STATE_VERSION = 1
_COARSE = ("class", "global")


@dataclass(frozen=True)
class PredictorConfig:
    half_life_s: float = 3600.0  # an observation counts half after this long
    min_weight: float = 8.0  # a key answers once its decayed weight reaches this
    max_keys: int = 4096  # fine-key sketches kept (least recently used evicted)

    def __post_init__(self) -> None:
        if not self.half_life_s > 0:
            raise ValueError(f"half_life_s must be positive, got {self.half_life_s}")
        if not self.min_weight > 0:
            raise ValueError(f"min_weight must be positive, got {self.min_weight}")
        if not (isinstance(self.max_keys, int) and self.max_keys >= 1):
            raise ValueError(f"max_keys must be a positive integer, got {self.max_keys}")


@dataclass(frozen=True)
class Prediction:
    p50: int
    p90: int
    level: str  # the key level that answered (features.LEVELS), or "none" on a cold start


@dataclass
class ClassError:
    """Predicted P50 vs actual output length of one class's finished requests."""

    n: int = 0
    abs_error: DecayingHistogram | None = None
    within_p90: int = 0
    cold: int = 0  # finished with a cold-start guess (max_tokens), not counted in the error

    def summary(self) -> dict:
        h = self.abs_error
        return {
            "n": self.n,
            "abs_error_p50": round(h.quantile(0.5), 1) if h else 0.0,
            "abs_error_p90": round(h.quantile(0.9), 1) if h else 0.0,
            "within_p90": round(self.within_p90 / self.n, 4) if self.n else None,
            "cold": self.cold,
        }


class LengthPredictor:
    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        self._fine: OrderedDict[str, DecayingHistogram] = OrderedDict()
        self._coarse: dict[str, DecayingHistogram] = {}
        self.errors = [ClassError() for _ in range(NUM_PRIORITIES)]
        self.observed = 0

    def __len__(self) -> int:
        """Sketches held."""
        return len(self._fine) + len(self._coarse)

    def _sketch(self, key: str, create: bool) -> DecayingHistogram | None:
        coarse = key.split("|", 1)[0] in _COARSE
        table = self._coarse if coarse else self._fine
        h = table.get(key)
        if h is None and create:
            h = table[key] = DecayingHistogram()
            if not coarse and len(self._fine) > self.config.max_keys:
                self._fine.popitem(last=False)
        if h is not None and not coarse:
            self._fine.move_to_end(key)
        return h

    # -- predict -----------------------------------------------------------------------------
    def predict(self, request: Request, now: float) -> Prediction:
        cap = request.sampling_params.max_tokens
        cfg = self.config
        for key, level in zip(Features.of(request).key_chain(), LEVELS, strict=True):
            h = self._sketch(key, create=False)
            if h is None or h.total(now, cfg.half_life_s) < cfg.min_weight:
                continue
            p50 = min(cap, max(1, round(h.quantile(0.5))))
            p90 = min(cap, max(p50, round(h.quantile(0.9))))
            return Prediction(p50, p90, level)
        return Prediction(cap, cap, "none")

    def predict_beyond(self, request: Request, produced: int, now: float, q: float = 0.5) -> int:
        """The output length `request` is predicted to reach, given that it has already
        produced `produced` tokens and runs on: the `q`-quantile of the lengths seen that
        exceed `produced` (its survival), from the finest key that has seen at least one such
        length among keys with ``min_weight``. With none (it outlived all it resembles), it is
        predicted to run as long again (``2 * produced``). At most ``max_tokens``, and always
        above `produced` (``produced + 1`` once it has reached its ``max_tokens``). The sketch
        counts a bucket straddling `produced` as if uniform inside, so a survival that short
        comes within that bucket's width (<= 25%)."""
        cap = request.sampling_params.max_tokens
        cfg = self.config
        for key in Features.of(request).key_chain():
            h = self._sketch(key, create=False)
            if h is None or h.total(now, cfg.half_life_s) < cfg.min_weight:
                continue
            length, weight = h.quantile_above(q, produced)
            if weight * 0.5 ** max(0.0, (now - h.t) / cfg.half_life_s) >= 1.0:
                return max(produced + 1, min(cap, round(length)))
        return max(produced + 1, min(cap, 2 * produced))

    # -- learn -------------------------------------------------------------------------------
    def observe(
        self, request: Request, output_tokens: int, now: float, predicted: Prediction | None = None
    ) -> None:
        """Learn that `request` finished with `output_tokens` tokens; `predicted`: what was
        predicted for it (for the error record)."""
        half = self.config.half_life_s
        for key in Features.of(request).key_chain():
            self._sketch(key, create=True).add(output_tokens, now, half)
        self.observed += 1
        e = self.errors[int(request.base_priority)]
        if predicted is not None and predicted.level == "none":
            e.cold += 1
        elif predicted is not None:
            if e.abs_error is None:
                e.abs_error = DecayingHistogram()
            e.n += 1
            e.abs_error.add(abs(output_tokens - predicted.p50), 0.0, 1.0)
            e.within_p90 += output_tokens <= predicted.p90

    def error_stats(self) -> dict[str, dict]:
        """Per class ("P0".."P3"): predictions checked, |actual - P50| at P50 and P90, the
        share of requests that stayed within their P90, and the cold starts (not counted)."""
        return {f"P{c}": e.summary() for c, e in enumerate(self.errors)}

    # -- state ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        sketches = {k: h.to_json() for k, h in self._coarse.items()}
        sketches.update({k: h.to_json() for k, h in self._fine.items()})
        return {"version": STATE_VERSION, "observed": self.observed, "sketches": sketches}

    def restore(self, data: dict) -> None:
        """Replace the learned state by `data` (from ``to_json``); raise ValueError, changing
        nothing, when it is not such a state."""
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ValueError(f"not a version-{STATE_VERSION} predictor state")
        raw = data.get("sketches")
        if not isinstance(raw, dict):
            raise ValueError("the state has no 'sketches' object")
        fine: OrderedDict[str, DecayingHistogram] = OrderedDict()
        coarse: dict[str, DecayingHistogram] = {}
        for key, value in raw.items():
            if not isinstance(key, str) or key.split("|", 1)[0] not in LEVELS:
                raise ValueError(f"unknown sketch key {key!r}")
            h = DecayingHistogram.from_json(value)
            (coarse if key.split("|", 1)[0] in _COARSE else fine)[key] = h
        while len(fine) > self.config.max_keys:
            fine.popitem(last=False)
        self._fine, self._coarse = fine, coarse
        self.observed = int(data.get("observed", 0))
