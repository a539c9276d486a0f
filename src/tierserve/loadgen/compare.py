"""`--compare DIR ...`: several runs side by side in one report (fcfs against hybrid, tierserve
against vLLM, ...). A DIR holds a `tierserve bench serve` results.json, or a `tierserve simulate`
one (a list of runs, one series per policy): field names are shared, so a simulator prediction
sits beside the measurement."""

from __future__ import annotations

import json
from pathlib import Path

from tierserve.loadgen.metrics import CLASSES
from tierserve.loadgen.plots import load_of, ttft_p95_vs_load
from tierserve.loadgen.report import flood_lines, fmt, pct


class CompareError(ValueError):
    pass


def load_series(dirs: list[str]) -> list[tuple[str, dict]]:
    """[(label, {"runs": [...], "flood": ... | None})] in the order given."""
    out: list[tuple[str, dict]] = []
    for d in dirs:
        path = Path(d) / "results.json" if Path(d).is_dir() else Path(d)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise CompareError(f"--compare {d}: no results.json there") from None
        except ValueError as exc:
            raise CompareError(f"--compare {d}: {path} is not JSON ({exc})") from None
        if isinstance(doc, list):  # tierserve simulate: one record per policy x load
            for pol in dict.fromkeys(r.get("policy") for r in doc):
                runs = [dict(r, request_rate=r.get("rate")) for r in doc if r.get("policy") == pol]
                out.append((f"sim {pol} ({runs[0].get('hardware')})", {"runs": runs}))
        elif isinstance(doc, dict) and doc.get("tool") == "tierserve bench serve":
            label = doc.get("label") or Path(d).name
            out.append((label, {"runs": doc["runs"], "flood": doc.get("flood")}))
        else:
            raise CompareError(f"--compare {d}: {path} is neither bench serve nor simulate output")
    labels = [lbl for lbl, _ in out]
    dup = {x for x in labels if labels.count(x) > 1}
    if dup:  # make labels unique so tables and legends tell runs apart
        out = [(f"{lbl} #{i}" if lbl in dup else lbl, s) for i, (lbl, s) in enumerate(out, 1)]
    return out


def _loads(series) -> list:
    keys = {load_of(r) for _, s in series for r in s["runs"] if not r.get("phase")}
    return sorted(k for k in keys if k is not None)


def _at(s: dict, load) -> dict | None:
    return next((r for r in s["runs"] if not r.get("phase") and load_of(r) == load), None)


def _table(series, loads, name: str, cell) -> list[str]:
    labels = [lbl for lbl, _ in series]
    lines = [f"| {name} | " + " | ".join(labels) + " |", "|" + "---|" * (1 + len(labels))]
    for load in loads:
        row = [cell(r) if (r := _at(s, load)) is not None else "–" for _, s in series]
        lines.append(f"| {load:g} | " + " | ".join(row) + " |")
    return lines


def compare_markdown(all_series: list[tuple[str, dict]], plot: Path | None) -> str:
    """Load tables for the series with load runs; a flood section for each flood run."""
    series = [(lbl, s) for lbl, s in all_series if any(not r.get("phase") for r in s["runs"])]
    loads = _loads(series)
    lines = ["# tierserve bench serve: comparison", ""]
    lines.append("Runs: " + ", ".join(lbl for lbl, _ in all_series))
    for cls in CLASSES:
        lines += ["", f"## {cls} P95 time to first token (s)", ""]
        lines += _table(series, loads, "load", lambda r, c=cls: fmt(r["classes"][c]["ttft_p95_s"]))
        lines += ["", f"{cls} SLA attainment:", ""]
        lines += _table(
            series, loads, "load", lambda r, c=cls: pct(r["classes"][c]["sla_attainment"])
        )
    base = series[0][1] if series else None

    def total(r: dict) -> str:
        v = r.get("throughput_total_tokens_per_s")
        ref = _at(base, load_of(r)) if base else None
        b = ref.get("throughput_total_tokens_per_s") if ref else None
        rel = f" ({100 * v / b:.1f}%)" if v is not None and b else ""
        return fmt(v, "", 1) + rel

    lines += [
        "",
        f"## Total (prompt + output) tokens/s, % of {series[0][0] if series else '-'}",
        "",
    ]
    lines += _table(series, loads, "load", total)
    lines += ["", "## Output tokens/s", ""]
    lines += _table(series, loads, "load", lambda r: fmt(r.get("throughput_tokens_per_s"), "", 1))
    lines += ["", "## Goodput (requests/s meeting all their SLOs)", ""]
    lines += _table(series, loads, "load", lambda r: fmt(r.get("goodput_requests_per_s"), "", 2))
    floods = [(lbl, s["flood"]) for lbl, s in all_series if s.get("flood")]
    for lbl, f in floods:
        lines += ["", f"## Flood scenario: {lbl}", "", *flood_lines(f)]
    if plot:
        lines += ["", f"![P95 TTFT per class]({plot.name})"]
    return "\n".join(lines) + "\n"


def write_compare(dirs: list[str], out: Path) -> list[Path]:
    series = load_series(dirs)
    out.mkdir(parents=True, exist_ok=True)
    plot = ttft_p95_vs_load({lbl: s["runs"] for lbl, s in series}, out / "compare_ttft_p95.png")
    md = out / "compare.md"
    md.write_text(compare_markdown(series, plot))
    return [md, *([plot] if plot else [])]
