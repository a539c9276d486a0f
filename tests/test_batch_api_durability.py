"""Durability: a real `tierserve serve` process is SIGKILLed at random points of a 500-line
batch, five times, and restarted on the same database each time. The batch completes with
exactly 500 results, no custom_id twice, every output identical to a run without crashes (greedy):
`tierserve run-batch` over the same file, which also checks the offline command."""

import json
import random
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx
import pytest

from tests.batch_utils import client, completion_line, jsonl, read_jsonl
from tests.server_utils import free_port

pytestmark = pytest.mark.model
N = 500
KILLS = 5
# float32 products: the answers are compared bit for bit across runs whose batches differ
FLAGS = ["--kv-cache-gib", "0.2", "--max-num-seqs", "32", "--log-level", "warning"]
FLAGS += ["--activations", "float32"]


@contextmanager
def server(tmp, log):
    port = free_port()
    cmd = [sys.executable, "-m", "tierserve", "serve", "--port", str(port), *FLAGS]
    cmd += ["--batch-db", str(tmp / "batch.db"), "--files-dir", str(tmp / "files")]
    cmd += ["--batch-window", "32"]
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def answers(lines: dict[str, dict]) -> dict[str, tuple]:
    out = {}
    for cid, line in lines.items():
        body = line["response"]["body"]
        choice = body["choices"][0]
        out[cid] = (line["response"]["status_code"], choice["text"], choice["finish_reason"])
    return out


def test_sigkill_five_times_during_a_batch_loses_and_duplicates_nothing(tmp_path):
    lines = [completion_line(f"n{i}", f"Count to ten: {i},", max_tokens=3) for i in range(N)]
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl(lines))
    base = tmp_path / "base.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "tierserve", "run-batch", "-i", str(src), "-o", str(base), *FLAGS],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"{N}/{N}" in run.stderr and f"{N} ok, 0 failed" in run.stderr  # the progress bar
    rows = [json.loads(x) for x in base.read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == [x["custom_id"] for x in lines]  # input order
    expected = answers({r["custom_id"]: r for r in rows})

    rng = random.Random(27)
    points = sorted(rng.sample(range(10, N - 10), KILLS))  # results recorded before each kill
    log = tmp_path / "server.log"
    with server(tmp_path, log) as (proc, url):
        c = client(url)
        f = c.files.create(file=("in.jsonl", src.read_bytes()), purpose="batch")
        batch_id = c.batches.create(
            input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"
        ).id
        killed = [wait_then_kill(proc, url, batch_id, points[0], rng)]
    for point in points[1:]:
        with server(tmp_path, log) as (proc, url):
            killed.append(wait_then_kill(proc, url, batch_id, point, rng))
    assert all(k < N for k in killed), killed  # every kill landed before the end
    with server(tmp_path, log) as (proc, url):
        c = client(url)
        deadline = time.monotonic() + 600
        while (b := c.batches.retrieve(batch_id)).status != "completed":
            assert b.status in ("in_progress", "finalizing"), b
            assert time.monotonic() < deadline, b
            time.sleep(0.2)
        assert (b.request_counts.total, b.request_counts.completed) == (N, N)
        assert b.request_counts.failed == 0 and b.error_file_id is None
        text = c.files.content(b.output_file_id).text.splitlines()
        assert len(text) == N
        got = answers(read_jsonl(c, b.output_file_id))  # (asserts no custom_id twice)
    assert got == expected
    assert "Traceback" not in log.read_text()


def wait_then_kill(proc, url, batch_id, point, rng) -> int:
    """SIGKILL the server once `point` results are recorded (plus a random moment)."""
    c = client(url)
    deadline = time.monotonic() + 600
    while (done := c.batches.retrieve(batch_id).request_counts.completed) < point:
        assert time.monotonic() < deadline, f"stuck at {done} results"
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return done
