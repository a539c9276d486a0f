"""The Batch API's two targets (issue 27), on one server, in one sitting:

1. Fills idle capacity: a 2,000-line batch on an otherwise idle server completes at >= 90% of
   the output tokens/s that `tierserve bench serve` reaches at the same concurrency (the batch
   window, `--batch-window`, is that concurrency).
2. Steps aside: while such a batch runs, realtime (P0) TTFT P95 <= 1.5x its idle value and
   online (P1) TTFT P95 within its SLA, at a probe load that met it without the batch; and the
   batch still progresses.

    python benchmarks/served/batch_fill.py                      # the targets' configuration
    python benchmarks/served/batch_fill.py --lines 200 --probe-requests 20   # a smoke run

It starts `tierserve serve` on a free port (a fresh --batch-db in a temporary folder), runs
`tierserve bench serve` (completions, P2 only, --ignore-eos, the same prompt and output lengths)
for the reference, then the batch alone, then the P0/P1 probes idle and beside a second batch.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

from tierserve.loadgen import server as loadgen_server
from tierserve.loadgen.text import PromptMaker, load_tokenizer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, tmp: Path) -> tuple[subprocess.Popen, str]:
    cmd = ["--batch-db", str(tmp / "batch.db"), "--files-dir", str(tmp / "files")]
    cmd += ["--batch-window", str(args.concurrency), "--max-num-seqs", str(args.max_num_seqs)]
    cmd += ["--log-level", "warning", *args.serve_args]
    return loadgen_server.start_server(cmd, log=tmp / "server.log", timeout_s=120)


def bench_serve(url: str, tmp: Path, name: str, extra: list[str]) -> dict:
    """One `tierserve bench serve` run; its results.json's first run."""
    out = tmp / name
    cmd = [sys.executable, "-m", "tierserve", "bench", "serve", "--base-url", url]
    cmd += ["--api", "completions", "--out", str(out), "--no-progress", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())["runs"][0]


def batch_file(args, prompts: PromptMaker, seed: str) -> bytes:
    lines = []
    for i in range(args.lines):
        body = {
            "prompt": prompts.make(args.prompt_len, i, seed),
            "max_tokens": args.output_len,
            "ignore_eos": True,
            "temperature": 0,
        }
        lines.append({"custom_id": f"{seed}-{i}", "method": "POST", "url": "/v1/completions",
                      "body": body})  # fmt: skip
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def start_batch(client: openai.OpenAI, data: bytes):
    f = client.files.create(file=("batch.jsonl", data), purpose="batch")
    return client.batches.create(
        input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"
    )


def wait_batch(client: openai.OpenAI, batch_id: str):
    while (b := client.batches.retrieve(batch_id)).status not in (
        "completed", "failed", "expired", "cancelled",
    ):  # fmt: skip
        time.sleep(0.1)
    return b


def output_tokens(client: openai.OpenAI, file_id: str) -> int:
    lines = client.files.content(file_id).text.splitlines()
    return sum(json.loads(x)["response"]["body"]["usage"]["completion_tokens"] for x in lines)


def probes(url: str, tmp: Path, name: str, args) -> dict:
    """P0 and P1 requests, closed loop (half each), short prompts."""
    extra = ["--concurrency", str(args.probe_concurrency), "--num-requests",
             str(args.probe_requests), "--mix", "50", "50", "0", "0", "--prompt-len",
             str(args.probe_prompt_len), "--output-len", str(args.probe_output_len),
             "--ignore-eos", "--warmup-requests", "0"]  # fmt: skip
    return bench_serve(url, tmp, name, extra)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lines", type=int, default=2000, help="lines per batch (2000)")
    p.add_argument("--concurrency", type=int, default=32, help="batch window = bench clients")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--probe-concurrency", type=int, default=2)
    p.add_argument("--probe-requests", type=int, default=60)
    p.add_argument("--probe-prompt-len", type=int, default=32)
    p.add_argument("--probe-output-len", type=int, default=8)
    p.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[],
                   help="more `tierserve serve` flags (last)")  # fmt: skip
    args = p.parse_args()
    prompts = PromptMaker(load_tokenizer(None))
    with tempfile.TemporaryDirectory(prefix="batch-fill-") as d:
        tmp = Path(d)
        proc, url = start_server(args, tmp)
        try:
            run(args, url, tmp, prompts)
        finally:
            proc.terminate()
            proc.wait(60)


def run(args, url: str, tmp: Path, prompts: PromptMaker) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=2)
    ref = bench_serve(url, tmp, "reference", [
        "--concurrency", str(args.concurrency), "--num-requests", str(args.lines),
        "--mix", "0", "0", "100", "0", "--prompt-len", str(args.prompt_len),
        "--output-len", str(args.output_len), "--ignore-eos",
    ])  # fmt: skip
    ref_tps = ref["throughput_tokens_per_s"]
    t0 = time.monotonic()
    b = wait_batch(client, start_batch(client, batch_file(args, prompts, "fill")).id)
    elapsed = time.monotonic() - t0
    batch_tps = output_tokens(client, b.output_file_id) / elapsed
    print(f"1. fills idle capacity ({args.lines} lines, window {args.concurrency}):")
    print(f"   bench serve {ref_tps:.1f} output tok/s; batch {batch_tps:.1f} tok/s "
          f"({elapsed:.1f} s, {b.request_counts.completed} ok, {b.request_counts.failed} failed)"
          f" = {100 * batch_tps / ref_tps:.0f}% (target >= 90%)")  # fmt: skip

    idle = probes(url, tmp, "probes-idle", args)
    busy_batch = start_batch(client, batch_file(args, prompts, "aside"))
    while client.batches.retrieve(busy_batch.id).request_counts.completed < args.concurrency:
        time.sleep(0.1)  # the window is full before the probes start
    before = client.batches.retrieve(busy_batch.id).request_counts.completed
    busy = probes(url, tmp, "probes-busy", args)
    after = client.batches.retrieve(busy_batch.id).request_counts.completed
    client.batches.cancel(busy_batch.id)
    p0_idle, p0_busy = (r["classes"]["P0"]["ttft_p95_s"] for r in (idle, busy))
    p1_idle, p1_busy = (r["classes"]["P1"]["ttft_p95_s"] for r in (idle, busy))
    sla = busy["classes"]["P1"]["sla_s"]
    print("2. steps aside (P0/P1 probes, "
          f"{args.probe_concurrency} clients, {args.probe_requests} requests):")  # fmt: skip
    print(
        f"   P0 TTFT P95 idle {1000 * p0_idle:.0f} ms, beside the batch "
        f"{1000 * p0_busy:.0f} ms = {p0_busy / p0_idle:.2f}x (target <= 1.5x)"
    )
    print(
        f"   P1 TTFT P95 idle {1000 * p1_idle:.0f} ms, beside the batch "
        f"{1000 * p1_busy:.0f} ms (SLA {sla:g} s)"
    )
    print(f"   the batch progressed by {after - before} lines during the probes")


if __name__ == "__main__":
    main()
