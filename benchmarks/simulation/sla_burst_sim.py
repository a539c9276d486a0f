"""Issue 46's bursts in the simulator (sim/burst.py): P0-only bursts of 6 to 75 and a shuffled
mixed burst of 300 (75 per class), all sent at once, on the CPU engine's step times (`cpu-local`,
SmolLM2-135M), SLA admission off and on. Per class: sent, admitted, admitted fraction, on time
(first token within the class's SLA) as a fraction of the admitted, and the worst TTFT.

    PYTHONPATH=src .venv/bin/python benchmarks/simulation/sla_burst_sim.py      # ~1 min on 2 cores

Deterministic: the same numbers on any machine. A "before" needs the old code: run this file
with `PYTHONPATH=<old checkout>/src` (it imports only sim/burst.py).
"""

from __future__ import annotations

import argparse

from tierserve.sim.burst import burst


def row(name: str, admission: bool, res: dict) -> list[str]:
    out = []
    for label, r in res.items():
        frac = r["admitted"] / r["sent"]
        on_time = r["on_time"] / r["admitted"] if r["admitted"] else 0.0
        worst = f"{r['worst_ttft_s']:.2f}" if r["worst_ttft_s"] is not None else "-"
        out.append(
            f"| {name} | {'on' if admission else 'off'} | {label} | {r['sent']} | "
            f"{r['admitted']} ({frac:.0%}) | {r['on_time']} ({on_time:.0%}) | {worst} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mixed", action="store_true", help="skip the 300-request mixed burst")
    args = ap.parse_args()
    print(
        "| burst | SLA admission | class | sent | admitted | on time (of admitted) | worst TTFT s |"
    )
    print("|---|---|---|---|---|---|---|")
    bursts = [(f"P0 x{n}", (n, 0, 0, 0)) for n in (6, 10, 20, 30, 75)]
    if not args.no_mixed:
        bursts.append(("mixed 4x75", (75, 75, 75, 75)))
    for name, counts in bursts:
        for admission in (False, True):
            for line in row(name, admission, burst(counts, admission, args.seed)):
                print(line, flush=True)


if __name__ == "__main__":
    main()
