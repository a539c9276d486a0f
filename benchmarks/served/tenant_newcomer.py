"""Issue 46's newcomer experiment: tenant fair share without a newcomer's windfall.

    python benchmarks/served/tenant_newcomer.py [--alone-s 15] [--flood-s 20] [--workers 24]

A default server with `--max-num-seqs 4`. Tenant B (x-tenant-id, authentication off) sends P2
chat requests one after another for `--alone-s` seconds; then tenant A starts `--workers`
workers sending P2 requests back to back for `--flood-s` seconds while B goes on. Reports B's
first-token times for the requests it sent after A's flood began (worst, median) and each
tenant's completed requests during the flood. Before the lift, B's next request waited while
A's first 40 went first (6.51 s on a Zen 2): A's counter started at 0, below B's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp

from tierserve.loadgen.server import served


async def one(http, url: str, tenant: str, i: int) -> tuple[float, float, float | None]:
    body = {
        "messages": [{"role": "user", "content": f"Write one sentence about the number {i}."}],
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
    }
    headers = {"x-request-tier": "p2", "x-tenant-id": tenant}
    sent = time.perf_counter()
    first = None
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if first is None and line.startswith("data:") and line != "data: [DONE]":
                delta = json.loads(line[5:])["choices"][0]["delta"]
                if delta.get("content"):
                    first = time.perf_counter() - sent
    return sent, time.perf_counter(), first


async def experiment(url: str, alone_s: float, flood_s: float, workers: int) -> dict:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        start = time.perf_counter()
        b_alone = 0
        while time.perf_counter() - start < alone_s:
            await one(http, url, "B", b_alone)
            b_alone += 1
        flood_at = time.perf_counter()
        stop = flood_at + flood_s
        done = {"A": 0, "B": 0}
        b_ttft: list[float] = []

        async def worker(tenant: str, k: int, record: list[float] | None):
            i = 0
            while time.perf_counter() < stop:
                _, _, first = await one(http, url, tenant, 1000 * k + i)
                i += 1
                done[tenant] += 1
                if record is not None and first is not None:
                    record.append(first)

        await asyncio.gather(
            *(worker("A", k + 1, None) for k in range(workers)), worker("B", 0, b_ttft)
        )
    return {
        "b_alone_requests": b_alone,
        "b_ttft_after_flood_worst_s": max(b_ttft) if b_ttft else None,
        "b_ttft_after_flood_first_s": b_ttft[0] if b_ttft else None,
        "b_ttft_after_flood_p50_s": statistics.median(b_ttft) if b_ttft else None,
        "completed_during_flood": done,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alone-s", type=float, default=15.0)
    p.add_argument("--flood-s", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=24)
    p.add_argument("--serve-args", default="", help="extra `tierserve serve` arguments")
    args = p.parse_args()
    serve = ["--max-num-seqs", "4", *args.serve_args.split()]
    with served(serve) as url:
        res = asyncio.run(experiment(url, args.alone_s, args.flood_s, args.workers))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
