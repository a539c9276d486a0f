"""The seed's preemption claim on the simulator (issue 26): choosing swap or recompute by cost
"cuts preemption overhead by ~15%". The memory-pressure scenario (Llama-3.1-70B on 8 x A100-80GB,
12,000 KV blocks, 16 GiB of swap per device, hybrid) with the heavy-tailed mix, each preemption
mode (swap only, recompute only, by cost) with predictive scheduling off and on (order + reserve),
over several workload seeds. Preemption time: the swap copies (both ways) plus what recomputed
tokens added to their steps (sim/executor.py), over the whole run, in simulated seconds.

    PYTHONPATH=src python benchmarks/simulation/preemption_cost_sim.py              # 36 runs, see
    docs
    PYTHONPATH=src python benchmarks/simulation/preemption_cost_sim.py --seeds 0 --duration 120

Simulated figures (virtual clock, cost model): no CPU dependence except wall time.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from tierserve.sim.scenarios import MEMORY_PRESSURE_BASE, run_keyed

MODES = ("swap", "recompute", "auto")  # "auto": by cost (core/preemption.py)
PREDICTIVE = {"off": (0.0, False), "on": (5.0, True)}  # (order bound A, reserve)


def configs(concurrency, duration, seeds, base=MEMORY_PRESSURE_BASE):
    out = []
    for c in concurrency:
        for pred, (order_s, reserve) in PREDICTIVE.items():
            for mode in MODES:
                for seed in seeds:
                    wl = replace(
                        base.workload,
                        lengths="heavy_tail",
                        duration_s=duration,
                        warmup_s=duration / 4,
                        concurrency=c,
                        seed=seed,
                    )
                    cfg = replace(
                        base,
                        policy="hybrid",
                        preemption_mode=mode,
                        predictive_order_s=order_s,
                        predictive_reserve=reserve,
                        workload=wl,
                    )
                    out.append(((c, pred, mode, seed), cfg))
    return out


def figures(r: dict) -> dict:
    t, p = r["preemption_time"], r["preemptions"]
    return {
        "swaps": p["swap"],
        "recomputes": p["recompute"],
        "swap_s": t["swap_s"],
        "recompute_s": t["recompute_s"],
        "recompute_tokens": t["recompute_tokens"],
        "total_s": t["total_s"],
        "throughput": r["throughput_total_tokens_per_s"],
        "p1_e2e_p95": r["classes"]["P1"]["e2e_p95_s"],
    }


def table(rows: list[tuple[tuple, dict]]) -> str:
    """One line per (clients, predictive, mode): the mean over seeds, and each seed's total."""
    groups: dict[tuple, list[dict]] = {}
    for (c, pred, mode, _), m in rows:
        groups.setdefault((c, pred, mode), []).append(m)
    head = (
        "| clients | predictive | mode | swaps | recomputes | swap s | recompute s "
        "| preemption s (mean) | per seed | vs better single mode | total tok/s | P1 P95 e2e s |"
    )
    lines = [head, "|" + "---|" * 12]
    for (c, pred, mode), ms in groups.items():

        def mean(k, ms=ms):
            return statistics.fmean(m[k] for m in ms)

        singles = [
            statistics.fmean(m["total_s"] for m in groups[(c, pred, x)])
            for x in ("swap", "recompute")
            if (c, pred, x) in groups
        ]
        best = min(singles) if singles else None
        seeds = " / ".join(f"{m['total_s']:.2f}" for m in ms)
        vs = f"{100 * (mean('total_s') / best - 1):+.1f}%" if mode == "auto" and best else ""
        lines.append(
            f"| {c} | {pred} | {'by cost' if mode == 'auto' else mode + ' only'} "
            f"| {mean('swaps'):.0f} | {mean('recomputes'):.0f} | {mean('swap_s'):.2f} "
            f"| {mean('recompute_s'):.2f} | {mean('total_s'):.2f} "
            f"| {seeds} | {vs} "
            f"| {mean('throughput'):.0f} | {mean('p1_e2e_p95'):.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[128, 256])
    p.add_argument("--duration", type=float, default=300.0, help="simulated s of arrivals")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--json", help="write every run's figures here")
    args = p.parse_args()
    grid = configs(args.concurrency, args.duration, args.seeds)
    print(table(run_keyed(grid, figures, args.workers, args.json)))


if __name__ == "__main__":
    main()
