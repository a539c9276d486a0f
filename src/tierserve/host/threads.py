"""How many CPU threads the engine's parallel regions use (`--cpu-threads N|auto`).

An OpenMP team wants its threads on cores of their own: every parallel region of a step waits
for its slowest thread. With one other busy process on a 2-core machine, a 16-token completion
took 17-20 s with 2 threads and 1.46 s with 1 (issue 23). `auto`, `tierserve serve`'s default,
counts the CPUs this process may use, subtracts those kept busy by other processes over a short
sample at start (/proc/stat, less this process's own CPU time), and keeps at least one. It
decides once, at start: the log line says what it saw, and `--cpu-threads N` overrides it.
Torch-free: the count is applied to the engine's threads by `engine/builder.py`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

AUTO = "auto"
SAMPLE_S = 0.3


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    cpus: int  # CPUs this process may run on
    busy_elsewhere: float | None  # cores other processes kept busy (None: not measured)
    how: str  # "auto" or "--cpu-threads"

    def describe(self) -> str:
        seen = (
            f"; {self.busy_elsewhere:.1f} of {self.cpus} CPUs busy with other processes"
            if self.busy_elsewhere is not None
            else ""
        )
        return f"{self.threads} CPU thread(s) of {self.cpus} ({self.how}{seen})"

    def warning(self) -> str | None:
        """A line to warn with when the threads outnumber the idle CPUs."""
        if self.busy_elsewhere is None or self.threads <= 1:
            return None
        if self.threads <= self.cpus - self.busy_elsewhere + 0.5:
            return None
        return (
            f"{self.busy_elsewhere:.1f} of {self.cpus} CPUs are busy with other processes and "
            f"the engine uses {self.threads} threads: a step waits for its slowest thread, so "
            "decoding may be many times slower; try --cpu-threads "
            f"{max(1, self.cpus - round(self.busy_elsewhere))}"
        )


def parse_threads(text) -> int | None:
    """`--cpu-threads`: a positive integer, or "auto" (None)."""
    if text is None or str(text).strip().lower() == AUTO:
        return None
    try:
        n = int(text)
    except (TypeError, ValueError):
        msg = f"--cpu-threads: expected a positive integer or auto, got {text!r}"
        raise ValueError(msg) from None
    if n < 1:
        raise ValueError(f"--cpu-threads: expected a positive integer or auto, got {n}")
    return n


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _busy_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat; None where unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def busy_elsewhere(sample_s: float = SAMPLE_S) -> float | None:
    """Cores kept busy by other processes during a `sample_s` sample; None where unknown."""
    start = _busy_jiffies()
    if start is None:
        return None
    own0, t0 = _own_cpu_s(), time.monotonic()
    time.sleep(sample_s)
    end = _busy_jiffies()
    own1, t1 = _own_cpu_s(), time.monotonic()
    if end is None or end[1] <= start[1]:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy_s = (end[0] - start[0]) / hz
    return max(0.0, (busy_s - (own1 - own0)) / (t1 - t0))


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def choose_threads(requested: int | None, sample_s: float = SAMPLE_S) -> ThreadChoice:
    """`requested` threads (also measuring, for the warning), or the auto choice."""
    cpus = available_cpus()
    busy = busy_elsewhere(sample_s)
    if requested is not None:
        return ThreadChoice(requested, cpus, busy, "--cpu-threads")
    idle = cpus if busy is None else cpus - round(busy)
    return ThreadChoice(max(1, min(cpus, idle)), cpus, busy, AUTO)
