"""`tierserve simulate` is never silent off a terminal (issue 23, item 13): a line per finished
run, and a heartbeat line while runs go on; on a terminal, the one-line bar."""

from __future__ import annotations

import io
import time
from dataclasses import replace

from tierserve.sim.engine.runner import SimConfig
from tierserve.sim.scenarios import Progress, run_grid
from tierserve.workloads.synthetic import WorkloadConfig

TINY = SimConfig(
    hardware="h100-80gb",
    model="llama-3.1-8b",
    tp=1,
    workload=WorkloadConfig(concurrency=4, duration_s=5.0, warmup_s=1.0, seed=1),
)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_each_run_and_a_heartbeat_print_a_line():
    out = io.StringIO()
    bar = Progress(2, out, heartbeat_s=0.05)
    deadline = time.monotonic() + 10  # a long first run: heartbeats meanwhile (a busy CI
    while out.getvalue().count("still running") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # machine may schedule the heartbeat thread late)
    bar.step("hybrid x 32")
    bar.step("fcfs x 32")
    lines = out.getvalue().splitlines()
    beats = [x for x in lines if "still running" in x]
    assert len(beats) >= 2 and beats[0].startswith("simulate: 0/2 runs done, still running (")
    assert "simulate: run 1/2 done: hybrid x 32 (" in out.getvalue()
    assert lines[-1].startswith("simulate: run 2/2 done: fcfs x 32 (")
    time.sleep(0.2)
    assert out.getvalue().splitlines() == lines  # done: no more heartbeats


def test_on_a_terminal_one_bar_line():
    out = _Tty()
    bar = Progress(1, out, heartbeat_s=0.05)
    time.sleep(0.15)
    bar.step("hybrid x 32")
    text = out.getvalue()
    assert text.startswith("\r[") and text.endswith("s\n") and "still running" not in text


def test_run_grid_reports_every_run_off_a_terminal(capsys):
    configs = [TINY, replace(TINY, policy="fcfs")]
    results = run_grid(configs, workers=1)
    assert len(results) == 2
    err = capsys.readouterr().err
    assert "simulate: run 1/2 done: hybrid x 4" in err and "run 2/2 done: fcfs x 4" in err
