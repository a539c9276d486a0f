"""benchmarks/served/cluster_load.py runs against a real (single-process) server and reports every
class (a short smoke configuration; not timed)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_utils import running_server, small_engine_args
from tierserve.engine.builder import build_engine

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent


def test_cluster_load_script_reports_each_class(tmp_path):
    out = tmp_path / "load.json"
    with running_server(build_engine(small_engine_args())) as (url, _):
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "served" / "cluster_load.py"),
                "--url",
                url,
                "--duration",
                "3",
                "--rate",
                "3",
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(out.read_text())
    rows = rep["classes"]
    assert set(rows) == {"realtime", "online", "background"}
    sent = sum(r["sent"] for r in rows.values())
    assert sent > 0 and sum(r["ok"] for r in rows.values()) == sent
    assert rep["output_tok_per_s"] > 0
    assert sum(sum(c.values()) for c in rep["finished_by_replica"].values()) == sent
    assert "TTFT p95" in proc.stdout
