"""Predictive scheduling on the simulator (issue 26): the heavy-tailed mix (sim/heavy_tail.py) on
the seed-table cluster (Llama-3.1-70B, 8 x A100-80GB, hybrid) and on its memory-pressure variant
(12,000 KV blocks), predictive off versus each use and both, against the issue's targets.

    # 16 runs (see docs); a quick look; SLA admission at 512 clients; three workload seeds;
    # off, memory scenario, 128 clients, seats capped:
    PYTHONPATH=src python benchmarks/simulation/predictive_sim.py
    PYTHONPATH=src python benchmarks/simulation/predictive_sim.py --duration 120
    PYTHONPATH=src python benchmarks/simulation/predictive_sim.py --sla
    PYTHONPATH=src python benchmarks/simulation/predictive_sim.py --scenario memory \
        --concurrency 128 --seeds 0 1 2
    PYTHONPATH=src python benchmarks/simulation/predictive_sim.py --seats 512 96 80 72 64 56 48

`--seats` measures what P1's P95 end-to-end latency costs in throughput without prediction:
the same `off` run with `max_num_seqs` capped at each value (the frontier in
docs/scheduling.md).

Simulated figures (virtual clock, cost model): no CPU dependence except wall time.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from tierserve.sim.scenarios import MEMORY_PRESSURE_BASE, SEED_BASE, run_keyed, with_sla_admission

SCENARIOS = {"seed": SEED_BASE, "memory": MEMORY_PRESSURE_BASE}
VARIANTS = {  # name -> (order by prediction?, predictive_reserve); the bound: --order-s
    "off": (0.0, False),
    "order": (1.0, False),
    "reserve": (0.0, True),
    "both": (1.0, True),
}


def heavy_tail(base, duration):
    """`base`'s workload, heavy-tailed, `duration` simulated s (a quarter of it warm-up)."""
    return replace(base.workload, lengths="heavy_tail", duration_s=duration, warmup_s=duration / 4)


def configs(scenarios, concurrency, duration, order_s, seeds=(0,)):
    out = []
    for s in scenarios:
        base = SCENARIOS[s]
        wl = heavy_tail(base, duration)
        for c in concurrency:
            for seed in seeds:
                for v, (order, reserve) in VARIANTS.items():
                    cfg = replace(
                        base,
                        policy="hybrid",
                        predictive_order_s=order_s if order else 0.0,
                        predictive_reserve=reserve,
                        workload=replace(wl, concurrency=c, seed=seed),
                    )
                    out.append(((s, c, v if len(seeds) == 1 else f"{v}, seed {seed}"), cfg))
    return out


SLA_VARIANTS = {  # name -> (order?, reserve, ttft)
    "off": (False, False, False),
    "ttft": (False, False, True),
    "all": (True, True, True),
}


def sla_configs(concurrency, duration, order_s):
    base = with_sla_admission(SEED_BASE)
    wl = heavy_tail(base, duration)
    return [
        (
            ("seed+sla", c, v),
            replace(
                base,
                policy="hybrid",
                predictive_order_s=order_s if order else 0.0,
                predictive_reserve=reserve,
                predictive_ttft=ttft,
                workload=replace(wl, concurrency=c),
            ),
        )
        for c in concurrency
        for v, (order, reserve, ttft) in SLA_VARIANTS.items()
    ]


def seat_configs(concurrency, duration, seats):
    """`off` on the memory-pressure scenario with at most `n` running requests, for each n."""
    base = MEMORY_PRESSURE_BASE
    wl = heavy_tail(base, duration)
    return [
        (
            ("memory", c, f"off, seats {n}"),
            replace(base, policy="hybrid", max_num_seqs=n, workload=replace(wl, concurrency=c)),
        )
        for c in concurrency
        for n in seats
    ]


def _f(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def class_figures(r: dict) -> dict:
    """The issue's figures of one simulated run (an engine's report or a fleet's)."""
    c = r["classes"]
    return {
        "preemptions": r["preemptions"]["swap"] + r["preemptions"]["recompute"],
        "throughput": r["throughput_total_tokens_per_s"],
        "output_throughput": r["throughput_tokens_per_s"],
        "p1_e2e_p95": c["P1"]["e2e_p95_s"],
        "p1_ttft_mean": c["P1"]["ttft_mean_s"],
        "p2_ttft_mean": c["P2"]["ttft_mean_s"],
        "p0_ttft_p95": c["P0"]["ttft_p95_s"],
        "worst_ttft": max((x["ttft_max_s"] or 0.0) for x in c.values()),
    }


def summary(r: dict) -> dict:
    return {
        **class_figures(r),
        "completed": r["completed"],
        "goodput": r["goodput_requests_per_s"],
        "failed": r["failed"],
        "predictor_error": r["predictor_error"],
        "preempted_requests": r.get("preempted_requests"),
        "preemption_causes": r.get("preemption_causes"),
    }


def table(rows) -> str:
    head = (
        "| scenario | clients | predictive | preemptions | total tok/s | P1 P95 e2e s "
        "| P1 mean TTFT s | P2 mean TTFT s | P0 P95 TTFT s | worst TTFT s | out tok/s "
        "| goodput req/s |"
    )
    lines = [head, "|" + "---|" * 12]
    for (s, c, v), m in rows:
        lines.append(
            f"| {s} | {c} | {v} | {m['preemptions']} | {m['throughput']:.0f} "
            f"| {_f(m['p1_e2e_p95'], 1)} | {_f(m['p1_ttft_mean'])} | {_f(m['p2_ttft_mean'])} "
            f"| {_f(m['p0_ttft_p95'])} | {_f(m['worst_ttft'], 1)} | {m['output_throughput']:.0f} "
            f"| {m['goodput']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--concurrency", type=int, nargs="+", default=[128, 256])
    p.add_argument("--duration", type=float, default=300.0, help="simulated s of arrivals")
    p.add_argument("--order-s", type=float, default=5.0, help="the aging bound A when ordering")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--json", help="write every summary here")
    p.add_argument("--sla", action="store_true", help="SLA admission on, --concurrency 512")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="the workload's seeds")
    p.add_argument(
        "--seats", type=int, nargs="+",
        help="predictive off on the memory scenario with max_num_seqs capped at each (128 clients "
        "unless --concurrency)"
    )  # fmt: skip
    args = p.parse_args()
    if args.seats:
        conc = args.concurrency if args.concurrency != [128, 256] else [128]
        grid = seat_configs(conc, args.duration, args.seats)
    elif args.sla:
        conc = args.concurrency if args.concurrency != [128, 256] else [512]
        grid = sla_configs(conc, args.duration, args.order_s)
    else:
        grid = configs(args.scenario, args.concurrency, args.duration, args.order_s, args.seeds)
    print(table(run_keyed(grid, summary, args.workers, args.json)))


if __name__ == "__main__":
    main()
