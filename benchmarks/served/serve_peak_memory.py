"""Peak RSS of `tierserve serve` (default model, 1 GiB KV cache) with the KV cache driven full.

Starts the server, floods it with long concurrent completions until the KV cache has been full
(preemptions happen), then prints the server's peak resident memory (VmHWM). Run:

    .venv/bin/python benchmarks/served/serve_peak_memory.py
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import signal

import httpx

from tierserve.loadgen.server import start_server

PORT = int(os.environ.get("PORT", "8131"))
URL = f"http://127.0.0.1:{PORT}"


def status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        text = f.read()
    return int(re.search(rf"{key}:\s+(\d+)", text).group(1)) // 1024


def main() -> int:
    proc, _ = start_server(["--kv-cache-gib", "1"], port=PORT, timeout_s=60)
    try:
        print(f"ready: RSS {status(proc.pid, 'VmRSS')} MiB")
        story = "Write a very long story about a dragon and a knight. " * 40  # ~480 tokens
        max_tokens = int(os.environ.get("MAX_TOKENS", "600"))

        def one(i):
            # A distinct first block per request: no prefix sharing, the KV really fills.
            body = {"prompt": f"Story number {i}. {story}", "max_tokens": max_tokens,
                    "ignore_eos": True, "temperature": 0}  # fmt: skip
            return httpx.post(f"{URL}/v1/completions", json=body, timeout=900).status_code

        with cf.ThreadPoolExecutor(48) as pool:
            codes = list(pool.map(one, range(48)))
        metrics = httpx.get(f"{URL}/metrics").text
        pre = sum(float(v) for v in re.findall(r"llm_preemption_total\{[^}]*\} (\S+)", metrics))
        print(
            f"48 requests x ~{480 + max_tokens} tokens (KV holds ~23k): "
            f"codes {sorted(set(codes))}, preemptions {pre:.0f}"
        )
        print(
            f"peak RSS (VmHWM) {status(proc.pid, 'VmHWM')} MiB; now {status(proc.pid, 'VmRSS')} MiB"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
