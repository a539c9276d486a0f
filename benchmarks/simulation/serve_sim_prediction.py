"""The simulator's prediction for the real-engine seed experiment (serve_seed_experiment.sh):
the same class mix, per-class lengths (`tierserve bench serve --lengths/--length-scale`),
closed-loop concurrencies, duration, warm-up, seed and engine settings, run on the calibrated
`cpu-local` profile with the SmolLM2-135M model profile. Writes a `tierserve simulate` output
folder (results.json, report.md, plots) that `tierserve bench serve --compare` reads.

`tierserve simulate` has no option for scaled-down lengths, so this calls the simulator's
Python API with the load generator's `class_specs` (the same function the load generator uses).

    python benchmarks/simulation/serve_sim_prediction.py --out out/serve-seed/sim \
        --concurrency 16 64 --duration 120 --warmup 30 --lengths cpu
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tierserve.loadgen.report import fmt
from tierserve.loadgen.workload import class_specs
from tierserve.sim.engine.runner import SimConfig
from tierserve.sim.report.engine import write_markdown, write_plots
from tierserve.sim.scenarios import grid_configs, run_grid
from tierserve.workloads.synthetic import WorkloadConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--policy", action="append", help="repeatable (default fcfs, drr, hybrid)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mix", type=float, nargs=4, default=[5, 60, 30, 5])
    p.add_argument("--lengths", choices=["sim", "cpu"], default="cpu")
    p.add_argument("--length-scale", type=float, default=1.0)
    p.add_argument("--hardware", default="cpu-local")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--num-kv-blocks", type=int, default=1456)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args()
    wl = WorkloadConfig(
        mix=tuple(m / 100 for m in a.mix),
        classes=class_specs(a.lengths, a.length_scale),
        duration_s=a.duration,
        warmup_s=a.warmup,
        seed=a.seed,
        vocab_size=49152,
    )
    base = SimConfig(
        hardware=a.hardware,
        model="smollm2-135m",
        tp=1,
        block_size=16,
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        swap_gib_per_device=0.0,
        p0_express="exclusive",  # the server's default on a CPU
        num_kv_blocks=a.num_kv_blocks,
        workload=wl,
    )
    configs = grid_configs(base, a.policy or ["fcfs", "drr", "hybrid"], a.concurrency)
    results = run_grid(configs, a.workers)
    title = f"Simulator prediction ({a.hardware}) for the real-engine seed experiment"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_markdown(results, out / "report.md", title)
    print(f"wrote {out / 'results.json'}, {out / 'report.md'}")
    try:
        write_plots(results, out)
    except ValueError as exc:  # a class with no first token in any run (a very short run)
        print(f"no plots: {exc}")
    for r in results:
        c = r["classes"]
        p0, p1 = (fmt(c[k]["ttft_p95_s"]) for k in ("P0", "P1"))
        print(
            f"{r['policy']:>6} x {r['concurrency']:>3}: TTFT p95 P0 {p0}, P1 {p1}; "
            f"all tokens/s {r['throughput_total_tokens_per_s']:.1f}"
        )


if __name__ == "__main__":
    main()
