"""The engine thread's contracts (issue 14 items 1, 4, 8): every request ends with a terminal
event, gauges follow the state within an idle tick, and the event loop never touches live
scheduler state. Runs the real stack over the fake executor: no model needed."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_engine import fake_built, tiny_tokenizer, words
from tests.server_utils import running_server
from tierserve.config import PartitionConfig
from tierserve.engine.async_engine import AsyncEngine
from tierserve.priority import Priority
from tierserve.request import EngineRequest
from tierserve.sampling_params import SamplingParams

FLAT = PartitionConfig(p0_floor_min=0, p0_floor_max=0, p0_ceiling=1.0, p1_reserve=0)


def gauges(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def test_stream_ends_when_the_kv_cache_runs_out_on_a_lone_request():
    """Item 1: alone and out of blocks, a request is finished with `length`; its stream gets the
    terminal delta (it used to hang: the step that ended it returned early with nothing)."""
    built = fake_built(num_blocks=10, block_size=4, partitions=FLAT)
    engine = AsyncEngine(built.engine, tiny_tokenizer())
    engine.start()

    async def run():
        sp = SamplingParams(max_tokens=2000, ignore_eos=True)
        req = EngineRequest("lone", tuple(range(1, 26)), sp)
        return [d async for d in engine.generate(req)]

    try:
        deltas = asyncio.run(asyncio.wait_for(run(), timeout=20))
    finally:
        engine.shutdown()
    assert deltas[-1].finished and deltas[-1].finish_reason == "length"
    # all 40 slots used; the last token needs none
    assert deltas[-1].num_output_tokens == sum(len(d.token_ids) for d in deltas) == 40 - 25 + 1
    assert engine.num_in_flight() == 0
    assert engine.snapshot.kv.num_free == 10 and engine.snapshot.num_running == 0


def test_gauges_follow_aborted_streams_within_an_idle_tick():
    """Item 4: after clients abort their streams, running/waiting gauges and KV usage return to
    idle although no further request arrives; before any request the free-block gauges show the
    pool."""
    built = fake_built(num_blocks=256, block_size=4, max_num_seqs=32, step_s=0.02)
    with running_server(built) as (url, _state):
        before = gauges(url)
        free = sum(
            v for (n, lab), v in before.items() if n == "llm_kv_blocks" and ("state", "free") in lab
        )
        assert free == 256

        async def open_and_abort():
            async with httpx.AsyncClient(timeout=30) as client:

                async def one(i):
                    body = {
                        "prompt": words(8, i),
                        "max_tokens": 500,
                        "stream": True,
                        "ignore_eos": True,
                    }
                    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            if line.startswith("data: {"):
                                return  # got a token: disconnect

                await asyncio.gather(*(one(i) for i in range(20)))

        asyncio.run(open_and_abort())
        deadline = time.monotonic() + 3.0
        while True:
            g = gauges(url)
            running = sum(v for (n, _), v in g.items() if n == "llm_requests_running")
            usage = g[("llm_kv_cache_usage", ())]
            if (running == 0 and usage == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (running, usage) == (0, 0)


class _EngineThreadOnly:
    """Wraps the scheduler: any attribute read from a thread other than the engine's (once it
    runs) is recorded as a violation of the no-shared-state contract."""

    def __init__(self, inner, owner: list) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "violations", [])

    def __getattr__(self, name):
        owner = self._owner[0] if self._owner else None
        me = threading.current_thread()
        if owner is not None and owner.is_alive() and me is not owner:
            self.violations.append((me.name, name))
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


def test_event_loop_never_reads_live_scheduler_state_under_p0_overflow():
    """Item 8: a P0 flood over full queues makes admission shed lower classes while the engine
    thread is busy; the event loop must read only the published snapshot (the old code walked
    the policy's dicts from the event loop: 'dictionary changed size during iteration')."""
    built = fake_built(num_blocks=128, block_size=4, max_num_seqs=4, step_s=0.003)
    owner: list = []
    guard = _EngineThreadOnly(built.engine.scheduler, owner)
    built.engine.scheduler = guard
    limits = dict(max_queued_requests=(4, 64, 64, 64))
    with running_server(built, **limits) as (url, state):
        owner.append(state.engine._thread)
        rng = random.Random(3)

        async def flood():
            async with httpx.AsyncClient(timeout=60) as client:

                async def one(i):
                    prio = 0 if i % 3 == 0 else rng.choice([2, 3])
                    body = {
                        "prompt": words(6, i),
                        "max_tokens": rng.randint(1, 12),
                        "priority": prio,
                    }
                    r = await client.post(f"{url}/v1/completions", json=body)
                    return prio, r.status_code

                return await asyncio.gather(*(one(i) for i in range(150)))

        results = asyncio.run(flood())
    assert guard.violations == []
    codes = {c for _, c in results}
    assert codes <= {200, 503}, codes
    assert any(p == 0 for p, c in results if c == 200)
    assert any(c == 503 for p, c in results if p != 0), "nobody was shed or refused"


@pytest.mark.parametrize("policy", ["fcfs", "hybrid"])
def test_snapshot_is_immutable_and_counts_what_was_taken_in(policy):
    built = fake_built(policy=policy)
    engine = AsyncEngine(built.engine, tiny_tokenizer())
    snap0 = engine.snapshot
    with pytest.raises(AttributeError):
        snap0.waiting = (1, 2, 3, 4)
    engine.start()

    async def run():
        sp = SamplingParams(max_tokens=2)
        reqs = [EngineRequest(f"r{i}", (1, 2, 3), sp, priority=Priority(i % 4)) for i in range(8)]
        streams = [engine.submit(r) for r in reqs]
        for s in streams:
            async with s:
                async for _ in s.deltas():
                    pass

    try:
        asyncio.run(asyncio.wait_for(run(), timeout=20))
        time.sleep(0.05)
        snap = engine.snapshot
    finally:
        engine.shutdown()
    assert snap.seq > snap0.seq
    assert snap.intake == (2, 2, 2, 2) and snap.intake_tokens == (6, 6, 6, 6)
    assert [n for n, _ in snap.served] == [2, 2, 2, 2]
    assert snap.num_running == 0 and sum(snap.waiting) == 0
