"""The SLA-admission part of the simulator's report: goodput, refusals, retries and the TTFT
predictor's error, for runs with SLA admission on (variant `POLICY+sla`) beside the same
policies with it off. Runs are told apart by their variant: the policy, `+sla` when on."""

from __future__ import annotations

from pathlib import Path

ORDER = ("fcfs", "drr", "strict", "wfq", "hybrid")
SLA_CLASSES = ("P0", "P1", "P2")
TARGET_ATTAINMENT = {"P0": 0.99, "P1": 0.95, "P2": 0.95}
STORM_SHARE = 0.5  # retries above half of all arrivals would be a storm


def variant(r: dict) -> str:
    return r.get("variant") or r["policy"]


def variants(results: list[dict]) -> list[str]:
    """Every variant present: the known policies with SLA admission off, then on, then others."""
    present = {variant(r) for r in results}
    known = [p for p in ORDER] + [f"{p}+sla" for p in ORDER]
    return [v for v in known if v in present] + sorted(present - set(known))


def has_sla(results: list[dict]) -> bool:
    return any(r.get("sla_admission") for r in results)


def _by(results):
    return {(variant(r), r["concurrency"]): r for r in results}


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _s(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def sla_targets(results: list[dict]) -> list[tuple[str, bool, str]]:
    """The issue's targets for SLA admission, checked on hybrid+sla at every concurrency."""
    by = _by(results)
    conc = sorted({r["concurrency"] for r in results if variant(r) == "hybrid+sla"})
    if not conc:
        return []
    runs = [by[("hybrid+sla", c)] for c in conc]
    out = []
    for cls, want in TARGET_ATTAINMENT.items():
        att = [(r["classes"][cls]["sla_attainment"], c) for r, c in zip(runs, conc, strict=True)]
        worst = min((a, c) for a, c in att if a is not None)
        out.append(
            (
                f"hybrid+sla {cls} SLA attainment (admitted) >= {100 * want:.0f}% at every "
                "concurrency",
                worst[0] >= want,
                f"worst {_pct(worst[0])} at {worst[1]}",
            )
        )
    for base, factor in (("fcfs", 2.0), ("hybrid", 1.0)):
        ratios = [
            (
                by[("hybrid+sla", c)]["goodput_requests_per_s"]
                / by[(base, c)]["goodput_requests_per_s"],
                c,
            )
            for c in conc
            if (base, c) in by and by[(base, c)]["goodput_requests_per_s"] > 0
        ]
        if not ratios:
            continue
        worst = min(ratios)
        each = ", ".join(f"{c}: {x:.2f}x" for x, c in ratios)
        name = f">= {factor:g}x" if factor != 1.0 else "above"
        ok = worst[0] >= factor if factor != 1.0 else worst[0] > 1.0
        out.append((f"hybrid+sla goodput {name} {base}'s at every concurrency", ok, each))
    tput = [
        by[("hybrid+sla", c)]["throughput_total_tokens_per_s"]
        / by[("fcfs", c)]["throughput_total_tokens_per_s"]
        for c in conc
        if ("fcfs", c) in by
    ]
    if tput:
        out.append(
            (
                "hybrid+sla total token throughput within 5% of fcfs",
                min(tput) >= 0.95,
                f"lowest {100 * min(tput):.1f}%",
            )
        )
    share = max((r["retry_share"], c) for r, c in zip(runs, conc, strict=True))
    out.append(
        (
            f"no retry storm: retries < {100 * STORM_SHARE:.0f}% of arrivals at every concurrency",
            share[0] < STORM_SHARE,
            f"highest {_pct(share[0])} at {share[1]}",
        )
    )
    return out


def sla_markdown(results: list[dict]) -> list[str]:
    if not has_sla(results):
        return []
    by = _by(results)
    names = variants(results)
    conc = sorted({r["concurrency"] for r in results})
    lines = [
        "",
        "## Goodput and SLA admission",
        "",
        "Goodput: P0–P2 requests whose first token met their class's SLA, per second. "
        "Attainment counts admitted requests only (refused and demoted ones apart). A refused "
        "client retries the same request after its Retry-After, at most "
        f"{results[0]['config'].get('max_retries', 3)} times; `retries` is their share of all "
        "arrivals.",
        "",
        "| policy | conc | goodput/s | vs fcfs | vs hybrid | P0 SLA | P1 SLA | P2 SLA | "
        "refused P0/P1/P2 | retries | demoted | ended early | all tok/s vs fcfs |",
        "|" + "---|" * 13,
    ]
    for c in conc:
        base_f, base_h = by.get(("fcfs", c)), by.get(("hybrid", c))
        for v in names:
            r = by.get((v, c))
            if r is None:
                continue
            g, cl = r["goodput_requests_per_s"], r["classes"]
            vs = [
                f"{g / b['goodput_requests_per_s']:.2f}x"
                if b and b["goodput_requests_per_s"] > 0
                else "–"
                for b in (base_f, base_h)
            ]
            tput = (
                _pct(r["throughput_total_tokens_per_s"] / base_f["throughput_total_tokens_per_s"])
                if base_f
                else "–"
            )
            refused = "/".join(str(cl[k].get("refused", cl[k]["rejected"])) for k in SLA_CLASSES)
            lines.append(
                f"| {v} | {c} | {g:.2f} | {vs[0]} | {vs[1]} | "
                + " | ".join(_pct(cl[k]["sla_attainment"]) for k in SLA_CLASSES)
                + f" | {refused} | {_pct(r.get('retry_share', 0.0))} | {r.get('demoted', 0)} | "
                f"{r.get('ended_early', 0)} | {tput} |"
            )
    lines += [
        "",
        "### TTFT predictor error (admitted requests: |actual − predicted|, P50 / P90)",
        "",
        "| policy | conc | " + " | ".join(SLA_CLASSES) + " |",
        "|" + "---|" * (2 + len(SLA_CLASSES)),
    ]
    for c in conc:
        for v in names:
            r = by.get((v, c))
            if r is None or not r.get("sla_admission"):
                continue
            cells = [
                f"{_s(r['classes'][k]['ttft_prediction_abs_error_p50_s'])} / "
                f"{_s(r['classes'][k]['ttft_prediction_abs_error_p90_s'])} s"
                for k in SLA_CLASSES
            ]
            lines.append(f"| {v} | {c} | " + " | ".join(cells) + " |")
    return lines


def write_goodput_plot(results: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = _by(results)
    conc = sorted({r["concurrency"] for r in results})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    panels = (
        ("goodput: P0–P2 on time per second", lambda r: r["goodput_requests_per_s"]),
        ("P1 SLA attainment (admitted)", lambda r: r["classes"]["P1"]["sla_attainment"]),
        ("retries: share of arrivals", lambda r: r.get("retry_share", 0.0)),
    )
    for ax, (title, get) in zip(axes, panels, strict=True):
        for v in variants(results):
            ys = [get(by[(v, c)]) if (v, c) in by else None for c in conc]
            ys = [float("nan") if y is None else y for y in ys]
            ax.plot(conc, ys, marker="o", linestyle="--" if v.endswith("+sla") else "-", label=v)
        ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel("concurrent clients")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = out / "goodput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
