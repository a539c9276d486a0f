"""Throughput of our own server under several builds or settings, one after another on this
machine: for each ``--config LABEL PYTHONPATH SERVE_ARGS`` it starts ``tierserve serve`` (its
code from PYTHONPATH: "-" for this checkout), runs ``tierserve bench serve`` against it with the
bench arguments after ``--``, stops it, and prints output tokens/s per concurrency level, one
column per configuration, in the order given (repeat a configuration to see the noise).

    python benchmarks/served/serve_ab.py \\
        --config before /path/to/old/checkout/src "" \\
        --config on - "--batch-invariant on" --config off - "--batch-invariant off" \\
        -- --concurrency 1 8 32 --prompt-len 128 --output-len 64 --ignore-eos \\
           --mix 0 1 0 0 --duration 20 --warmup 4

Each server gets a fresh port and its log in ``--out``; the kernels and the step plan are built
or read before the port opens, so no level pays for them. Results: ``--out/<n>-<label>/``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from tierserve.loadgen.server import start_server, stop_server


def run(label: str, pythonpath: str, serve_args: str, bench: list[str], out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = {} if pythonpath == "-" else {"PYTHONPATH": pythonpath}
    proc, url = start_server(shlex.split(serve_args), log=out / "serve.log", env=env, timeout_s=900)
    try:
        cmd = [sys.executable, "-m", "tierserve", "bench", "serve", "--base-url", url]
        cmd += [*bench, "--out", str(out / "bench"), "--label", label, "--no-progress"]
        subprocess.run(cmd, check=True, env={**os.environ, **env}, stdout=subprocess.DEVNULL)
    finally:
        stop_server(proc)
    runs = json.loads((out / "bench" / "results.json").read_text())["runs"]
    return {r["concurrency"] or r["request_rate"]: r["throughput_tokens_per_s"] for r in runs}


def main() -> None:
    argv = sys.argv[1:]
    bench = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", nargs=3, action="append", required=True,
                    metavar=("LABEL", "PYTHONPATH", "SERVE_ARGS"))  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("serve-ab"))
    args = ap.parse_args(own)
    table = []
    for i, (label, path, serve_args) in enumerate(args.config):
        res = run(label, path, serve_args, bench, args.out / f"{i}-{label}")
        table.append((label, res))
        print(f"{label}: " + ", ".join(f"{c} clients {t:.1f}" for c, t in res.items()), flush=True)
    levels = sorted({c for _, r in table for c in r})
    print("\n| clients | " + " | ".join(lbl for lbl, _ in table) + " |")
    print("|---|" + "---|" * len(table))
    for c in levels:
        print(f"| {c} | " + " | ".join(f"{r.get(c, float('nan')):.1f}" for _, r in table) + " |")


if __name__ == "__main__":
    main()
