"""Named scenarios and the grid runner behind `tierserve simulate`."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace

from tierserve.routing import ROUTER_NAMES
from tierserve.sim.engine.runner import SimConfig, run_simulation
from tierserve.sim.fleet.model import FleetConfig, run_fleet
from tierserve.sim.fleet.scale import AutoscaleConfig
from tierserve.sim.report.fleet_ingress import AUTOSCALE_LABEL, FIXED_LABEL
from tierserve.workloads.synthetic import WorkloadConfig

SEED_POLICIES = ("fcfs", "drr", "hybrid")
HEARTBEAT_S = 15.0  # off a terminal: a progress line at least this often
SEED_CONCURRENCY = (32, 64, 128, 256, 512)

# The seed design's table: Llama-3.1-70B, 8 x A100-80GB, tensor parallel 8, block size 16.
# Its P0 P95 TTFT (seconds) by concurrency, for comparison in the report.
SEED_FIGURES = {
    "fcfs": {32: 0.8, 64: 2.1, 128: 8.5, 256: 25.0, 512: None},  # "25+ s", "OOM"
    "drr": {32: 0.9, 64: 1.5, 128: 3.2, 256: 8.7, 512: 18.3},
    "hybrid": {32: 0.8, 64: 1.2, 128: 1.8, 256: 3.5, 512: 6.2},
}

SEED_BASE = SimConfig(
    hardware="a100-80gb",
    model="llama-3.1-70b",
    tp=8,
    block_size=16,
    max_num_seqs=512,
    max_num_batched_tokens=1536,
    workload=WorkloadConfig(duration_s=600.0, warmup_s=150.0, seed=0),
)


# The same grid with the KV cache capped at 12,000 blocks (192k tokens, about an eighth of what
# fits on 8 x A100-80GB), so partitions, reclaiming and swap-vs-recompute preemption come into play.
MEMORY_PRESSURE_BASE = replace(SEED_BASE, num_kv_blocks=12_000)


# A fleet: 16 replicas of Llama-3.1-8B, each on one H100-80GB, hybrid policy, GPU defaults
# (express steps let others decode). Closed loop at two loads: 128 clients per replica, just
# under where one replica saturates (about 256), and 512 per replica, past it, where queues form
# and the router's choice decides who waits. Shared per-class system prompts, so prefix caching
# and prefix-aware routing have something to work with. 60 s of arrivals, 15 s warm-up (shorter
# than the seed table's 600 s, to keep 8 runs of 16 replicas to minutes on 2 cores).
FLEET_REPLICAS = 16
FLEET_LOADS = (16 * 128, 16 * 512)
FLEET_BASE = SimConfig(
    hardware="h100-80gb",
    model="llama-3.1-8b",
    tp=1,
    block_size=16,
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    workload=WorkloadConfig(duration_s=60.0, warmup_s=15.0, shared_prefixes=True, seed=0),
)


def fleet_configs(
    base: SimConfig = FLEET_BASE,
    replicas: int = FLEET_REPLICAS,
    loads=FLEET_LOADS,
    routers=ROUTER_NAMES,
) -> list[FleetConfig]:
    return [
        FleetConfig(replace(base, workload=replace(base.workload, concurrency=c)), replicas, r)
        for c in loads
        for r in routers
    ]


# The cluster ingress's pieces on the fleet above (issue 24; docs/scale-out.md, "Simulated
# fleet"), with 64 seats per replica (a quarter of the router comparison's, so that the six
# runs of 16 replicas take minutes on 2 shared cores). One such replica serves about 10
# requests/s of this mix in a closed loop at saturation, the fleet about 160
# (FLEET_CAPACITY_RPS: the autoscaling runs' scale). Open-loop Poisson arrivals are served
# faster (shorter queues, more prefix hits): 320/s still met 89% of P1 SLAs without admission
# (285,000 tokens/s), so the fleet serves about 300/s of them (OVERLOAD_RPS is twice that).
# * admission: 40 s of open-loop Poisson arrivals at OVERLOAD_RPS (ADMISSION_S: without
#   admission P2 -- 60 s SLA -- starves behind P1 until the arrivals stop and the P1 backlog
#   drains; every P2 request arriving after the warm-up waits past its SLA only once the
#   overload lasts about 40 s: 34-40 s waits after 20 s of arrivals, 62-88 s after 40 s),
#   least-loaded routing without admission against the default router with fleet SLA
#   admission;
# * the ingress queue: closed loop at 128 clients per replica (two per seat), off and on;
# * autoscaling: a 35 s peak at 0.8 x the fleet's capacity between quiet spells at 0.15 x; a
#   fixed fleet of 16 (sized for the peak) against the autoscaler between 4 and 16, both with
#   the ingress queue on: late binding keeps a backlog at the ingress, where the autoscaler
#   reads it and whichever replica frees a seat first, a new one too, takes it.
INGRESS_BASE = replace(
    FLEET_BASE,
    max_num_seqs=64,
    workload=replace(FLEET_BASE.workload, duration_s=20.0, warmup_s=5.0),
)
FLEET_CAPACITY_RPS = 160.0
OVERLOAD_RPS = 600.0
ADMISSION_S = 40.0
PEAK_PROFILE = ((0.0, 0.15), (15.0, 0.8), (50.0, 0.15))


def fleet_ingress_configs(
    base: SimConfig = INGRESS_BASE, experiments: tuple[str, ...] = ()
) -> list[FleetConfig]:
    """The scenario's runs; `experiments`: only those (by name: admission, queue, autoscale;
    the label's part before the colon), every one when empty."""
    w = base.workload
    over = replace(w, arrival="poisson", rate=OVERLOAD_RPS, duration_s=ADMISSION_S)
    closed = replace(w, concurrency=FLEET_REPLICAS * 2 * base.max_num_seqs)
    peak = replace(w, arrival="poisson", rate=FLEET_CAPACITY_RPS, duration_s=80.0)
    n = FLEET_REPLICAS

    def run(wl, replicas=n, **kw) -> FleetConfig:
        return FleetConfig(replace(base, workload=wl), replicas, **kw)

    runs = [
        run(over, router="least-loaded", label="admission: off (least-loaded)"),
        run(over, sla_admission=True, label="admission: fleet SLA admission"),
        run(closed, label="queue: off"),
        run(closed, ingress_queue=True, label="queue: on"),
        run(peak, rate_profile=PEAK_PROFILE, ingress_queue=True, label=FIXED_LABEL),
        run(
            peak,
            4,
            rate_profile=PEAK_PROFILE,
            ingress_queue=True,
            autoscale=AutoscaleConfig(4, n),
            label=AUTOSCALE_LABEL,
        ),
    ]
    return [r for r in runs if not experiments or r.label.split(":")[0] in experiments]


def with_sla_admission(base: SimConfig, on: bool = True, margin: float | None = None):
    """`base` with SLA admission on (or off), at `margin` (default: AdmissionConfig's)."""
    adm = replace(base.admission, sla_admission=on)
    return replace(base, admission=adm if margin is None else replace(adm, sla_margin=margin))


def seed_table_configs(base: SimConfig = SEED_BASE, policies=SEED_POLICIES) -> list[SimConfig]:
    return [
        replace(base, policy=p, workload=replace(base.workload, concurrency=c))
        for c in SEED_CONCURRENCY
        for p in policies
    ]


# The seed grid with SLA admission off (fcfs, drr, hybrid: the seed table) and on (fcfs+sla,
# hybrid+sla), side by side. Refused clients retry after their Retry-After, at most 3 times.
SLA_POLICIES = ("fcfs", "hybrid")


def seed_table_sla_configs(margin: float | None = None) -> list[SimConfig]:
    on = with_sla_admission(SEED_BASE, True, margin)
    off = seed_table_configs(SEED_BASE)
    return off + seed_table_configs(on, SLA_POLICIES)


def grid_configs(base: SimConfig, policies, concurrencies) -> list[SimConfig]:
    return [
        replace(base, policy=p, workload=replace(base.workload, concurrency=c))
        for c in concurrencies
        for p in policies
    ]


class Progress:
    """A one-line progress bar on a terminal; off one (a log, CI, a pipe), a line per finished
    run and a line every `heartbeat_s` while runs go on, so a long command is never silent."""

    def __init__(self, total: int, stream=None, heartbeat_s: float = HEARTBEAT_S) -> None:
        # sys.stderr looked up now, not at import: it may have been replaced since.
        self.total, self.done, self.stream = total, 0, stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a heartbeat never lands after the last run's line
        self._beat: threading.Thread | None = None
        if not self.tty and heartbeat_s > 0:
            self._beat = threading.Thread(
                target=self._heartbeat, args=(heartbeat_s,), name="sim-progress", daemon=True
            )
            self._beat.start()

    def _elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def _heartbeat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            with self._lock:
                if self._stop.is_set():
                    return
                self._line(f"{self.done}/{self.total} runs done, still running")

    def _line(self, text: str) -> None:
        self.stream.write(f"simulate: {text} ({self._elapsed():.0f} s)\n")
        self.stream.flush()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.tty:
            with self._lock:
                self._line(f"run {self.done}/{self.total} done: {label}")
                if self.done == self.total:
                    self._stop.set()
            return
        width = 30
        fill = int(width * self.done / self.total)
        self.stream.write(
            f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {label:<24} "
            f"{self._elapsed():5.0f} s"
        )
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()

    def close(self) -> None:
        self._stop.set()


def _run(cfg: SimConfig | FleetConfig) -> dict:
    return run_fleet(cfg) if isinstance(cfg, FleetConfig) else run_simulation(cfg)


def _label(cfg: SimConfig | FleetConfig) -> str:
    if isinstance(cfg, FleetConfig):
        w = cfg.sim.workload
        return f"{cfg.name} x {w.concurrency if w.arrival == 'closed' else f'{w.rate:g}/s'}"
    return f"{cfg.policy} x {cfg.workload.concurrency}"


def run_grid(
    configs: list[SimConfig] | list[FleetConfig], workers: int | None = None
) -> list[dict]:
    """Run every config (one replica or a fleet; in parallel processes), results in config
    order."""
    workers = workers or min(len(configs), os.cpu_count() or 1)
    bar = Progress(len(configs))
    results: list[dict | None] = [None] * len(configs)
    try:
        if workers <= 1:
            for i, cfg in enumerate(configs):
                results[i] = _run(cfg)
                bar.step(_label(cfg))
            return results  # type: ignore[return-value]
        with ProcessPoolExecutor(workers) as pool:
            futures = {pool.submit(_run, cfg): i for i, cfg in enumerate(configs)}
            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = fut.result()
                bar.step(_label(configs[i]))
        return results  # type: ignore[return-value]
    finally:
        bar.close()


def run_keyed(grid, summarise, workers: int | None = None, json_path: str | None = None):
    """Run a grid of (key, config) pairs; each key with its summarised result, in grid order,
    also written to `json_path` (a list of {"key": [...], **figures}) when given."""
    results = run_grid([cfg for _, cfg in grid], workers)
    rows = [(key, summarise(r)) for (key, _), r in zip(grid, results, strict=True)]
    if json_path:
        with open(json_path, "w") as f:
            json.dump([{"key": list(k), **m} for k, m in rows], f, indent=1)
    return rows
