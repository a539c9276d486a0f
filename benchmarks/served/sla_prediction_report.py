"""The TTFT predictor and refusals of SLA admission, measured from a `tierserve bench serve`
output folder (requests.jsonl) against a tierserve server run with `--sla-admission on`:

    python benchmarks/served/sla_prediction_report.py out/sla-overload

Per class: admitted requests with a prediction (the server's x-tierserve-predicted-ttft-ms
header), the median and P90 of |TTFT seen by the client - predicted|, and the share on time;
refusals (429/503) and how fast they were answered (send to response, median and P90).
Measured requests only (the load generator's window)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tierserve.sim.engine.stats import percentile

SLA = {0: 0.5, 1: 5.0, 2: 60.0, 3: None}


def summarize(path: Path) -> dict:
    rows = [json.loads(line) for line in (path / "requests.jsonl").open()]
    rows = [r for r in rows if r.get("measured", True)]
    out: dict = {"classes": {}}
    for prio in range(4):
        mine = [r for r in rows if r["priority"] == prio]
        done = [r for r in mine if r["outcome"] == "completed" and r["chunk_times"]]
        err = [
            abs(r["chunk_times"][0] - r["arrival"] - r["predicted_ttft"])
            for r in done
            if r.get("predicted_ttft") is not None
        ]
        sla = SLA[prio]
        on_time = [r for r in done if sla is None or r["chunk_times"][0] - r["arrival"] <= sla]
        out["classes"][f"P{prio}"] = {
            "sent": len(mine),
            "completed": len(done),
            "refused": sum(1 for r in mine if r["outcome"] == "rejected"),
            "failed": sum(1 for r in mine if r["outcome"] == "failed"),
            "on_time_of_completed": len(on_time) / len(done) if done else None,
            "predicted": len(err),
            "abs_error_p50_s": percentile(err, 50),
            "abs_error_p90_s": percentile(err, 90),
        }
    refused = [r["finish"] - r["arrival"] for r in rows if r["outcome"] == "rejected"]
    out["refusals"] = len(refused)
    out["refusal_answer_p50_s"] = percentile(refused, 50)
    out["refusal_answer_p90_s"] = percentile(refused, 90)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a `tierserve bench serve --out` folder")
    args = p.parse_args()
    s = summarize(args.folder)

    def f(x, unit=" s"):
        return "–" if x is None else f"{x:.3f}{unit}"

    print("| class | sent | completed | refused | failed | on time | predicted | |err| P50 | P90 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cls, c in s["classes"].items():
        on_time = c["on_time_of_completed"]
        print(
            f"| {cls} | {c['sent']} | {c['completed']} | {c['refused']} | {c['failed']} | "
            f"{'–' if on_time is None else f'{100 * on_time:.1f}%'} | {c['predicted']} | "
            f"{f(c['abs_error_p50_s'])} | {f(c['abs_error_p90_s'])} |"
        )
    print(
        f"\nrefusals: {s['refusals']}, answered in {f(s['refusal_answer_p50_s'])} (median), "
        f"{f(s['refusal_answer_p90_s'])} (P90)"
    )


if __name__ == "__main__":
    main()
