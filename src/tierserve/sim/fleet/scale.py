"""The class autoscaling rule on the simulated fleet's virtual clock.

Every replica keeps the cluster's ``ClassWindow`` (cluster/signals.py), fed from its engine's
requests as the real replica's is from its engine's events (added, first token, finished). Every
``period_s`` of simulated time the routable replicas' ``autoscaling_metrics`` go to the cluster's
pure ``desired_replicas`` (cluster/autoscale.py) with the current count, replicas starting
included. What Ray Serve adds around the policy is modelled here: the count is clamped to
``[min_replicas, max_replicas]``; a decision to grow (shrink) must hold for ``upscale_delay_s``
(``downscale_delay_s``) before it is applied. A replica asked for serves ``start_s`` later (model
load, warm-up); it costs replica-seconds from the moment it is asked for. A replica scaled in
leaves the routable set at once, finishes what it holds, and stops costing once it is idle.
Serve's look-back averaging of each metric is not modelled: the policy reads the signals of the
moment (each already a 30 s window by default: ``window_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tierserve.cluster.autoscale import ScaleConfig, desired_replicas
from tierserve.cluster.signals import WINDOW_S


@dataclass(frozen=True)
class AutoscaleConfig:
    min_replicas: int = 1
    max_replicas: int = 16
    start_s: float = 20.0  # asked for -> serving
    period_s: float = 1.0  # how often the policy runs
    upscale_delay_s: float = 5.0  # Serve's default
    downscale_delay_s: float = 30.0  # Serve's is 120 s; shorter runs here
    window_s: float = WINDOW_S
    rule: ScaleConfig = field(default_factory=ScaleConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"autoscaling needs 1 <= min <= max replicas, got "
                f"{self.min_replicas}:{self.max_replicas}"
            )
        for name in ("start_s", "upscale_delay_s", "downscale_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("period_s", "window_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def parse_autoscale(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (the simulate command's ``--autoscale``) as two ints; ValueError naming it."""
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--autoscale takes MIN:MAX replicas (e.g. 4:16), got {text!r}") from None
    AutoscaleConfig(lo, hi)  # the range's own error
    return lo, hi


@dataclass
class ScaleDecision:
    time: float
    current: int
    wanted: int
    reason: str


class Scaler:
    """The autoscaling loop's state: pending direction since when, and every decision made.
    `decide`: the policy (the cluster's ``desired_replicas``; a benchmark may try another)."""

    def __init__(self, cfg: AutoscaleConfig, decide=desired_replicas) -> None:
        self.cfg = cfg
        self.decide = decide
        self._since: tuple[int, float] | None = None  # (direction, since when)
        self.decisions: list[ScaleDecision] = []
        self.reasons: dict[str, int] = {}

    def tick(self, now: float, metrics: dict[str, dict[str, float]], current: int) -> int:
        """The change in replicas to apply now (0: none), from the routable replicas'
        autoscaling metrics and the current count (starting replicas included)."""
        cfg = self.cfg
        wanted, why = self.decide(metrics, current, cfg.rule)
        wanted = max(cfg.min_replicas, min(cfg.max_replicas, wanted))
        self.reasons[why] = self.reasons.get(why, 0) + 1
        direction = (wanted > current) - (wanted < current)
        if direction == 0:
            self._since = None
            return 0
        if self._since is None or self._since[0] != direction:
            self._since = (direction, now)
        delay = cfg.upscale_delay_s if direction > 0 else cfg.downscale_delay_s
        if now - self._since[1] < delay:
            return 0
        self._since = None
        self.decisions.append(ScaleDecision(now, current, wanted, why))
        return wanted - current
