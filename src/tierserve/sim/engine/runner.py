"""One simulation run: build the real scheduler + KV manager + policy around a SimExecutor and a
virtual clock, drive it with a workload, and summarise."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

from tierserve.admission import AdmissionController
from tierserve.admission.sla import policy_for_sla_admission
from tierserve.clock import ManualClock
from tierserve.config import (
    AdmissionConfig,
    CacheConfig,
    PartitionConfig,
    PolicyConfig,
    PriorityConfig,
    SchedulerConfig,
)
from tierserve.core.speculation import SpecConfig, Speculation, parse_speculative_config
from tierserve.engine.core import EngineCore
from tierserve.engine.load import CoreQueueView, LateRequestCheck
from tierserve.priority import Priority
from tierserve.setting import carried
from tierserve.sim.calibration.profiles import load_hardware, load_model_profile
from tierserve.sim.engine.cost_model import CostModel
from tierserve.sim.engine.driver import DriveResult, SlaClients, drive
from tierserve.sim.engine.executor import SimExecutor, SimTotals, sim_drafter
from tierserve.sim.engine.stats import run_stats
from tierserve.workloads import make_workload
from tierserve.workloads.synthetic import Workload, WorkloadConfig

# Deep queues: the seed table measures latency under load, not admission refusals.
SIM_ADMISSION = AdmissionConfig(
    max_queued_requests=(1 << 20,) * 4, max_queued_tokens=(1 << 40,) * 4
)


@dataclass(frozen=True)
class SimConfig:
    policy: str = "hybrid"
    hardware: str = "a100-80gb"
    model: str = "llama-3.1-70b"
    tp: int = 8
    block_size: int = 16
    max_num_seqs: int = 512
    max_num_batched_tokens: int = 2048
    swap_gib_per_device: float = 16.0
    preemption_mode: str = "auto"
    p0_express: str = "decode"  # GPU: decode hides under compute-bound prefill
    # A step's prefill is sized to end within this fraction of P0's SLA (core/step_time.py).
    step_time_fraction: float | None = SchedulerConfig().step_time_fraction
    p0_step_time_fraction: float | None = SchedulerConfig().p0_step_time_fraction
    p0_calm_fraction: float | None = SchedulerConfig().p0_calm_fraction  # core/calm.py
    num_kv_blocks: int | None = None
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    partitions: PartitionConfig = field(default_factory=PartitionConfig)
    priorities: PriorityConfig = field(default_factory=PriorityConfig)
    admission: AdmissionConfig = SIM_ADMISSION
    kv_sample_points: int = 200
    # A refused closed-loop client sends the same request again after its Retry-After, at most
    # this many times, then moves on to its next request.
    max_retries: int = 3
    # SLA admission opt-ins of the workload's tenants ("tenant-0", ...).
    demote_tenants: tuple[str, ...] = ()
    end_early_tenants: tuple[str, ...] = ()
    # Prefix-cache retention by class (CacheConfig.prefix_retention; all 0: plain LRU).
    prefix_retention: tuple[float, ...] = CacheConfig().prefix_retention
    # hybrid's SLA urgency under SLA admission (policy_for_sla_admission: 1.0; the default 0.2
    # only for comparison, benchmarks/simulation/sla_ablation.py)
    sla_urgency_fraction: float = 1.0
    # Speculative decoding (None: off) and the workload's per-draft acceptance, per class.
    speculative: SpecConfig | None = None
    spec_acceptance: tuple[float, ...] = (0.7, 0.7, 0.7, 0.7)
    # Predictive scheduling (SchedulerConfig.predictive_*; core/predictive.py)
    predictive_order_s: float = 0.0
    predictive_reserve: bool = False
    predictive_ttft: bool = False
    predictive_routing: bool = False  # a fleet's ranking reads the predicted KV (routing/rank)

    @property
    def label(self) -> str:
        """The policy, marked when SLA admission is on: how reports tell runs apart."""
        return f"{self.policy}+sla" if self.admission.sla_admission else self.policy


def build(cfg: SimConfig) -> tuple[EngineCore, SimExecutor, CostModel]:
    cost = CostModel(load_hardware(cfg.hardware), load_model_profile(cfg.model), cfg.tp)
    blocks = cfg.num_kv_blocks or cost.kv_capacity_tokens() // cfg.block_size
    swap = int(
        cfg.swap_gib_per_device * (1 << 30) * cfg.tp // cost.kv_bytes_per_block(cfg.block_size)
    )
    clock = ManualClock()
    ex = SimExecutor(cost, clock, cfg.block_size, cfg.spec_acceptance)
    policy = PolicyConfig(name=cfg.policy)
    engine = EngineCore.build(
        ex,
        clock,
        CacheConfig(
            cfg.block_size,
            blocks,
            swap,
            partitions=cfg.partitions,
            prefix_retention=cfg.prefix_retention,
        ),
        SchedulerConfig(**carried(SchedulerConfig, cfg, max_model_len=1 << 20)),
        replace(policy_for_sla_admission(policy), sla_urgency_fraction=cfg.sla_urgency_fraction)
        if cfg.admission.sla_admission
        else policy,
        cfg.priorities,
        Speculation(cfg.speculative, sim_drafter) if cfg.speculative else None,
    )
    return engine, ex, cost


def _kv_series(result: DriveResult, points: int) -> list[dict]:
    s = result.samples
    stride = max(1, len(s) // points)
    return [
        {
            "t": round(x.time, 3),
            "usage": round(x.kv_usage, 4),
            "floor": x.floor_used,
            "reserve": x.reserve_used,
            "shared": x.shared_used,
            "borrowed": x.borrowed,
            "running": x.running,
            "waiting": x.waiting,
        }
        for x in s[::stride]
    ]


def run_simulation(
    cfg: SimConfig, progress=None, keep_records: bool = False, workload: Workload | None = None
) -> dict:
    """Run `cfg` and summarise it; `keep_records` adds every request's record (in-process use,
    not JSON); `workload` replaces the one `cfg.workload` describes (made from it)."""
    t0 = time.perf_counter()
    engine, ex, cost = build(cfg)
    wl = workload or make_workload(cfg.workload)
    ex.output_lengths = wl.output_lengths
    adm = cfg.admission
    admission = AdmissionController(adm, CoreQueueView(engine), engine.clock, cfg.priorities)
    sla = SlaClients(
        frozenset(cfg.demote_tenants),
        frozenset(cfg.end_early_tenants),
        LateRequestCheck(cfg.priorities, adm.sla_margin, adm.sla_recheck_s)
        if adm.sla_admission
        else None,
    )
    result = drive(engine, wl, admission, engine.clock.set, progress, cfg.max_retries, sla)
    w = cfg.workload
    lo, hi = w.warmup_s, w.duration_s
    out = run_stats(result, lo, hi, cfg.priorities)
    window = [x for x in result.samples if lo <= x.time < hi]
    busy = sum(x.duration for x in window)
    hw = cost.hw
    sched = engine.scheduler
    kv = sched.kv.stats()
    out.update(
        policy=cfg.policy,
        variant=cfg.label,
        sla_admission=adm.sla_admission,
        sla_margin=adm.sla_margin if adm.sla_admission else None,
        concurrency=w.concurrency if w.arrival == "closed" else None,
        arrival=w.arrival,
        rate=w.rate if w.arrival != "closed" else None,
        hardware=cfg.hardware,
        model=cfg.model,
        tp=cfg.tp,
        utilization=busy / (hi - lo),
        flop_utilization=ex.totals.flops / max(ex.totals.busy_s, 1e-9) / (hw.peak_flops * cfg.tp),
        bandwidth_utilization=ex.totals.bytes
        / max(ex.totals.busy_s, 1e-9)
        / (hw.mem_bandwidth * cfg.tp),
        preemptions={"swap": sched.preemptions.swap, "recompute": sched.preemptions.recompute},
        preemption_causes=sched.preemptions.causes(),
        preempted_requests=sched.preemptions.victims,
        preemptions_for_admission=sched.preemptions.for_admission,
        swap_blocks={
            "in": sched.preemptions.swapped_in_blocks,
            "out": sched.preemptions.swapped_out_blocks,
        },
        preemption_time=preemption_time(ex.totals),
        p0_express_steps=sched.express_steps,
        speculation=asdict(sched.speculation.counts) if sched.speculation else None,
        predictor_error=sched.predictor.error_stats(),
        reservation_waits=sched.reservation_waits,
        prefix_hit_rate={p.label: round(kv.hit_rate(p), 4) for p in Priority},
        kv_blocks=sched.kv.pool.num_blocks,
        kv_usage_series=_kv_series(result, cfg.kv_sample_points),
        steps=ex.totals.steps,
        simulated_s=result.end_time,
        wall_s=time.perf_counter() - t0,
        config={
            "workload": {k: v for k, v in asdict(w).items() if k != "classes"},
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "preemption_mode": cfg.preemption_mode,
            "p0_express": cfg.p0_express,
            "step_time_fraction": cfg.step_time_fraction,
            "p0_step_time_fraction": cfg.p0_step_time_fraction,
            "predictive_order_s": cfg.predictive_order_s,
            "predictive_reserve": cfg.predictive_reserve,
            "predictive_ttft": cfg.predictive_ttft,
            "predictive_routing": cfg.predictive_routing,
            "max_retries": cfg.max_retries,
            "demote_tenants": list(cfg.demote_tenants),
            "end_early_tenants": list(cfg.end_early_tenants),
        },
    )
    sched.check_invariants()
    if keep_records:
        out["records"] = result.records
    return out


def preemption_time(t: SimTotals) -> dict:
    """What preemption cost the whole run, in simulated seconds: swap copies (both ways) and the
    steps' extra time for recomputed tokens."""
    return {
        "swap_s": round(t.swap_s, 3),
        "recompute_s": round(t.recompute_s, 3),
        "recompute_tokens": t.recompute_tokens,
        "total_s": round(t.swap_s + t.recompute_s, 3),
    }


def with_speculation(configs: list, raw: str | None, acceptance: list[float]) -> list:
    """The simulate command's configs with speculative decoding, if asked (raises ValueError
    naming a bad value)."""
    spec = parse_speculative_config(raw)
    if spec is None:
        return configs
    if len(acceptance) not in (1, 4) or not all(0 <= a < 1 for a in acceptance):
        raise ValueError(f"--spec-acceptance takes 1 or 4 values in [0, 1), got {acceptance}")
    acc = tuple(acceptance) * (4 // len(acceptance))
    if not all(isinstance(c, SimConfig) for c in configs):
        raise ValueError("--speculative-config is not supported for fleets yet")
    return [replace(c, speculative=spec, spec_acceptance=acc) for c in configs]
