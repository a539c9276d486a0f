"""The fleet-ingress scenario's autoscaling comparison (issue 24; sim/scenarios.py) with the peak
lengthened: a fixed fleet of 16 sized for the peak against the class autoscaler from 4 to 16
(both with the ingress queue on), for each peak length, in replica-seconds per on-time P0/P1
request. The scenario's own peak lasts 35 s (15-50 s) against a replica start of 20 s; a
deployment's peaks last minutes to hours.

    PYTHONPATH=src nice -n 10 .venv/bin/python benchmarks/simulation/autoscale_peak_length.py
    --peak 35 120

The arrivals: 0.15 x 160 requests/s from 0 s, 0.8 x from 15 s, 0.15 x again after the peak,
for 30 s more (`--after`); `--repeat N`: that peak and light spell N times (a day's peaks
between long quiet spells); measured from 5 s. `--fleets autoscale`: only the autoscaler's run
(the fixed fleet's does not depend on the rule). Simulated figures (virtual clock, cost
model): no CPU dependence except wall time (~10 min for a 120 s peak on one core).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from tierserve.sim.report.fleet_ingress import AUTOSCALE_LABEL, FIXED_LABEL
from tierserve.sim.scenarios import fleet_ingress_configs, run_grid

BASE, PEAK, AFTER = 0.15, 0.8, 30.0


def configs(
    peaks: list[float],
    start_s: float | None,
    after: float = AFTER,
    repeat: int = 1,
    fleets: tuple[str, ...] = (FIXED_LABEL, AUTOSCALE_LABEL),
) -> list[tuple[float, object]]:
    out = []
    for peak in peaks:
        profile: tuple[tuple[float, float], ...] = ((0.0, BASE),)
        for i in range(repeat):
            at = 15.0 + i * (peak + after)
            profile += ((at, PEAK), (at + peak, BASE))
        for cfg in fleet_ingress_configs(experiments=("autoscale",)):
            if cfg.name not in fleets:
                continue
            wl = replace(cfg.sim.workload, duration_s=15.0 + repeat * (peak + after))
            cfg = replace(cfg, sim=replace(cfg.sim, workload=wl), rate_profile=profile)
            if start_s is not None and cfg.autoscale is not None:
                cfg = replace(cfg, autoscale=replace(cfg.autoscale, start_s=start_s))
            out.append((peak, cfg))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak", type=float, nargs="+", default=[35.0, 120.0], help="seconds")
    ap.add_argument("--start-s", type=float, default=None, help="replica start (default 20)")
    ap.add_argument("--after", type=float, default=AFTER, help="s of quiet after the peak")
    ap.add_argument("--repeat", type=int, default=1, help="peaks, each followed by --after s")
    ap.add_argument("--fleets", choices=("both", "fixed", "autoscale"), default="both")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    fleets = {"both": (FIXED_LABEL, AUTOSCALE_LABEL), "fixed": (FIXED_LABEL,)}
    fleets["autoscale"] = (AUTOSCALE_LABEL,)
    grid = configs(args.peak, args.start_s, args.after, args.repeat, fleets[args.fleets])
    results = run_grid([c for _, c in grid], args.workers)
    print(
        "| peak | fleet | replica-s | P0 on time | P1 on time | P2 on time | P1 TTFT p95 "
        "| replica-s per on-time P0/P1 | decisions |"
    )
    print("|" + "---|" * 9)
    for (peak, cfg), r in zip(grid, results, strict=True):
        c = r["classes"]
        label = {FIXED_LABEL: "fixed 16", AUTOSCALE_LABEL: "autoscale 4:16"}.get(cfg.name, cfg.name)
        decisions = r.get("scale_decisions") or []
        print(
            f"| {peak:.0f} s | {label} | {r['replica_seconds']:.0f} "
            + " ".join(f"| {100 * (c[p]['sla_attainment'] or 0):.1f}%" for p in ("P0", "P1", "P2"))
            + f" | {c['P1']['ttft_p95_s'] or float('nan'):.2f} s "
            f"| {r['replica_seconds_per_on_time_p0_p1'] or float('nan'):.3f} | {len(decisions)} |"
        )
    for (peak, _cfg), r in zip(grid, results, strict=True):
        if decisions := r.get("scale_decisions"):
            steps = ", ".join(
                f"{d['current']}->{d['wanted']} at {d['time']:.0f} s ({d['reason']})"
                for d in decisions
            )
            print(f"\n{peak:.0f} s peak, decisions: {steps}")


if __name__ == "__main__":
    main()
