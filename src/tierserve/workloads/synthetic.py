"""Seeded, reproducible workloads: a class mix, per-class prompt and output lengths, closed-loop
concurrency or open-loop Poisson / gamma arrivals, optional shared prefixes.

Default per-class lengths (lognormal, clipped; see docs/benchmarks.md for the reasoning):

| class | examples                         | prompt median [min, max] | output median [min, max] |
|-------|----------------------------------|--------------------------|--------------------------|
| P0    | multi-turn chat, tool calls      | 600 [64, 4096]           | 80 [8, 512]              |
| P1    | API chat, summaries              | 1200 [64, 8192]          | 250 [16, 1024]           |
| P2    | classification, short outputs    | 800 [64, 4096]           | 20 [1, 128]              |
| P3    | evaluation, long generations     | 1500 [128, 8192]         | 800 [64, 2048]           |
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class LengthDist:
    median: float
    sigma: float
    lo: int
    hi: int

    def sample(self, rng: random.Random) -> int:
        x = rng.lognormvariate(math.log(self.median), self.sigma)
        return int(min(self.hi, max(self.lo, round(x))))


@dataclass(frozen=True)
class ClassSpec:
    prompt: LengthDist
    output: LengthDist
    shared_prefix_tokens: int = 0  # used when the workload enables shared prefixes
    shared_fraction: float = 0.0


SIM_TOKEN = 1  # every simulated token; outputs end by max_tokens (ignore_eos) ...
SIM_EOS = 2  # ... or, for a request with a drawn length (`output_lengths`), by this token

DEFAULT_CLASSES: dict[Priority, ClassSpec] = {
    Priority.P0: ClassSpec(LengthDist(600, 0.6, 64, 4096), LengthDist(80, 0.7, 8, 512), 256, 0.8),
    Priority.P1: ClassSpec(
        LengthDist(1200, 0.7, 64, 8192), LengthDist(250, 0.7, 16, 1024), 512, 0.5
    ),
    Priority.P2: ClassSpec(LengthDist(800, 0.6, 64, 4096), LengthDist(20, 0.8, 1, 128), 384, 0.7),
    Priority.P3: ClassSpec(
        LengthDist(1500, 0.6, 128, 8192), LengthDist(800, 0.5, 64, 2048), 0, 0.0
    ),
}

# Shorter lengths, as `tierserve sim-fidelity` uses on a 2-core CPU.
CPU_CLASSES = {
    Priority.P0: ClassSpec(LengthDist(60, 0.5, 16, 256), LengthDist(16, 0.5, 4, 64)),
    Priority.P1: ClassSpec(LengthDist(120, 0.6, 16, 512), LengthDist(32, 0.6, 4, 128)),
    Priority.P2: ClassSpec(LengthDist(80, 0.5, 16, 256), LengthDist(4, 0.6, 1, 16)),
    Priority.P3: ClassSpec(LengthDist(150, 0.5, 32, 512), LengthDist(96, 0.4, 16, 256)),
}


@dataclass(frozen=True)
class WorkloadConfig:
    mix: tuple[float, ...] = (0.05, 0.60, 0.30, 0.05)
    classes: dict = field(default_factory=lambda: dict(DEFAULT_CLASSES))
    arrival: str = "closed"  # closed | poisson | gamma
    concurrency: int = 64  # closed loop: clients
    rate: float = 10.0  # open loop: requests per second
    gamma_cv: float = 2.0  # open loop, gamma: coefficient of variation of gaps
    duration_s: float = 120.0  # arrivals stop here
    warmup_s: float = 20.0  # requests arriving before this are not measured
    ramp_s: float = 2.0  # closed loop: clients start spread over this long
    shared_prefixes: bool = False
    seed: int = 0
    vocab_size: int = 32000
    tenants: int = 4
    # "classes": per-class lengths (above), every output runs to its max_tokens; "heavy_tail":
    # per-tenant templates with lognormal / mixture lengths ending by EOS (sim/heavy_tail.py)
    lengths: str = "classes"

    def __post_init__(self) -> None:
        if len(self.mix) != 4 or any(m < 0 for m in self.mix) or sum(self.mix) <= 0:
            raise ValueError(f"mix must be 4 non-negative shares, got {self.mix}")
        if self.arrival not in ("closed", "poisson", "gamma"):
            raise ValueError(f"arrival must be closed, poisson or gamma, got {self.arrival!r}")
        if self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be shorter than duration_s")
        if self.lengths not in ("classes", "heavy_tail"):
            raise ValueError(f"lengths must be classes or heavy_tail, got {self.lengths!r}")


class Workload:
    """Makes requests on demand; the same seed gives the same requests in the same order."""

    def __init__(self, cfg: WorkloadConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self._n = 0
        total = sum(cfg.mix)
        self._cum = [sum(cfg.mix[: i + 1]) / total for i in range(4)]
        # Request id -> the output length at which the simulated model samples EOS (empty:
        # every output runs to its max_tokens).
        self.output_lengths: dict[str, int] = {}

    def _class(self) -> Priority:
        u = self.rng.random()
        return Priority(next(i for i, c in enumerate(self._cum) if u <= c))

    def make(self, now: float) -> Request:
        cfg, rng = self.cfg, self.rng
        prio = self._class()
        spec: ClassSpec = cfg.classes[prio]
        n_prompt, n_out = spec.prompt.sample(rng), spec.output.sample(rng)
        uid = self._n
        self._n += 1
        tenant = f"tenant-{rng.randrange(cfg.tenants)}"
        prefix: list[int] = []
        if (
            cfg.shared_prefixes
            and spec.shared_prefix_tokens
            and rng.random() < spec.shared_fraction
        ):
            k = min(spec.shared_prefix_tokens, n_prompt - 1)
            prefix = [100 + int(prio)] * k  # one system prompt per class
        # A distinct token per request: its blocks hash apart from everyone else's.
        body = [1000 + uid % (cfg.vocab_size - 1000)] * (n_prompt - len(prefix))
        return Request(
            f"sim-{uid}",
            prefix + body,
            SamplingParams(max_tokens=n_out, ignore_eos=True, temperature=0.0),
            priority=prio,
            tenant=tenant,
            arrival_time=now,
        )

    def gap(self) -> float:
        """Open loop: time to the next arrival."""
        cfg = self.cfg
        if cfg.arrival == "poisson":
            return self.rng.expovariate(cfg.rate)
        shape = 1.0 / (cfg.gamma_cv**2)
        return self.rng.gammavariate(shape, 1.0 / (cfg.rate * shape))


class ProbedFlood(Workload):
    """A closed-loop flood (`cfg`: background streams with unique prompts, a P3-only mix) and a
    realtime (P0) probe every `every_s` seconds: the next client to send after a probe is due
    sends it instead. Every probe starts with the same `system_tokens`-token system prompt (then a
    question of its own), so its prefix is in the cache unless the flood evicted it."""

    def __init__(
        self,
        cfg: WorkloadConfig,
        every_s: float,
        system_tokens: int = 512,
        question_tokens: int = 64,
        probe_output: int = 16,
    ) -> None:
        super().__init__(cfg)
        self.every_s = every_s
        self.system = [100] * system_tokens
        self.question_tokens, self.probe_output = question_tokens, probe_output
        self._next_probe = every_s

    def make(self, now: float) -> Request:
        if now < self._next_probe:
            return super().make(now)  # the flood: `cfg`'s mix and lengths (P3 only, say)
        self._next_probe = now + self.every_s
        uid = self._n
        self._n += 1
        question = [1000 + uid % (self.cfg.vocab_size - 1000)] * self.question_tokens
        return Request(
            f"probe-{uid}",
            self.system + question,
            SamplingParams(max_tokens=self.probe_output, ignore_eos=True, temperature=0.0),
            priority=Priority.P0,
            tenant="tenant-0",
            arrival_time=now,
        )
