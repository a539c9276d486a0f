"""The prepared GPU check (benchmarks/gpu/check.sh) in its CPU mode (SMALL=1, a tiny random
model): every part runs and lands in the one results.tgz the device tool brings back, so the
script cannot rot between the sessions that have a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.server_utils import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.model  # ~30 s: a server, two bench levels and a flood
def test_the_gpu_check_runs_every_part_on_a_cpu(tmp_path):
    carry, out = tmp_path / "carry", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    prep = [sys.executable, str(ROOT / "benchmarks/gpu/prepare.py"), "--out", str(carry)]
    subprocess.run(prep, check=True, env=env, capture_output=True, timeout=120)
    env |= {"SMALL": "1", "CARRY": str(carry), "OUT": str(out), "PY": sys.executable}
    env |= {"DUR": "2", "PORT": str(free_port())}
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu/check.sh")],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with tarfile.open(out / "results.tgz") as tar:
        names = {n.removeprefix("./") for n in tar.getnames()}
        read = {n: tar.extractfile(f"./{n}") for n in names if n.endswith((".log", ".json"))}
        text = {n: f.read().decode() for n, f in read.items() if f is not None}
    assert {"env.txt", "model.log", "tests.log", "bench/results.json"} <= names
    for log in ("model.log", "tests.log", "steps_capture.log", "bench.log", "flood.log"):
        assert text[log].rstrip().endswith("rc=0"), (log, text[log][-500:])
    capture = json.loads(text["steps_capture.json"])
    assert capture["graph_replays"] > 0 and capture["decode_graphs"] == "capture"
    assert json.loads(text["steps_off.json"])["graph_replays"] == 0
    assert any(n.startswith("flood/") for n in names)


def test_the_multi_gpu_tensor_parallel_check_runs_every_part_on_a_cpu(tmp_path):
    """benchmarks/gpu/tp_check.sh at TP=2 on a CPU: the answers against TP=1, both servers'
    bench levels, and a worker killed under load ending the server with status 1."""
    carry, out = tmp_path / "carry", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    prep = [sys.executable, str(ROOT / "benchmarks/gpu/prepare.py"), "--out", str(carry)]
    subprocess.run(prep, check=True, env=env, capture_output=True, timeout=120)
    env |= {"SMALL": "1", "CARRY": str(carry), "OUT": str(out), "PY": sys.executable}
    env |= {"DUR": "2", "PORT": str(free_port())}
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu/tp_check.sh")],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with tarfile.open(out / "results.tgz") as tar:
        names = {n.removeprefix("./") for n in tar.getnames()}
        read = {n: tar.extractfile(f"./{n}") for n in names if n.endswith((".log", ".txt"))}
        text = {n: f.read().decode() for n, f in read.items() if f is not None}
    for log in ("parity.log", "bench_tp1.log", "bench_tp2.log"):
        assert text[log].rstrip().endswith("rc=0"), (log, text[log][-500:])
    assert "greedy answers equal 2/2" in text["parity.log"]
    assert "tensor-parallel worker 1" in text["health_after_kill.txt"]
    assert text["exit.txt"].strip() == "server exit status 1"
