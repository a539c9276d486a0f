"""The Triton paged decode kernel (model/attention/triton_kernels.py, the CUDA backend) against
the PyTorch reference, under Triton's interpreter on the CPU: context lengths 1, 15, 16, 17 and
600 (split over several programs), GQA, a head size that is not a power of two, a sliding
window, soft-capping and a score scale, and a tiny model's decode steps from the graph runner's
buffers. In a subprocess: TRITON_INTERPRET must be set before Triton is imported."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_the_triton_kernel_matches_the_reference_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "triton_check.py")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = dict(line.split() for line in r.stdout.strip().splitlines())
    assert len(lines) == 7 and all(float(e) < 1e-4 for e in lines.values()), lines


def test_the_backend_is_chosen_on_cuda_only_and_can_be_withheld(monkeypatch):
    from tierserve.model.attention.triton_paged import triton_available

    monkeypatch.setenv("TIERSERVE_TRITON", "off")
    assert not triton_available()
    monkeypatch.delenv("TIERSERVE_TRITON")
    assert triton_available() == (importlib.util.find_spec("triton") is not None)
