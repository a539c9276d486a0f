"""Calm steps (`--p0-calm-fraction 0.1`) off versus on, in the simulator's CPU engine (the
`cpu-local` profile, SmolLM2-135M, the server's CPU defaults: sim/promise.py's CPU config),
short requests (64-token prompts, 32-token outputs, like benchmarks/served/batch_fill.py's lines):

    .venv/bin/python benchmarks/simulation/calm_steps_sim.py

Prints per mix: output tok/s, P0 / P1 / P2 TTFT P95, off and on. Simulated seconds: no CPU
figure (the profile was fitted on the machine docs/benchmarks.md names).
"""

from __future__ import annotations

from dataclasses import replace

from tierserve.priority import Priority
from tierserve.sim.engine.runner import run_simulation
from tierserve.sim.promise import CPU
from tierserve.workloads.synthetic import ClassSpec, LengthDist, WorkloadConfig

SHORT = ClassSpec(LengthDist(64, 0.01, 63, 65), LengthDist(32, 0.01, 31, 33))
MIXES = [("P0 6% beside P2", (0.06, 0.0, 0.94, 0.0), 34), ("bench mix", (0.05, 0.6, 0.3, 0.05), 32)]


def run(calm: float | None, mix, conc: int) -> dict:
    wl = WorkloadConfig(
        classes=dict.fromkeys(Priority, SHORT),
        mix=mix,
        concurrency=conc,
        duration_s=120,
        warmup_s=20,
        seed=1,
    )
    return run_simulation(replace(CPU, p0_calm_fraction=calm, workload=wl))


def main() -> None:
    print("| load | calm | output tok/s | P0 TTFT P95 | P1 TTFT P95 | P2 TTFT P95 |")
    print("|---|---|---|---|---|---|")
    for name, mix, conc in MIXES:
        for calm in (None, 0.1):
            r = run(calm, mix, conc)
            c = r["classes"]

            def ms(k, c=c):
                v = c[k].get("ttft_p95_s")
                return "-" if v is None else f"{1e3 * v:.0f} ms"

            print(
                f"| {name}, {conc} clients | {calm or 'off'} | {r['throughput_tokens_per_s']:.1f} "
                f"| {ms('P0')} | {ms('P1')} | {ms('P2')} |"
            )


if __name__ == "__main__":
    main()
