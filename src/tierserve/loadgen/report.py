"""A run's output folder: results.json (figures), requests.jsonl (every request as recorded),
report.md (tables) and the plots (plots.py). Written after every level, so a run stopped
midway keeps what it measured."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from tierserve.loadgen.metrics import CLASSES, run_stats
from tierserve.loadgen.runner import LevelResult

SCHEMA = 1


def run_entry(res: LevelResult, ttft_sla, tpot_slo, phase: str | None = None) -> dict:
    lvl = res.level
    return {
        "phase": phase,
        "concurrency": lvl.concurrency if lvl.rate is None else None,
        "request_rate": lvl.rate,
        "requests_sent": len(res.records),
        "elapsed_s": res.elapsed_s,
        **run_stats(res.records, res.window, ttft_sla, tpot_slo),
    }


def results_doc(config: dict, runs: list[dict], status: str, message: str | None, flood=None):
    return {
        "tool": "tierserve bench serve",
        "schema": SCHEMA,
        "label": config.get("label"),
        "status": status,  # complete | interrupted | aborted
        "message": message,
        "config": config,
        "runs": runs,
        "flood": flood,
    }


def write_results(out: Path, doc: dict, levels: list[LevelResult]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out / "results.json")
    with (out / "requests.jsonl").open("w") as f:
        for i, res in enumerate(levels):
            for r in res.records:
                f.write(json.dumps({"run": i, **asdict(r)}) + "\n")


def fmt(v, unit: str = "s", digits: int = 3) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f}{' ' + unit if unit else ''}"


def pct(v) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def run_title(run: dict) -> str:
    if run.get("phase"):
        return f"flood scenario, {run['phase']} phase"
    if run.get("request_rate") is not None:
        return f"open loop, {run['request_rate']:g} requests/s"
    return f"closed loop, concurrency {run['concurrency']}"


def _counts(s: dict) -> str:
    refused = ", ".join(f"{k}: {v}" for k, v in s["refusals_by_status"].items())
    errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items())
    return (
        f"{s['requests']} | {s['completed']} | {s['rejected']}{f' ({refused})' if refused else ''}"
        f" | {s['failed']}{f' ({errors})' if errors else ''} | {s['unfinished']}"
    )


def run_tables(run: dict) -> list[str]:
    rows = [(c, run["classes"][c]) for c in CLASSES] + [("all", run["overall"])]
    lines = [
        "| class | TTFT p50 | TTFT p95 | TTFT p99 | ITL p50 | ITL p95 | TPOT p50 | TPOT p95 | "
        "E2E p50 | E2E p95 | SLA | attained |",
        "|" + "---|" * 12,
    ]
    for name, s in rows:
        sla = s.get("sla_s")
        lines.append(
            f"| {name} | {fmt(s['ttft_p50_s'])} | {fmt(s['ttft_p95_s'])} | "
            f"{fmt(s['ttft_p99_s'])} | {fmt(s['itl_p50_s'])} | {fmt(s['itl_p95_s'])} | "
            f"{fmt(s['tpot_p50_s'])} | {fmt(s['tpot_p95_s'])} | {fmt(s['e2e_p50_s'], 's', 2)} | "
            f"{fmt(s['e2e_p95_s'], 's', 2)} | {'–' if sla is None else f'{sla:g} s'} | "
            f"{pct(s['sla_attainment'])} |"
        )
    lines += [
        "",
        "| class | goodput req/s | output tok/s | total tok/s | sent | completed | refused | "
        "failed | unfinished |",
        "|" + "---|" * 9,
    ]
    for name, s in rows:
        lines.append(
            f"| {name} | {fmt(s['goodput_requests_per_s'], '', 2)} | "
            f"{fmt(s['throughput_tokens_per_s'], '', 1)} | "
            f"{fmt(s['throughput_total_tokens_per_s'], '', 1)} | {_counts(s)} |"
        )
    return lines


def flood_lines(f: dict) -> list[str]:
    return [
        "| figure | value |",
        "|---|---|",
        f"| background streams | {f['streams']} |",
        f"| P0 probes idle / loaded | {f['idle_probes']} / {f['loaded_probes']} |",
        f"| P0 TTFT idle p50 / p95 | {fmt(f['p0_idle_ttft_p50_s'])} / "
        f"{fmt(f['p0_idle_ttft_p95_s'])} |",
        f"| P0 TTFT loaded p50 / p95 | {fmt(f['p0_loaded_ttft_p50_s'])} / "
        f"{fmt(f['p0_loaded_ttft_p95_s'])} |",
        f"| loaded / idle, p50 | {fmt(f['p0_ttft_ratio_p50'], 'x', 2)} |",
        f"| loaded / idle, p95 | {fmt(f['p0_ttft_ratio_p95'], 'x', 2)} |",
        f"| background output tok/s | {fmt(f['background_throughput_tokens_per_s'], '', 1)} |",
        f"| background total tok/s | {fmt(f['background_throughput_total_tokens_per_s'], '', 1)} |",
    ]


def write_markdown(doc: dict, path: Path, plots: list[Path]) -> None:
    cfg = doc["config"]
    lines = [
        f"# tierserve bench serve: {doc.get('label') or cfg['base_url']}",
        "",
        f"{cfg['api']} API at {cfg['base_url']} (model {cfg.get('model') or '(server default)'}), "
        f"priority via {cfg['priority_via']}, seed {cfg['seed']}, class mix "
        f"{'/'.join(f'{100 * m:g}' for m in cfg['mix'])}, lengths {cfg['lengths']}; "
        f"{cfg['measure']}. Generated by `tierserve bench serve`.",
        "",
    ]
    if doc["status"] != "complete":
        lines += [f"**{doc['status'].upper()}**: {doc['message']} (partial results)", ""]
    if doc.get("flood"):
        lines += ["## Flood scenario", "", *flood_lines(doc["flood"]), ""]
    if cfg.get("lengths_reason"):
        lines += [f"Lengths chosen by `--lengths auto`: {cfg['lengths_reason']}.", ""]
    for run in doc["runs"]:
        lines += [f"## {run_title(run)}", ""]
        lines += [f"**Warning:** {w}" for w in run.get("warnings") or ()]
        lines += ["", *run_tables(run), ""] if run.get("warnings") else [*run_tables(run), ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    path.write_text("\n".join(lines) + "\n")
