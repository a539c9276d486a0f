"""Predictive routing on the simulated fleet (issue 26): the heavy-tailed mix (sim/heavy_tail.py)
on 4 replicas of Llama-3.1-8B, each on one H100-80GB with its KV cache capped at 2,500 blocks
(40k tokens: memory pressure), hybrid policy, priority-aware routing, with each replica's ranking
figures as today (`outstanding_tokens` counts every running request's `max_tokens`) or from its
length predictor (`SimConfig.predictive_routing`: `--predictive routing` when served; routing/
rank.py). Closed loop at two loads, 60 simulated s, 15 s warm-up.

    PYTHONPATH=src nice -n 10 .venv/bin/python benchmarks/simulation/predictive_fleet_sim.py   # ~4
    min

Simulated figures (virtual clock, cost model): no CPU dependence except wall time.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from predictive_sim import _f, class_figures  # a sibling script: python benchmarks/...

from tierserve.sim.engine.runner import SimConfig
from tierserve.sim.fleet.model import FleetConfig, run_fleet
from tierserve.workloads.synthetic import WorkloadConfig

BASE = SimConfig(
    hardware="h100-80gb",
    model="llama-3.1-8b",
    tp=1,
    block_size=16,
    max_num_seqs=128,
    max_num_batched_tokens=2048,
    num_kv_blocks=2500,
    policy="hybrid",
    workload=WorkloadConfig(duration_s=60.0, warmup_s=15.0, seed=0, lengths="heavy_tail"),
)


def summary(r: dict) -> dict:
    return {**class_figures(r), "routed": (r["routed_min"], r["routed_max"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--concurrency", type=int, nargs="+", default=[192, 384])
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    print(
        "| clients | predictive routing | preemptions | total tok/s | out tok/s | P1 P95 e2e s "
        "| P1 mean TTFT s | P2 mean TTFT s | P0 P95 TTFT s | worst TTFT s | requests per replica |"
    )
    print("|---" * 11 + "|")
    rows = []
    for c in args.concurrency:
        wl = replace(BASE.workload, concurrency=c, duration_s=args.duration,
                     warmup_s=args.duration / 4)  # fmt: skip
        for on in (False, True):
            sim = replace(BASE, predictive_routing=on, workload=wl)
            m = summary(run_fleet(FleetConfig(sim, args.replicas)))
            rows.append({"clients": c, "predictive_routing": on, **m})
            print(
                f"| {c} | {'on' if on else 'off'} | {m['preemptions']} | {m['throughput']:.0f} "
                f"| {m['output_throughput']:.0f} | {_f(m['p1_e2e_p95'], 1)} "
                f"| {_f(m['p1_ttft_mean'])} | {_f(m['p2_ttft_mean'])} | {_f(m['p0_ttft_p95'])} "
                f"| {_f(m['worst_ttft'], 1)} | {m['routed'][0]}-{m['routed'][1]} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
