"""A short mixed-class load against a running tierserve (single process or cluster ingress):
open-loop Poisson arrivals of streamed chat requests in three classes, then per-class TTFT
percentiles, SLA attainment and throughput, and -- from the server's /metrics -- requests per
replica and routing decisions by reason (cluster only).

    python benchmarks/served/cluster_load.py --url http://127.0.0.1:8000 --duration 60 --rate 2

Classes (x-request-tier header): realtime P0 (short answer), online P1, background P3 (long,
ignore_eos). TTFT is measured at the client: request sent to first content chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter, defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

CLASSES = {  # tier: (share of arrivals, max_tokens, ignore_eos, TTFT SLA s)
    "realtime": (0.3, 16, False, 0.5),
    "online": (0.4, 64, False, 5.0),
    "background": (0.3, 128, True, 60.0),
}
PROMPTS = [
    "Tell me about the history of the bicycle.",
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain how a refrigerator works.",
    "List five animals that live in the desert.",
]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def one(client: httpx.AsyncClient, url: str, tier: str, prompt: str, out: list) -> None:
    _, max_tokens, ignore_eos, _ = CLASSES[tier]
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rec = {"tier": tier, "status": None, "ttft": None, "tokens": 0, "error": None}
    t0 = time.perf_counter()
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"x-request-tier": tier}
        ) as r:
            rec["status"] = r.status_code
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    rec["error"] = obj["error"]["message"]
                elif obj.get("usage"):
                    rec["tokens"] = obj["usage"]["completion_tokens"]
                elif rec["ttft"] is None and obj["choices"][0]["delta"].get("content"):
                    rec["ttft"] = time.perf_counter() - t0
    except httpx.HTTPError as exc:
        rec["error"] = repr(exc)
    out.append(rec)


async def run(url: str, duration: float, rate: float, seed: int) -> tuple[list, float]:
    rng = random.Random(seed)
    tiers, weights = list(CLASSES), [c[0] for c in CLASSES.values()]
    out: list = []
    tasks = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        start = time.perf_counter()
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t > duration:
                break
            await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
            tier = rng.choices(tiers, weights)[0]
            tasks.append(asyncio.create_task(one(client, url, tier, rng.choice(PROMPTS), out)))
        await asyncio.gather(*tasks)
        return out, time.perf_counter() - start


def server_counts(url: str) -> tuple[dict, dict]:
    """(finished requests by replica and class, routing decisions by reason) from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    by_replica: dict = defaultdict(Counter)
    reasons: Counter = Counter()
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == "llm_requests_total":
                by_replica[s.labels.get("replica", "-")][s.labels["priority"]] += int(s.value)
            elif s.name == "tierserve_routed_requests_total":
                reasons[s.labels["reason"]] += int(s.value)
    return dict(by_replica), dict(reasons)


def report(recs: list, elapsed: float, url: str) -> dict:
    rows = {}
    for tier, (_, _, _, sla) in CLASSES.items():
        rs = [r for r in recs if r["tier"] == tier]
        ok = [r for r in rs if r["status"] == 200 and not r["error"] and r["ttft"] is not None]
        ttfts = [r["ttft"] for r in ok]
        rows[tier] = {
            "sent": len(rs),
            "ok": len(ok),
            "refused": sum(r["status"] in (429, 503) for r in rs),
            "errors": sum(bool(r["error"]) for r in rs),
            "ttft_p50_s": round(pct(ttfts, 0.5), 3),
            "ttft_p95_s": round(pct(ttfts, 0.95), 3),
            "sla_attainment": round(sum(t <= sla for t in ttfts) / len(ok), 3) if ok else None,
        }
    tokens = sum(r["tokens"] for r in recs)
    by_replica, reasons = server_counts(url)
    return {
        "elapsed_s": round(elapsed, 1),
        "output_tok_per_s": round(tokens / elapsed, 1),
        "classes": rows,
        "finished_by_replica": by_replica,
        "routing_reasons": reasons,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second (Poisson)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the report here")
    a = p.parse_args()
    recs, elapsed = asyncio.run(run(a.url, a.duration, a.rate, a.seed))
    rep = report(recs, elapsed, a.url)
    print(f"{len(recs)} requests in {rep['elapsed_s']} s, {rep['output_tok_per_s']} output tok/s")
    print(
        f"{'class':<11} {'sent':>5} {'ok':>5} {'refused':>7} {'errors':>6} "
        f"{'TTFT p50':>9} {'TTFT p95':>9} {'SLA met':>8}"
    )
    for tier, r in rep["classes"].items():
        print(
            f"{tier:<11} {r['sent']:>5} {r['ok']:>5} {r['refused']:>7} {r['errors']:>6} "
            f"{r['ttft_p50_s']:>9} {r['ttft_p95_s']:>9} {r['sla_attainment']!s:>8}"
        )
    print("finished by replica:", json.dumps(rep["finished_by_replica"], sort_keys=True))
    print("routing decisions:", json.dumps(rep["routing_reasons"], sort_keys=True))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=2)


if __name__ == "__main__":
    main()
