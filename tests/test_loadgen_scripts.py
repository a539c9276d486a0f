"""The seed-experiment scripts for the load generator: the simulator's prediction runs on the
same workload and `bench serve --compare` reads it (a tiny smoke configuration; not timed)."""

import json
import subprocess
import sys
from pathlib import Path

from tierserve.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_sim_prediction_uses_the_load_generators_lengths_and_compares(tmp_path):
    out = tmp_path / "sim"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "simulation" / "serve_sim_prediction.py"),
        "--out", str(out),
         "--policy", "hybrid", "--concurrency", "4", "--duration", "20", "--warmup", "5",
         "--lengths", "cpu", "--length-scale", "0.5"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads((out / "results.json").read_text())
    assert (run["policy"], run["concurrency"], run["hardware"]) == ("hybrid", 4, "cpu-local")
    assert run["completed"] > 0 and run["throughput_total_tokens_per_s"] > 0
    assert main(["bench", "serve", "--compare", str(out), "--out", str(tmp_path / "cmp")]) == 0
    assert "sim hybrid (cpu-local)" in (tmp_path / "cmp" / "compare.md").read_text()


def test_seed_experiment_script_parses():
    script = ROOT / "benchmarks" / "served" / "serve_seed_experiment.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
