"""Bursts at a real server, as issue 46 measured them: every request of a burst sent at the same
moment (aiohttp, one connection each), short chat prompts, `max_tokens` 32, streaming.

    python benchmarks/served/sla_burst.py --out out/sla-burst.json            # every scenario
    python benchmarks/served/sla_burst.py --only p0-on-30 mixed-on            # some of them
    python benchmarks/served/sla_burst.py --url http://127.0.0.1:8000 ...     # a running server

Scenarios (admission on = `--sla-admission on`; each starts its own server unless --url):

* ``p0-{off,on}-N``: N P0 requests at once (N in 6 10 20 30 75);
* ``mixed-on``: 300 requests, 75 per class, shuffled, at once;
* ``lone-p0``: 225 lower-class requests, and one P0 sent 0.3 s later.

Per class: sent, admitted, refused, first token at the client (P50/P95/max, from the moment the
burst was sent), how many within the class's SLA, how fast refusals came back, the server's
predicted TTFT (the ``x-tierserve-predicted-ttft-ms`` header) against the client's, and the
server's own ``llm_ttft_seconds`` mean for the burst (from /metrics) against the client's mean.
A burst starts on a warm server: two requests one after the other, then eight at once (P1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from pathlib import Path

import aiohttp

from tierserve.loadgen.server import served

SLA = {0: 0.5, 1: 5.0, 2: 60.0, 3: None}
TOPICS = [
    "the sea",
    "a lighthouse",
    "winter",
    "a train",
    "coffee",
    "a violin",
    "the moon",
    "bees",
    "a library",
    "rain",
    "mountains",
    "a bicycle",
    "bread",
    "the desert",
    "a clock",
    "owls",
]
PROMPTS = [f"Write one sentence about {t}." for t in TOPICS] + [
    f"Give me two facts about {t}." for t in TOPICS
]


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]


async def one(http: aiohttp.ClientSession, url: str, prio: int, t0: float, rng: random.Random):
    body = {
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
    }
    rec: dict = {"priority": prio, "sent": time.perf_counter() - t0}
    try:
        async with http.post(
            f"{url}/v1/chat/completions", json=body, headers={"x-request-tier": f"p{prio}"}
        ) as resp:
            rec["status"] = resp.status
            pred = resp.headers.get("x-tierserve-predicted-ttft-ms")
            rec["predicted_s"] = float(pred) / 1000 if pred else None
            if resp.status != 200:
                rec["error"] = (await resp.read()).decode(errors="replace")[:300]
                rec["answered"] = time.perf_counter() - t0
                return rec
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[5:])
                choices = obj.get("choices") or []
                if choices and choices[0].get("delta", {}).get("content"):
                    rec.setdefault("first", time.perf_counter() - t0)
            rec["done"] = time.perf_counter() - t0
    except aiohttp.ClientError as e:
        rec["status"] = -1
        rec["error"] = repr(e)
    return rec


def server_ttft(metrics: str) -> dict[int, tuple[float, float]]:
    """(sum, count) of llm_ttft_seconds per class."""
    out: dict[int, list[float]] = {}
    for line in metrics.splitlines():
        m = re.match(r"llm_ttft_seconds_(sum|count)\{([^}]*)\} ([0-9.e+-]+)", line)
        if not m:
            continue
        pm = re.search(r'priority="[Pp]?(\d)"', m.group(2))
        if not pm:
            continue
        slot = out.setdefault(int(pm.group(1)), [0.0, 0.0])
        slot[0 if m.group(1) == "sum" else 1] += float(m.group(3))
    return {k: (v[0], v[1]) for k, v in out.items()}


async def burst(url: str, prios: list[int], late: dict[int, float] | None, seed: int) -> dict:
    rng = random.Random(seed)
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        for _ in range(2):  # warm: the server, and the client's DNS/connection code
            await one(http, url, 1, time.perf_counter(), rng)
        # and steps of several prompts, for the step-time model (a server in use has seen them)
        await asyncio.gather(*(one(http, url, 1, time.perf_counter(), rng) for _ in range(8)))
        before = server_ttft(await (await http.get(f"{url}/metrics")).text())
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one(http, url, p, t0, rng)) for p in prios]
        for prio, delay in (late or {}).items():
            await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(http, url, prio, t0, rng)))
        recs = await asyncio.gather(*tasks)
        after = server_ttft(await (await http.get(f"{url}/metrics")).text())
    if late:
        recs[-1]["late"] = True
    out = summarize(recs, before, after)
    out["requests"] = recs
    return out


def summarize(recs: list[dict], before: dict, after: dict) -> dict:
    out: dict = {"classes": {}}
    for prio in range(4):
        mine = [r for r in recs if r["priority"] == prio]
        if not mine:
            continue
        ok = [r for r in mine if r.get("status") == 200 and "first" in r]
        ttft = [r["first"] - r["sent"] for r in ok]
        refused = [r["answered"] - r["sent"] for r in mine if r.get("status") in (429, 503)]
        signed = [r["predicted_s"] - (r["first"] - r["sent"]) for r in ok if r["predicted_s"]]
        errors = [abs(e) for e in signed]
        s0, n0 = before.get(prio, (0.0, 0.0))
        s1, n1 = after.get(prio, (0.0, 0.0))
        sla = SLA[prio]
        row = {
            "sent": len(mine),
            "admitted": len(ok),
            "refused": len(refused),
            "other": len(mine) - len(ok) - len(refused),
            "on_time": None if sla is None else sum(1 for t in ttft if t <= sla),
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p95_s": percentile(ttft, 95),
            "ttft_max_s": max(ttft) if ttft else None,
            "ttft_mean_s": sum(ttft) / len(ttft) if ttft else None,
            "server_ttft_mean_s": (s1 - s0) / (n1 - n0) if n1 > n0 else None,
            "refusal_p50_s": percentile(refused, 50),
            "refusal_p95_s": percentile(refused, 95),
            "prediction_abs_error_p50_s": percentile(errors, 50),
            "prediction_abs_error_p95_s": percentile(errors, 95),
            # predicted - measured: above 0 the predictor is pessimistic (refuses what fits)
            "prediction_bias_mean_s": sum(signed) / len(signed) if signed else None,
        }
        lone = [r for r in mine if r.get("late")]
        if lone and "first" in lone[0]:
            row["late_one_ttft_s"] = lone[0]["first"] - lone[0]["sent"]
        out["classes"][f"P{prio}"] = row
    return out


SCENARIOS: dict[str, tuple[bool, list[int], dict[int, float] | None]] = {}
for _n in (6, 10, 20, 30, 75):
    SCENARIOS[f"p0-off-{_n}"] = (False, [0] * _n, None)
    SCENARIOS[f"p0-on-{_n}"] = (True, [0] * _n, None)
_mixed = [p for p in range(4) for _ in range(75)]
random.Random(7).shuffle(_mixed)
SCENARIOS["mixed-on"] = (True, _mixed, None)
SCENARIOS["mixed-off"] = (False, _mixed, None)
SCENARIOS["lone-p0"] = (True, [p for p in (1, 2, 3) for _ in range(75)], {0: 0.3})


def print_row(name: str, res: dict) -> None:
    def f(x):
        return "–" if x is None else f"{x:.2f}"

    for cls, r in res["classes"].items():
        print(
            f"{name:12s} {cls} sent {r['sent']:3d} admitted {r['admitted']:3d} refused "
            f"{r['refused']:3d} on-time {r['on_time'] if r['on_time'] is not None else '–':>3} "
            f"ttft p50/p95/max {f(r['ttft_p50_s'])}/{f(r['ttft_p95_s'])}/{f(r['ttft_max_s'])} "
            f"server-mean {f(r['server_ttft_mean_s'])} client-mean {f(r['ttft_mean_s'])} "
            f"refusal p95 {f(r['refusal_p95_s'])} pred-err p95 "
            f"{f(r['prediction_abs_error_p95_s'])} bias {f(r['prediction_bias_mean_s'])}"
            + (f" late-one {f(r['late_one_ttft_s'])}" if "late_one_ttft_s" in r else ""),
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--url", help="a running server (its admission setting is the caller's)")
    p.add_argument("--serve-args", default="", help="extra `tierserve serve` arguments")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--trace", type=Path, help="a folder for each server's step trace (SCENARIO.steps.jsonl)"
    )
    args = p.parse_args()
    results: dict = {}
    for name in args.only:
        admission, prios, late = SCENARIOS[name]
        runs = []
        for i in range(args.repeat):
            if args.url:
                res = asyncio.run(burst(args.url, prios, late, seed=i))
            else:
                serve = ["--sla-admission", "on" if admission else "off"]
                serve += args.serve_args.split()
                env = {}
                if args.trace:
                    args.trace.mkdir(parents=True, exist_ok=True)
                    env["TIERSERVE_STEP_TRACE"] = str(args.trace / f"{name}.steps.jsonl")
                log = Path(f"/tmp/sla-burst-{name}.log")
                with served(serve, log=log, env=env) as url:
                    res = asyncio.run(burst(url, prios, late, seed=i))
            print_row(name, res)
            runs.append(res)
        results[name] = runs
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    return None


if __name__ == "__main__":
    sys.exit(main())
