"""/health and P0's time to first token while huge prompts are refused (issue 23, item 4).

Starts `tierserve serve` (the embedded model) on a free port, measures /health latency and
P0's TTFT with nothing else running, then again while, every 2 s, 4 clients at once send a
request that cannot fit (in turn: a 3.9 MB completion prompt, a chat of 100,000 messages, a
3.9 MB /tokenize; the issue's scenario), and prints both, with the refusals' own latency:

    PYTHONPATH=src .venv/bin/python benchmarks/served/huge_prompt_probe.py [--seconds 20]
    PYTHONPATH=/path/to/old/src .venv/bin/python benchmarks/served/huge_prompt_probe.py   # before

Targets: /health under 50 ms and P0's TTFT unaffected while the huge requests are refused.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import threading
import time

import httpx

from tierserve.loadgen.server import start_server

HUGE = "hello " * 650_000  # 3.9 MB
MESSAGES = [{"role": "user", "content": "hi"}] * 100_000
P0 = {"x-request-tier": "realtime"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port: int) -> subprocess.Popen:
    proc, _ = start_server(["--log-level", "warning"], port=port, timeout_s=300)
    return proc


def ttft(c: httpx.Client, url: str) -> float:
    body = {
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
        "stream": True,
        "temperature": 0,
    }
    t0 = time.perf_counter()
    with c.stream("POST", f"{url}/v1/chat/completions", json=body, headers=P0) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                return time.perf_counter() - t0
    raise RuntimeError("no token")


def poll_health(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.get(f"{url}/health")
            out.append(time.perf_counter() - t0)
            time.sleep(0.02)


def attack(url: str, stop: threading.Event, out: list[tuple[int, float]], n: int) -> None:
    """Every 2 s, `n` clients at once send one request that cannot fit (kinds in turn)."""
    calls = [
        ("/v1/completions", json.dumps({"prompt": HUGE, "max_tokens": 1})),
        ("/v1/chat/completions", json.dumps({"messages": MESSAGES})),
        ("/tokenize", json.dumps({"prompt": HUGE})),
    ]

    def one(path: str, body: str) -> None:
        with httpx.Client(timeout=120) as c:
            t0 = time.perf_counter()
            r = c.post(f"{url}{path}", content=body, headers={"content-type": "application/json"})
            out.append((r.status_code, time.perf_counter() - t0))

    i = 0
    while not stop.is_set():
        burst = [threading.Thread(target=one, args=calls[i % len(calls)]) for _ in range(n)]
        for t in burst:
            t.start()
        for t in burst:
            t.join()
        i += 1
        stop.wait(2.0)


def phase(url: str, seconds: float, attackers: int) -> dict:
    stop, health, refused = threading.Event(), [], []
    threads = [threading.Thread(target=poll_health, args=(url, stop, health))]
    if attackers:
        threads.append(threading.Thread(target=attack, args=(url, stop, refused, attackers)))
    for t in threads:
        t.start()
    ttfts = []
    with httpx.Client(timeout=120) as c:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ttfts.append(ttft(c, url))
            time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join()
    q = statistics.quantiles
    return {
        "health_ms": {
            "p50": 1000 * statistics.median(health),
            "p99": 1000 * q(health, n=100)[98],
            "max": 1000 * max(health),
            "n": len(health),
        },
        "p0_ttft_ms": {"p50": 1000 * statistics.median(ttfts), "max": 1000 * max(ttfts)},
        "refusals": {
            "n": len(refused),
            "statuses": sorted({s for s, _ in refused}),
            "p50_ms": 1000 * statistics.median([t for _, t in refused]) if refused else None,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--attackers", type=int, default=4)
    args = ap.parse_args()
    port = free_port()
    proc = start(port)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=120) as c:
            ttft(c, url)  # warm-up
        idle = phase(url, args.seconds / 2, 0)
        loaded = phase(url, args.seconds, args.attackers)
    finally:
        proc.terminate()
        proc.wait(30)
    print(json.dumps({"idle": idle, "huge_prompts": loaded}, indent=2))


if __name__ == "__main__":
    main()
