"""Frozen configuration: numbers only, no I/O, validated on construction.

Each layer gets its own small dataclass (cache, partitions, scheduler, policy, admission). None of
them knows about a model directory: the scheduler and the KV manager are built from numbers.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.setting import ConfigError, check_settings, fraction_or_none, setting


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _per_class(name: str, values: tuple, allow_none: bool = False) -> None:
    _check(
        len(values) == NUM_PRIORITIES,
        f"{name} must have {NUM_PRIORITIES} values (P0..P3), got {len(values)}",
    )
    for i, v in enumerate(values):
        if v is None and allow_none:
            continue
        _check(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
            f"{name}[P{i}] must be a number, got {v!r}",
        )
        _check(v >= 0, f"{name}[P{i}] must not be negative, got {v}")


# -- Priority classes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PriorityConfig:
    """TTFT service-level objective per class, in seconds (None = no SLA)."""

    ttft_sla_s: tuple[float | None, ...] = (0.5, 5.0, 60.0, None)

    def __post_init__(self) -> None:
        _per_class("ttft_sla_s", self.ttft_sla_s, allow_none=True)
        for i, v in enumerate(self.ttft_sla_s):
            _check(v is None or v > 0, f"ttft_sla_s[P{i}] must be positive or None, got {v}")

    def sla(self, priority: Priority) -> float | None:
        return self.ttft_sla_s[priority]


# -- KV cache -------------------------------------------------------------------------------------

Size = int | float
"""A partition size: a ``float`` in [0, 1] is a fraction of the pool, an ``int`` a block count."""


def resolve_size(name: str, value: Size, num_blocks: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            f"{name} must be a fraction (float) or a block count (int), got {value!r}"
        )
    if isinstance(value, float):
        _check(
            math.isfinite(value) and 0.0 <= value <= 1.0,
            f"{name} as a fraction must lie in [0, 1], got {value}",
        )
        return int(value * num_blocks)
    _check(value >= 0, f"{name} must not be negative, got {value}")
    return value


@dataclass(frozen=True)
class PartitionSizes:
    """Partition sizes resolved to block counts for one pool."""

    num_blocks: int
    p0_floor_min: int
    p0_floor_max: int
    p0_ceiling: int
    p1_reserve: int


@dataclass(frozen=True)
class PartitionConfig:
    """Per-priority KV memory partitions.

    * P0 has a *hard floor* nobody else may use; it adapts between ``p0_floor_min`` and
      ``p0_floor_max`` to recent P0 demand when ``adaptive`` is on (else it stays at the max).
    * P0 may grow past its floor into the shared region (and free space of the P1 reservation)
      up to ``p0_ceiling`` blocks in all.
    * P1 has an *elastic reservation* ``p1_reserve``, protected from P2/P3 while P1 has demand and
      lent to the classes in ``borrowers`` while P1 is idle; borrowed blocks are reclaimed first.
    * Everything else is the shared region, first come first served.
    """

    p0_floor_min: Size = 0.02
    p0_floor_max: Size = 0.10
    p0_ceiling: Size = 0.60
    p1_reserve: Size = 0.20
    borrowers: tuple[Priority, ...] = (Priority.P3,)
    adaptive: bool = True
    window_s: float = 5.0
    ewma_alpha: float = 0.3
    headroom: float = 1.25

    def __post_init__(self) -> None:
        for b in self.borrowers:
            _check(
                Priority(b) in (Priority.P2, Priority.P3),
                f"borrowers may only name P2 or P3, got {b!r}",
            )
        _check(self.window_s > 0, f"window_s must be positive, got {self.window_s}")
        _check(0 < self.ewma_alpha <= 1, f"ewma_alpha must lie in (0, 1], got {self.ewma_alpha}")
        _check(self.headroom >= 1, f"headroom must be >= 1, got {self.headroom}")
        for name in ("p0_floor_min", "p0_floor_max", "p0_ceiling", "p1_reserve"):
            resolve_size(name, getattr(self, name), 1 << 30)  # type and sign checks

    def resolve(self, num_blocks: int) -> PartitionSizes:
        fmin = resolve_size("p0_floor_min", self.p0_floor_min, num_blocks)
        fmax = resolve_size("p0_floor_max", self.p0_floor_max, num_blocks)
        ceil = resolve_size("p0_ceiling", self.p0_ceiling, num_blocks)
        res = resolve_size("p1_reserve", self.p1_reserve, num_blocks)
        _check(fmin <= fmax, f"p0_floor_min ({fmin} blocks) exceeds p0_floor_max ({fmax} blocks)")
        _check(fmax <= ceil, f"p0_floor_max ({fmax} blocks) exceeds p0_ceiling ({ceil} blocks)")
        _check(
            ceil <= num_blocks, f"p0_ceiling ({ceil} blocks) exceeds the pool ({num_blocks} blocks)"
        )
        _check(
            fmax + res <= num_blocks,
            f"partitions add up to more than the pool: p0_floor_max {fmax} + p1_reserve {res} "
            f"> {num_blocks} blocks",
        )
        return PartitionSizes(num_blocks, fmin, fmax, ceil, res)


# One shared region: what a class-blind policy (fcfs) runs on.
FLAT_PARTITIONS = PartitionConfig(
    p0_floor_min=0, p0_floor_max=0, p0_ceiling=1.0, p1_reserve=0, borrowers=(), adaptive=False
)


# Prefix-cache eviction in least-recently-freed order whatever the class (CacheConfig).
LRU_RETENTION = (0.0,) * NUM_PRIORITIES


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_blocks: int = 1024
    num_cpu_blocks: int = 0
    enable_prefix_caching: bool = True
    partitions: PartitionConfig = field(default_factory=PartitionConfig)
    # Per class P0..P3: pool sizes of later allocations a cached free block of that class
    # outlives beyond least-recently-freed order (core/kv/block_pool.py); all 0: plain LRU.
    # Four pools for P0: one pool let a P3 flood on today's CPU engine evict a realtime system
    # prompt asked for every 40 s (docs/kv-cache.md).
    prefix_retention: tuple[float, ...] = (4.0, 2.0, 1.0, 0.0)

    def __post_init__(self) -> None:
        _per_class("prefix_retention", self.prefix_retention)
        _check(
            isinstance(self.block_size, int) and self.block_size > 0,
            f"block_size must be a positive integer, got {self.block_size!r}",
        )
        _check(
            isinstance(self.num_blocks, int) and self.num_blocks > 0,
            f"num_blocks must be a positive integer, got {self.num_blocks!r}",
        )
        _check(
            isinstance(self.num_cpu_blocks, int) and self.num_cpu_blocks >= 0,
            f"num_cpu_blocks must be a non-negative integer, got {self.num_cpu_blocks!r}",
        )
        self.partitions.resolve(self.num_blocks)


# -- Scheduler ------------------------------------------------------------------------------------

PREEMPTION_MODES = ("auto", "swap", "recompute")
EXPRESS_MODES = ("exclusive", "decode", "off")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    # A non-P0 prompt longer than this is prefilled at most `long_prefill_max_tokens` per step.
    long_prefill_threshold: int = 8192
    long_prefill_max_tokens: int = 4096
    # "auto": swap when moving KV out and back costs less than `swap_cost_ratio` x recompute.
    preemption_mode: str = "auto"
    swap_cost_ratio: float = 0.3
    # P0 express step: when a P0 request waits, the next step is built for it, at most once every
    # `p0_express_min_gap` steps. "exclusive": P0 work only (others keep their memory and sit
    # the step out); "decode": others still decode but their prefill chunks wait (on GPUs decode
    # hides under compute-bound prefill); "off".
    p0_express: str = "exclusive"
    p0_express_min_gap: int = 3
    # P0 cut-in (core/cut_in.py): a P0 request that arrives while a step runs gets a step of its
    # own between two of that step's decoder layers, instead of waiting for its end. Counted
    # with the express steps (same share of the engine's time); needs an executor with layers.
    p0_cut_in: bool = setting(
        True,
        "on: a P0 arriving while a step runs gets a step of its own between two of that "
        "step's layers (default) | off: it waits for the step's end",
    )
    # A step's prefill is sized so that the step is predicted to end within this fraction of
    # P0's TTFT SLA (a P0 arriving meanwhile waits for it); None: sized by tokens only. Only
    # under a policy that serves P0 first (core/step_time.py).
    step_time_fraction: float | None = setting(
        0.4,
        "size each step's prefill to end within this fraction of P0's TTFT SLA; none: by "
        "tokens only",
        fraction_or_none(10),
        "lie in (0, 10] (of P0's TTFT SLA) or be None",
    )
    # The same bound, tighter, while a P0 arrived within the last `p0_recent_s`: a P0 arriving
    # mid-step waits for the step in flight and then prefills in its own (express) step, so the
    # in-flight step's bound plus its own prompt must fit its SLA. None: no tighter bound.
    p0_step_time_fraction: float | None = setting(
        0.3,
        "the same bound while a P0 arrived in the last 10 s (it waits for the step in flight, "
        "then prefills in its own); none: no tighter bound",
        fraction_or_none(10),
        "lie in (0, 10] (of P0's TTFT SLA) or be None",
    )
    # Calm steps (core/calm.py): while a P0 arrived within the last `p0_recent_s`, P2/P3
    # decodes are paced so that a step's decodes fit `p0_calm_fraction` x P0's TTFT SLA
    # (None: off, the default: it costs background throughput, docs/scheduling.md)
    p0_calm_fraction: float | None = setting(
        None,
        "while P0 traffic is about, pace P2/P3 decodes so a step's decodes fit this fraction of "
        "P0's TTFT SLA (e.g. 0.1; costs background throughput); none: off (default)",
        fraction_or_none(1),
        "lie in (0, 1] (of P0's TTFT SLA) or be None",
    )
    # The same pacing for Batch API lines only (on by default: a batch steps aside for P0).
    batch_calm_fraction: float | None = setting(
        0.1, "", fraction_or_none(1), "lie in (0, 1] (of P0's TTFT SLA) or be None"
    )
    p0_recent_s: float = 10.0
    # Predictive scheduling (core/predictive.py; off by default, see docs/scheduling.md):
    # shortest predicted output first inside a class, no request passed by one arriving more
    # than `predictive_order_s` seconds after it (0: arrival / deadline order); the full shift
    # goes to a predicted output of `predictive_order_tokens` or more.
    predictive_order_s: float = 0.0
    predictive_order_tokens: int = 1024
    # Admit only when prompt + predicted P90 output fits beside the class's running requests.
    predictive_reserve: bool = False
    # The TTFT predictor (SLA admission, Retry-After) counts predicted output, not max_tokens.
    predictive_ttft: bool = False
    # The scheduler's record carries its predicted KV and work (core/predictive.py
    # ``PredictedLoad``): the cluster's ranking reads it from each replica's report.
    predictive_routing: bool = False
    check_invariants: bool = False

    def __post_init__(self) -> None:
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "long_prefill_threshold",
            "long_prefill_max_tokens",
            "p0_express_min_gap",
            "predictive_order_tokens",
        ):
            v = getattr(self, name)
            _check(isinstance(v, int) and v > 0, f"{name} must be a positive integer, got {v!r}")
        _check(
            self.preemption_mode in PREEMPTION_MODES,
            f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}",
        )
        _check(
            self.swap_cost_ratio > 0, f"swap_cost_ratio must be positive: {self.swap_cost_ratio}"
        )
        _check(
            isinstance(self.predictive_order_s, int | float) and self.predictive_order_s >= 0,
            f"predictive_order_s must be >= 0 seconds (0: off), got {self.predictive_order_s!r}",
        )
        check_settings(self)
        _check(self.p0_recent_s > 0, f"p0_recent_s must be positive, got {self.p0_recent_s}")


# -- Policies -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyConfig:
    name: str = "hybrid"
    drr_weights: tuple[float, ...] = (8, 4, 2, 1)
    # DRR quantum per unit of weight, in tokens; a class gets weight x quantum per round.
    drr_quantum_tokens: int = 512
    wfq_weights: tuple[float, ...] = (16, 8, 4, 2)
    aging: bool = True
    # Seconds a request waits in a class before promotion by one class (None = never promoted).
    aging_thresholds_s: tuple[float | None, ...] = (None, 30.0, 15.0, 5.0)
    tenant_fairness: bool = True
    # hybrid: a P1/P2 head that has used this fraction of its TTFT SLA goes before the fair share.
    sla_urgency_fraction: float = 0.2
    # Output tokens counted in a request's cost when its max_tokens is larger than this.
    max_expected_output_tokens: int = 1024

    def __post_init__(self) -> None:
        _check(isinstance(self.name, str) and self.name != "", "policy name must be a string")
        _per_class("drr_weights", self.drr_weights)
        _per_class("wfq_weights", self.wfq_weights)
        for name in ("drr_weights", "wfq_weights"):
            for i, w in enumerate(getattr(self, name)):
                _check(w > 0, f"{name}[P{i}] must be positive, got {w}")
        _check(self.drr_quantum_tokens > 0, "drr_quantum_tokens must be positive")
        _per_class("aging_thresholds_s", self.aging_thresholds_s, allow_none=True)
        th = self.aging_thresholds_s
        _check(th[0] is None, "aging_thresholds_s[P0] must be None: P0 has no class to move to")
        for i, v in enumerate(th):
            _check(v is None or v > 0, f"aging_thresholds_s[P{i}] must be positive, got {v}")
        # A less urgent class must not wait longer before promotion than a more urgent one.
        known = [(i, v) for i, v in enumerate(th) if v is not None]
        for (i, a), (j, b) in itertools.pairwise(known):
            _check(
                a >= b,
                f"aging thresholds out of order: P{i} ({a} s) must be >= P{j} ({b} s); "
                "a less urgent class is promoted sooner",
            )
        _check(self.max_expected_output_tokens > 0, "max_expected_output_tokens must be positive")
        _check(
            0.0 <= self.sla_urgency_fraction <= 1.0,
            f"sla_urgency_fraction must lie in [0, 1], got {self.sla_urgency_fraction}",
        )


# -- Admission control and rate limiting ----------------------------------------------------------


@dataclass(frozen=True)
class BucketConfig:
    """A token bucket: `rate` tokens per second refilled continuously, at most `burst` stored.
    A request costs prompt tokens + max_tokens."""

    rate: float
    burst: float

    def __post_init__(self) -> None:
        _check(math.isfinite(self.rate) and self.rate > 0, f"bucket rate must be > 0: {self.rate}")
        _check(
            math.isfinite(self.burst) and self.burst > 0, f"bucket burst must be > 0: {self.burst}"
        )


@dataclass(frozen=True)
class AdmissionConfig:
    global_bucket: BucketConfig | None = None
    # Bucket for tenants that have none of their own (None: tenants are not rate limited).
    tenant_bucket: BucketConfig | None = None
    max_queued_requests: tuple[int, ...] = (256, 4096, 8192, 8192)
    max_queued_tokens: tuple[int, ...] = (1 << 20, 1 << 24, 1 << 25, 1 << 25)
    # Reject early a request whose class SLA cannot be met given the queue ahead of it.
    reject_on_sla_miss: bool = False
    # SLA-feasibility admission (admission/sla.py): refuse a request whose predicted TTFT
    # exceeds sla_margin x its class SLA, and re-check waiting requests every sla_recheck_s.
    # 0.8: the margin at which P1 and P2 keep >= 95% in the simulated seed table
    # (docs/scheduling.md).
    sla_admission: bool = False
    sla_margin: float = 0.8
    sla_recheck_s: float = 0.5
    # A P0 arrival that finds the P0 queue full sheds the lowest-class waiting request instead.
    shed_for_p0: bool = True
    drain_window_s: float = 2.0
    drain_alpha: float = 0.3
    # Used only until a drain rate has been measured.
    initial_retry_after_s: float = 1.0
    # Share of the global bucket's burst kept for P0: lower classes may not draw the bucket
    # below it (admission/controller.py). 0 turns the reserve off.
    p0_rate_reserve: float = 0.2

    def __post_init__(self) -> None:
        _per_class("max_queued_requests", self.max_queued_requests)
        _per_class("max_queued_tokens", self.max_queued_tokens)
        _check(self.drain_window_s > 0, "drain_window_s must be positive")
        _check(0 < self.drain_alpha <= 1, "drain_alpha must lie in (0, 1]")
        _check(self.initial_retry_after_s > 0, "initial_retry_after_s must be positive")
        _check(
            math.isfinite(self.sla_margin) and self.sla_margin > 0,
            f"sla_margin must be a positive factor of the SLA, got {self.sla_margin}",
        )
        _check(self.sla_recheck_s > 0, f"sla_recheck_s must be positive: {self.sla_recheck_s}")
        _check(
            0.0 <= self.p0_rate_reserve < 1.0,
            f"p0_rate_reserve must lie in [0, 1), got {self.p0_rate_reserve}",
        )
