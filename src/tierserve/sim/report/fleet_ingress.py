"""The fleet ingress scenario's part of the fleet report (``--scenario fleet-ingress``):
issue 24's simulated targets and one table of every run (runs are named by their label,
``experiment: variant``)."""

from __future__ import annotations

EXPERIMENTS = ("admission", "queue", "autoscale")
# The autoscaling experiment's two runs (sim/scenarios.py names them).
FIXED_LABEL, AUTOSCALE_LABEL = "autoscale: fixed 16, queue on", "autoscale: 4:16, queue on"


def _runs(results: list[dict]) -> dict[str, dict]:
    return {r["run"]: r for r in results if r.get("run", "").split(":")[0] in EXPERIMENTS}


def _att(r: dict, c: str) -> float:
    return r["classes"][c]["sla_attainment"] or 0.0


def _p95(r: dict, c: str) -> float:
    return r["classes"][c]["ttft_p95_s"] or float("inf")


def _tput(r: dict) -> float:
    return r["throughput_total_tokens_per_s"]


def _admission(runs: dict[str, dict]) -> list[tuple[str, bool, str]]:
    off, on = runs.get("admission: off (least-loaded)"), runs.get("admission: fleet SLA admission")
    if not (off and on):
        return []
    p0, p1, p2 = _att(on, "P0"), _att(on, "P1"), _att(on, "P2")
    gain = on["goodput_requests_per_s"] / max(off["goodput_requests_per_s"], 1e-9)
    tput = _tput(on) / _tput(off)
    return [
        (
            "fleet SLA admission at 2x overload: admitted P0 >= 99% and P1/P2 >= 95% on time",
            p0 >= 0.99 and p1 >= 0.95 and p2 >= 0.95,
            f"P0 {100 * p0:.1f}%, P1 {100 * p1:.1f}%, P2 {100 * p2:.1f}%",
        ),
        (
            "goodput >= 2x least-loaded routing without admission",
            gain >= 2.0,
            f"{on['goodput_requests_per_s']:.1f} vs {off['goodput_requests_per_s']:.1f} "
            f"requests/s on time: {gain:.2f}x",
        ),
        ("throughput within 3%", abs(tput - 1) <= 0.03, f"{100 * tput:.1f}%"),
    ]


def _queue(runs: dict[str, dict]) -> list[tuple[str, bool, str]]:
    off, on = runs.get("queue: off"), runs.get("queue: on")
    if not (off and on):
        return []
    p1 = _p95(on, "P1") / _p95(off, "P1")
    tput = _tput(on) / _tput(off)
    p0 = (_p95(on, "P0"), _p95(off, "P0"))
    return [
        (
            "ingress queue on vs off: P1 P95 TTFT >= 25% lower at equal throughput (within 3%)",
            p1 <= 0.75 and abs(tput - 1) <= 0.03,
            f"{_p95(on, 'P1'):.2f} s vs {_p95(off, 'P1'):.2f} s ({100 * (1 - p1):+.0f}% lower), "
            f"throughput {100 * tput:.1f}%",
        ),
        (
            "ingress queue on: P0 P95 TTFT unchanged or better (within 5%)",
            p0[0] <= 1.05 * p0[1],
            f"{p0[0]:.3f} s vs {p0[1]:.3f} s",
        ),
    ]


def _autoscale(runs: dict[str, dict]) -> list[tuple[str, bool, str]]:
    fixed, auto = runs.get(FIXED_LABEL), runs.get(AUTOSCALE_LABEL)
    if not (fixed and auto):
        return []
    a, f = auto["replica_seconds_per_on_time_p0_p1"], fixed["replica_seconds_per_on_time_p0_p1"]
    ok = a is not None and f is not None and a < f
    return [
        (
            "autoscaling: replica-seconds per on-time P0/P1 request below a fixed fleet sized "
            "for the peak",
            ok,
            f"{a or float('nan'):.3f} vs {f or float('nan'):.3f}",
        )
    ]


def ingress_targets(results: list[dict]) -> list[tuple[str, bool, str]]:
    runs = _runs(results)
    return [*_admission(runs), *_queue(runs), *_autoscale(runs)]


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def ingress_table(results: list[dict]) -> list[str]:
    runs = _runs(results)
    if not runs:
        return []
    lines = [
        "## The ingress's pieces",
        "",
        "| run | load | P0 on time | P1 on time | P2 on time | P0 TTFT p95 | P1 TTFT p95 | "
        "refused P0/P1/P2/P3 | goodput req/s | all tok/s | replica-s | replica-s per on-time "
        "P0/P1 | replicas used |",
        "|" + "---|" * 13,
    ]
    for name, r in runs.items():
        c = r["classes"]
        load = f"{r['concurrency']} clients" if r["concurrency"] else f"{r['rate']:g}/s"
        if r["config"].get("rate_profile"):
            load += " x " + ", ".join(f"{f:g} from {t:g} s" for t, f in r["config"]["rate_profile"])
        w = r["config"]["workload"]
        load += f"; {w['duration_s']:g} s, measured from {w['warmup_s']:g} s"
        per = r["replica_seconds_per_on_time_p0_p1"]
        lines.append(
            f"| {name} | {load} | {_pct(c['P0']['sla_attainment'])} | "
            f"{_pct(c['P1']['sla_attainment'])} | {_pct(c['P2']['sla_attainment'])} | "
            f"{_p95(r, 'P0'):.3f} s | {_p95(r, 'P1'):.2f} s | "
            f"{'/'.join(str(c[k]['refused']) for k in ('P0', 'P1', 'P2', 'P3'))} | "
            f"{r['goodput_requests_per_s']:.1f} | {_tput(r):,.0f} | {r['replica_seconds']:.0f} | "
            f"{'–' if per is None else f'{per:.3f}'} | {r['replicas_used']} |"
        )
    scaled = [r for r in runs.values() if r["scale_decisions"]]
    for r in scaled:
        steps = ", ".join(
            f"{d['time']:.0f} s {d['current']}→{d['wanted']} ({d['reason']})"
            for d in r["scale_decisions"]
        )
        lines += ["", f"Scaling decisions ({r['run']}): {steps}."]
    return lines
