"""The benchmark scripts in benchmarks/ run (a tiny smoke configuration; not timed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_profile_script_runs_on_cpu_with_a_tiny_model(tmp_path):
    out = tmp_path / "gpu_profile.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_profile.py"),
            "--tiny",
            "--device",
            "cpu",
            "--repeats",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["model"] == "tiny-random"
    assert report["logit_rel_error_vs_fp32"] == 0.0  # float32 on the CPU: same numbers
    assert len(report["steps"]) == 3
    assert all(s["seconds"] > 0 and s["predicted_seconds"] > 0 for s in report["steps"])


def test_gemm_curve_script_prints_one_row_per_m():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gemm_curve.py"), "--layers", "1",
         "--m", "1", "4", "--reps", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["1", "4"]
    assert all(float(r[1]) > 0 and float(r[4]) > 0 for r in rows)


def test_autoscale_timeline_prints_the_autoscaler_s_inputs_and_the_cost():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}  # this checkout's code
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "autoscale_timeline.py"), "--duration", "6",
         "--drain-time-at-risk"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # The first seconds' light load on the 4 replicas the run starts with: quiet (the policy
    # would shed half, the most a decision may, as the load needs fewer; the scaler keeps the
    # minimum, 4).
    assert " 0-5  s |" in proc.stdout and "-> 2 (quiet)" in proc.stdout
    assert "replica-seconds" in proc.stdout and "per on-time" in proc.stdout
