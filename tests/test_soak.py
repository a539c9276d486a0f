"""Soak (issue 14): 1,000 mixed requests (chat and completions, streamed or not, every class,
random lengths, n up to 2) with random client disconnects, against a small KV cache. Afterwards
every request has ended with a terminal event, the KV pool and every gauge are back to idle, and
nothing was logged at error level. The full server stack runs over the fake executor."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time

import httpx

from tests.fake_engine import fake_built, words
from tests.server_utils import running_server
from tests.test_async_engine import gauges

N_REQUESTS = 1000
CONCURRENCY = 32


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _body(rng: random.Random, i: int) -> tuple[str, dict, dict]:
    stream = rng.random() < 0.6
    body = {"max_tokens": rng.randint(1, 40), "stream": stream, "n": rng.choice([1, 1, 1, 2])}
    if rng.random() < 0.3:
        body["stop"] = [f"w{rng.randrange(999)}"]
    if rng.random() < 0.5:
        body["ignore_eos"] = True
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    headers = {}
    prio = rng.randrange(4)
    if rng.random() < 0.5:
        body["priority"] = prio
    else:
        headers["x-request-tier"] = ["realtime", "online", "batch", "background"][prio]
    prompt = words(rng.randint(1, 120), start=i)  # the longest can never fit a P0 request
    if rng.random() < 0.5:
        body["messages"] = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", body, headers
    body["prompt"] = prompt
    return "/v1/completions", body, headers


async def _one(client, url, rng, i, outcomes):
    path, body, headers = _body(rng, i)
    disconnect_after = rng.uniform(0.0, 0.3) if rng.random() < 0.25 else None

    async def call():
        if not body["stream"]:
            r = await client.post(url + path, json=body, headers=headers)
            data = r.json()
            if r.status_code == 200:
                reasons = {c["finish_reason"] for c in data["choices"]}
                assert reasons <= {"stop", "length"}, data
                return "finished"
            assert "error" in data and data["error"]["message"], data
            assert r.status_code in (400, 429, 503), (r.status_code, data)
            return f"refused {r.status_code}"
        async with client.stream("POST", url + path, json=body, headers=headers) as r:
            if r.status_code != 200:
                data = json.loads(await r.aread())
                assert "error" in data and r.status_code in (400, 429, 503), data
                return f"refused {r.status_code}"
            events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        errs = [c["error"]["message"] for c in chunks if "error" in c]
        if errs:
            assert errs[0].startswith("shed"), errs  # the only error this soak can cause
            return "shed"
        ended = {c["index"] for ch in chunks for c in ch["choices"] if c["finish_reason"]}
        assert ended == set(range(body["n"])), chunks[-2:]
        return "finished"

    task = asyncio.create_task(call())
    if disconnect_after is None:
        outcomes.append(await task)
        return
    done, _ = await asyncio.wait({task}, timeout=disconnect_after)
    if done:
        outcomes.append(task.result())
    else:
        task.cancel()
        outcomes.append("disconnected")


def test_soak_every_request_ends_and_everything_returns_to_idle():
    built = fake_built(num_blocks=48, block_size=4, max_num_seqs=8, budget=128, step_s=0.001)
    errors = _Errors()
    logging.getLogger().addHandler(errors)
    try:
        limits = {"max_queued_requests": (3, 12, 12, 12)}  # full queues: 503s and P0 shedding
        with running_server(built, **limits) as (url, state):
            rng = random.Random(2024)
            outcomes: list[str] = []

            async def soak():
                sem = asyncio.Semaphore(CONCURRENCY)
                limits = httpx.Limits(max_connections=CONCURRENCY * 2)
                async with httpx.AsyncClient(timeout=120, limits=limits) as client:

                    async def bounded(i):
                        async with sem:
                            await _one(client, url, rng, i, outcomes)

                    await asyncio.gather(*(bounded(i) for i in range(N_REQUESTS)))

            asyncio.run(soak())
            deadline = time.monotonic() + 10
            while state.engine.num_in_flight() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # one idle tick and then some: gauges follow the last aborts
            assert state.engine.num_in_flight() == 0
            snap = state.engine.snapshot
            assert snap.num_running == 0 and sum(snap.waiting) == 0 and snap.swapped == 0
            assert snap.kv.num_free == 48
            g = gauges(url)
            for (name, labels), v in g.items():
                if name in (
                    "llm_requests_running",
                    "llm_requests_waiting",
                    "llm_scheduler_queue_depth",
                    "llm_kv_cache_usage",
                    "llm_requests_swapped",
                ):
                    assert v == 0, (name, labels, v)
                if name == "llm_kv_blocks" and ("state", "used") in labels:
                    assert v == 0, (name, labels, v)
            preempted = sum(v for (n, _), v in g.items() if n == "llm_preemption_total")
            assert preempted > 0, "the small cache never preempted: the soak is too gentle"
            ended = sum(v for (n, _), v in g.items() if n == "llm_requests_total")
            assert ended == sum(snap.intake), "every request taken in ended exactly once"
    finally:
        logging.getLogger().removeHandler(errors)
    assert len(outcomes) == N_REQUESTS
    counts = {k: outcomes.count(k) for k in set(outcomes)}
    assert counts.get("finished", 0) > 100 and counts.get("disconnected", 0) > 20, counts
    assert counts.get("refused 503", 0) > 20 and counts.get("refused 400", 0) > 5, counts
    assert counts.get("shed", 0) > 0, counts
    assert errors.records == [], [r.getMessage() for r in errors.records[:5]]
