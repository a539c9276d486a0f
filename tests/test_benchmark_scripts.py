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
            str(ROOT / "benchmarks" / "gpu" / "gpu_profile.py"),
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
        [sys.executable, str(ROOT / "benchmarks" / "kernels" / "gemm_curve.py"), "--layers", "1",
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
        [sys.executable, str(ROOT / "benchmarks" / "simulation" / "autoscale_timeline.py"),
        "--duration", "6",
         "--drain-time-at-risk"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # The first seconds' light load on the 4 replicas the run starts with: quiet (the policy
    # would shed half, the most a decision may, as the load needs fewer; the scaler keeps the
    # minimum, 4).
    assert " 0-5  s |" in proc.stdout and "-> 2 (quiet)" in proc.stdout
    assert "replica-seconds" in proc.stdout and "per on-time" in proc.stdout


def _load_benchmark(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spec_decode_row_cost_recovers_a_draft_row_s_cost_and_the_bound():
    """spec_decode.py --steps: steps of 4 streams, 9 ms plain and 0.8 ms more a draft row;
    steps with a prefill or fewer streams are left out."""
    row_cost = _load_benchmark("engine/spec_decode").row_cost
    step = lambda drafts, tokens: (4, 0, 4 + drafts, 0.009 + 0.0008 * drafts, tokens)  # noqa: E731
    off = [{"steps": [(4, 0, 4, 0.009, 4)] * 5 + [(4, 100, 104, 0.5, 4), (2, 0, 2, 0.001, 2)]}]
    on = [{"steps": [step(4, 7), step(8, 10), step(12, 12), (4, 50, 62, 0.3, 6)]}]
    line = row_cost(off, on, 4)
    assert "plain step 9.00 ms (5 steps)" in line
    assert "9.00 ms + 0.800 ms a draft row" in line
    assert "8.0 draft rows and 9.67 tokens a step" in line
    # decode steps alone: (9 / 4) / (mean step 15.4 ms / 9.67 tokens)
    assert "decode steps alone 1.41x" in line
    # 1.6x: c <= (9 x 29 / 3 / 6.4 - 9) / 8 = 0.574 ms
    assert "1.6x needs <= 0.574 ms a row" in line
    assert row_cost(off, [{"steps": [step(4, 7)]}], 4) == "too few full decode steps"
