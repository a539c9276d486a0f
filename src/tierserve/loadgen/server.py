"""Start a `tierserve serve` process for a benchmark and wait until it is ready: the one way the
benchmarks under benchmarks/ start a server (each had its own copy of this loop)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    args: list[str],
    *,
    port: int | None = None,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 300.0,
) -> tuple[subprocess.Popen, str]:
    """`tierserve serve ARGS --port PORT` (a free port by default), its output to `log` (else
    discarded); returns the process and its URL once `/ready` answers 200. Exits with a message
    naming the log if the server stops first or is not ready within `timeout_s`."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "tierserve", "serve", "--port", str(port), *args]
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (the server's lifetime)
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    url = f"http://127.0.0.1:{port}"
    where = f": see {log}" if log else ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return proc, url
        if proc.poll() is not None:
            raise SystemExit(f"the server exited (status {proc.returncode}){where}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server was not ready within {timeout_s:.0f} s{where}")


def stop_server(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """SIGTERM (the server drains), then SIGKILL after `timeout_s`."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def served(args: list[str], **kw) -> Iterator[str]:
    """`start_server` as a context: yields the URL, stops the server on the way out."""
    proc, url = start_server(args, **kw)
    try:
        yield url
    finally:
        stop_server(proc)
