"""`tierserve calibrate`: measure the real CPU engine over batch compositions and fit the cost
model's coefficients, writing a `cpu-local` hardware profile.

On a CPU, compute and memory traffic do not overlap well, so the profile uses the additive form
``t = overhead + per_seq * n + linear_flops / F + attention_flops / F_attn + weight_bytes / B
+ kv_bytes / B_kv``; the six coefficients are fitted by non-negative least squares on whole
engine steps (schedule + forward + sampling + bookkeeping) recorded while the real engine serves
closed-loop load at several concurrency levels and prompt lengths, so the compositions are the
ones serving produces (prefill chunks, decode batches, mixes) and every per-step cost is in.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from tierserve.admission import AdmissionController
from tierserve.host.machine import describe, machine_fingerprint
from tierserve.sim.calibration.profiles import HardwareProfile, ModelProfile
from tierserve.sim.engine.cost_model import CostModel


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by an active-set loop (Lawson-Hanson), enough for 6 terms."""
    x = np.zeros(a.shape[1])
    free: list[int] = []
    for _ in range(50):
        w = a.T @ (b - a @ x)
        cand = [j for j in range(a.shape[1]) if j not in free and w[j] > 1e-12]
        if not cand:
            break
        free.append(max(cand, key=lambda j: w[j]))
        while True:
            z = np.zeros_like(x)
            z[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
            if all(z[j] > 0 for j in free):
                x = z
                break
            neg = [j for j in free if z[j] <= 0]
            alphas = [x[j] / (x[j] - z[j]) for j in neg]
            x = x + min(alphas) * (z - x)
            free = [j for j in free if x[j] > 1e-15]
    return x


class _Recorder:
    """Wraps an executor; remembers each step's (new tokens, context) chunks and samples."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.ctx: dict[str, int] = {}
        self.last: tuple[list[tuple[int, int]], int] = ([], 0)

    def preemption_costs(self):
        return self.inner.preemption_costs()

    def execute(self, out):
        for new in out.scheduled_new:
            self.ctx[new.request_id] = new.num_computed_tokens
        for cached in out.scheduled_cached:
            self.ctx[cached.request_id] = cached.num_computed_tokens
        chunks = [(n, self.ctx[rid] + n) for rid, n in out.num_scheduled_tokens.items()]
        result = self.inner.execute(out)
        self.last = (chunks, len(result.sampled_token_ids))
        return result


# (clients, P1 prompt median) per phase: light to heavy load, short and long prompts.
PHASES = [(1, 120), (4, 120), (12, 120), (32, 120), (4, 600), (16, 400)]


def record_steps(built, seconds_per_phase: float) -> list[tuple[list, int, float]]:
    """Serve each phase's closed-loop load on the real engine; return (chunks, sampled, step
    seconds) for every step."""
    from tierserve.sim.calibration.fidelity import sleeper
    from tierserve.sim.engine.driver import drive
    from tierserve.sim.engine.runner import SIM_ADMISSION
    from tierserve.workloads.synthetic import (
        CPU_CLASSES,
        ClassSpec,
        LengthDist,
        Workload,
        WorkloadConfig,
    )

    core = built.engine
    rec = _Recorder(core.executor)
    core.executor = rec
    rows: list[tuple[list, int, float]] = []
    step = core.step

    def timed_step():
        t0 = time.perf_counter()
        changed = step()
        rows.append((*rec.last, time.perf_counter() - t0))
        return changed

    core.step = timed_step
    for i, (clients, p1_prompt) in enumerate(PHASES):
        classes = dict(CPU_CLASSES)
        p1 = classes[list(classes)[1]]
        classes[list(classes)[1]] = ClassSpec(
            LengthDist(p1_prompt, 0.6, 16, 4 * p1_prompt), p1.output
        )
        wl = WorkloadConfig(
            classes=classes,
            concurrency=clients,
            duration_s=seconds_per_phase,
            warmup_s=0.0,
            ramp_s=0.5,
            seed=100 + i,
            vocab_size=built.model_config.vocab_size,
        )
        adm = AdmissionController(SIM_ADMISSION, core.scheduler, core.clock)
        drive(core, Workload(wl), adm, sleeper(core.clock))
    core.step = step
    core.executor = rec.inner
    return [r for r in rows if r[0]]


def fit(rows, cost: CostModel) -> tuple[dict, float]:
    """Fit the additive coefficients; return them and the mean relative error of the fit."""
    feats, ys = [], []
    for chunks, sampled, secs in rows:
        _, lin, attn, w_bytes, kv_bytes = cost.features(chunks, sampled)
        feats.append([1.0, len(chunks), lin, attn, w_bytes, kv_bytes])
        ys.append(secs)
    a, b = np.array(feats), np.array(ys)
    scale = a.max(axis=0)
    x = _nnls(a / scale, b) / scale
    pred = a @ x
    err = float(np.mean(np.abs(pred - b) / b))
    names = (
        "step_overhead_s",
        "per_seq_overhead_s",
        "s_per_lin_flop",
        "s_per_attn_flop",
        "s_per_weight_byte",
        "s_per_kv_byte",
    )
    return dict(zip(names, map(float, x), strict=True)), err


def _eff(seconds_per_unit: float, peak: float) -> float:
    """Efficiency that reproduces a fitted cost per unit; a zero cost becomes "free" (1e6)."""
    return 1.0 / (seconds_per_unit * peak) if seconds_per_unit > 0 else 1e6


def profile_from_fit(
    coef: dict, err: float, rows: list, peak: float, bw: float, dtype: str, fitted_on: dict
) -> dict:
    """The `cpu-local` hardware profile for fitted coefficients, recording the machine it was
    fitted on (`fitted_on`, see machine.py) so a run elsewhere can say it does not apply."""
    return {
        "kind": "hardware",
        "name": "cpu-local",
        "description": (
            f"Fitted by `tierserve calibrate` on {describe(fitted_on)}, {dtype}; "
            f"mean fit error {100 * err:.1f}%"
        ),
        "fitted_on": fitted_on,
        "mode": "additive",
        "peak_flops": peak,
        "mem_bandwidth": bw,
        "memory_bytes": 0,
        "compute_efficiency": _eff(coef["s_per_lin_flop"], peak),
        "attention_efficiency": _eff(coef["s_per_attn_flop"], peak),
        "memory_efficiency": _eff(coef["s_per_weight_byte"], bw),
        "kv_memory_efficiency": _eff(coef["s_per_kv_byte"], bw),
        "allreduce_bus_bandwidth": 1e12,
        "allreduce_latency_s": 0.0,
        "pcie_bandwidth": bw,  # host and "device" are the same memory
        "step_overhead_s": coef["step_overhead_s"],
        "per_seq_overhead_s": coef["per_seq_overhead_s"],
        "activation_headroom_bytes": 0,
        "fit": {
            "coefficients": coef,
            "mean_relative_error": err,
            "samples": [{"chunks": c, "seconds": s} for c, _, s in rows],
        },
    }


def calibrate(
    out: Path, kv_cache_gib: float = 0.25, seconds_per_phase: float = 20.0
) -> tuple[dict, float]:
    import torch

    from tierserve.bench.engine_bench import machine_peaks
    from tierserve.sim.calibration.fidelity import build_real_engine

    built = build_real_engine(kv_cache_gib)
    ex = built.executor
    cfg = built.model_config
    model = ModelProfile(cfg, ex.model.dtype.itemsize)
    peak, bw = machine_peaks()
    probe_hw = HardwareProfile(
        name="probe",
        mode="additive",
        peak_flops=peak,
        mem_bandwidth=bw,
        memory_bytes=0,
        compute_efficiency=1,
        attention_efficiency=1,
        memory_efficiency=1,
        allreduce_bus_bandwidth=1,
        allreduce_latency_s=0,
        pcie_bandwidth=bw,
        step_overhead_s=0,
        per_seq_overhead_s=0,
        activation_headroom_bytes=0,
    )
    cost = CostModel(probe_hw, model, 1)
    rows = record_steps(built, seconds_per_phase)
    coef, err = fit(rows, cost)
    fitted_on = machine_fingerprint(threads=torch.get_num_threads())
    profile = profile_from_fit(coef, err, rows, peak, bw, str(ex.model.dtype), fitted_on)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1))
    return profile, err
