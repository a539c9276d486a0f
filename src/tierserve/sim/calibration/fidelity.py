"""`tierserve sim-fidelity`: one scaled-down workload run twice through the same driver: on the
real CPU engine (wall clock, torch executor, embedded model) and in the simulator (virtual
clock, cost model with the calibrated cpu-local profile). Same scheduler, policy, KV manager,
seeds and settings; only the executor and the clock differ. Prints throughput and P95 TTFT
for both and how far apart they are (target: within 15%)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from tierserve.admission import AdmissionController
from tierserve.sim.calibration.profiles import profile_notes
from tierserve.sim.engine.driver import drive
from tierserve.sim.engine.runner import SIM_ADMISSION, SimConfig, build
from tierserve.sim.engine.stats import percentile, run_stats
from tierserve.workloads.synthetic import CPU_CLASSES, Workload, WorkloadConfig

log = logging.getLogger(__name__)

# The default mix and shapes, lengths scaled down ~10x so a 2-core CPU can serve them.
ENGINE = dict(max_num_seqs=32, max_num_batched_tokens=512, block_size=16)


def build_real_engine(kv_cache_gib: float = 0.25):
    """The real CPU engine (embedded model, wall clock) with the settings the fidelity check
    and `tierserve calibrate` both use, so the calibrated profile describes this engine."""
    from tierserve.clock import WallClock
    from tierserve.engine.args import EngineArgs
    from tierserve.engine.builder import build_engine

    return build_engine(
        EngineArgs(
            kv_cache_gib=kv_cache_gib,
            swap_space_gib=0.0,
            p0_express="exclusive",
            max_num_seqs=ENGINE["max_num_seqs"],
            max_num_batched_tokens=ENGINE["max_num_batched_tokens"],
        ),
        clock=WallClock(),
    )


def sleeper(clock):
    """The driver's idle_until for a wall clock: sleep until time `t`."""

    def sleep_until(t: float) -> None:
        time.sleep(max(0.0, t - clock.now()))

    return sleep_until


def _summary(result, lo, hi, priorities) -> dict:
    stats = run_stats(result, lo, hi, priorities)
    ttft = [
        r.first_token - r.arrival
        for r in result.records
        if lo <= r.arrival < hi and r.first_token is not None
    ]
    stats["ttft_p95_s"] = percentile(ttft, 95)
    stats["ttft_p50_s"] = percentile(ttft, 50)
    return stats


def run_fidelity(hardware: str, duration: float, clients: int, seed: int) -> dict:
    notes = profile_notes(hardware)  # before the long run: which file, fitted where
    for line in notes:
        log.warning("%s", line)
    built = build_real_engine()
    wl = WorkloadConfig(
        classes=CPU_CLASSES,
        concurrency=clients,
        duration_s=duration,
        warmup_s=duration / 6,
        ramp_s=1.0,
        seed=seed,
        vocab_size=built.model_config.vocab_size,
    )
    core = built.engine
    priorities = replace(SimConfig()).priorities
    adm = AdmissionController(SIM_ADMISSION, core.scheduler, core.clock, priorities)
    t0 = time.perf_counter()

    start = core.clock.now()
    real = drive(core, Workload(wl), adm, sleeper(core.clock))
    real_wall = time.perf_counter() - t0
    # Shift the real run's times so that its window matches the workload's.
    for r in real.records:
        r.arrival -= start
        r.first_token = None if r.first_token is None else r.first_token - start
        r.finish = None if r.finish is None else r.finish - start
    for s in real.samples:
        s.time -= start
    lo, hi = wl.warmup_s, wl.duration_s
    real_stats = _summary(real, lo, hi, priorities)

    cfg = SimConfig(
        policy="hybrid",
        hardware=hardware,
        model="smollm2-135m",
        tp=1,
        block_size=ENGINE["block_size"],
        max_num_seqs=ENGINE["max_num_seqs"],
        max_num_batched_tokens=ENGINE["max_num_batched_tokens"],
        swap_gib_per_device=0.0,
        p0_express="exclusive",
        num_kv_blocks=core.scheduler.make_stats().kv.num_blocks,
        workload=wl,
    )
    engine, _ex, _cost = build(cfg)
    sim_adm = AdmissionController(SIM_ADMISSION, engine.scheduler, engine.clock, priorities)
    sim = drive(engine, Workload(wl), sim_adm, engine.clock.set)
    sim_stats = _summary(sim, lo, hi, priorities)
    return {
        "real": real_stats,
        "sim": sim_stats,
        "real_wall_s": real_wall,
        "hardware": hardware,
        "notes": notes,
        "clients": clients,
        "duration_s": duration,
    }


def format_fidelity(rep: dict) -> str:
    real, sim = rep["real"], rep["sim"]
    rows = [
        ("throughput, all tokens/s", "throughput_total_tokens_per_s"),
        ("throughput, generated tokens/s", "throughput_tokens_per_s"),
        ("TTFT P50 (s)", "ttft_p50_s"),
        ("TTFT P95 (s)", "ttft_p95_s"),
        ("completed requests", "completed"),
    ]
    lines = [
        *rep.get("notes", ()),
        f"{rep['clients']} closed-loop clients, {rep['duration_s']:.0f} s, hybrid, real engine vs "
        f"simulator with profile {rep['hardware']!r}",
        f"{'':34}{'real':>10}{'sim':>10}{'diff':>9}",
    ]
    verdicts = []
    for name, key in rows:
        a, b = real[key], sim[key]
        diff = abs(b - a) / a if a else float("nan")
        lines.append(f"{name:34}{a:>10.3f}{b:>10.3f}{100 * diff:>8.1f}%")
        if key in ("throughput_total_tokens_per_s", "ttft_p95_s"):
            verdicts.append((name, diff))
    for name, diff in verdicts:
        lines.append(f"{'PASS' if diff <= 0.15 else 'MISS'}: {name} within 15% ({100 * diff:.1f}%)")
    return "\n".join(lines)
