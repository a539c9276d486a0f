"""Why SLA admission runs with margin 0.8 and hybrid's SLA urgency at 1.0 (docs/scheduling.md):
the seed table's configuration at 256 and 512 clients, SLA admission on, each choice varied.

    python benchmarks/simulation/sla_ablation.py            # 8 runs of 600 simulated s, ~2 min on
    2 cores
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from tierserve.sim.scenarios import SEED_BASE, run_grid, with_sla_admission

VARIANTS = (  # (margin, urgency)
    (0.8, 1.0),
    (1.0, 1.0),
    (0.8, 0.2),
    (1.0, 0.2),
)


def late(s: dict) -> int:
    """Admitted requests of a class whose first token missed the SLA."""
    admitted = s["requests"] - s["refused"] - s["demoted"] - s["unfinished"]
    return round(admitted * (1 - (s["sla_attainment"] or 1.0)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[256, 512])
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args()
    cfgs = [
        replace(
            with_sla_admission(SEED_BASE, True, margin),
            policy="hybrid",
            sla_urgency_fraction=urgency,
            workload=replace(SEED_BASE.workload, concurrency=c),
        )
        for c in args.concurrency
        for margin, urgency in VARIANTS
    ]
    print(
        "| clients | margin | urgency | goodput/s | P1 SLA | P2 SLA | P1 late | P2 late | "
        "P1 |err| P90 | P2 |err| P90 |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cfg, r in zip(cfgs, run_grid(cfgs, args.workers), strict=True):
        c = r["classes"]

        print(
            f"| {cfg.workload.concurrency} | {cfg.admission.sla_margin} | "
            f"{cfg.sla_urgency_fraction} | {r['goodput_requests_per_s']:.2f} | "
            f"{100 * c['P1']['sla_attainment']:.1f}% | {100 * c['P2']['sla_attainment']:.1f}% | "
            f"{late(c['P1'])} | {late(c['P2'])} | "
            f"{c['P1']['ttft_prediction_abs_error_p90_s']:.2f} s | "
            f"{c['P2']['ttft_prediction_abs_error_p90_s']:.2f} s |"
        )


if __name__ == "__main__":
    main()
