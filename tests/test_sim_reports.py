"""The simulator's committed reports are what the committed code produces (issue 41, item 4):
the simulator is deterministic (one seed, one results file), and the short `smoke` report in
docs/sim/ is rerun from its line in docs/sim/COMMANDS and must match. When a change moves the
simulator's figures, `make sim-reports` regenerates every report from the same file."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "docs" / "sim"


def commands() -> dict[str, list[str]]:
    out = {}
    for line in (SIM / "COMMANDS").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            folder, *args = shlex.split(line)
            out[folder] = args
    return out


def results(folder: Path) -> list[dict]:
    runs = json.loads((folder / "results.json").read_text())
    for r in runs:
        r.pop("wall_s", None)  # the only field that is not simulated
    return runs


def simulate(args: list[str], out: Path) -> None:
    cmd = [sys.executable, "-m", "tierserve", "simulate", *args, "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_every_committed_report_has_its_command():
    folders = {p.name for p in SIM.iterdir() if (p / "results.json").exists()}
    assert folders == set(commands()), folders ^ set(commands())


def test_the_smoke_report_is_what_the_code_produces_and_runs_repeat(tmp_path):
    args = commands()["smoke"]
    simulate(args, tmp_path / "a")
    simulate(args, tmp_path / "b")
    assert results(tmp_path / "a") == results(tmp_path / "b")  # deterministic
    assert results(tmp_path / "a") == results(SIM / "smoke"), (
        "docs/sim/smoke no longer matches the code: run `make sim-reports` (and check the "
        "README's quoted figures)"
    )
    assert (tmp_path / "a" / "report.md").read_text() == (SIM / "smoke" / "report.md").read_text()
