"""Benchmark of ``Scheduler.schedule()`` with a deep queue and a full batch.

``tierserve bench-sched`` fills 256 running requests (decoding) and 10,000 waiting ones that
cannot be admitted (no seats, lower classes), then times schedule() + update_from_output() per
step. The executor is skipped: every scheduled request gets token 1.
"""

from __future__ import annotations

import random
import statistics
import time

from tierserve.clock import ManualClock
from tierserve.config import CacheConfig, PolicyConfig, SchedulerConfig
from tierserve.core.kv import KVCacheManager
from tierserve.core.outputs import ExecutorOutput
from tierserve.core.scheduler import Scheduler
from tierserve.policies import create_policy
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams


def _req(i: int, prio: Priority, rng: random.Random, now: float) -> Request:
    return Request(
        f"r{i}",
        [rng.randrange(30000) for _ in range(rng.randint(64, 512))],
        SamplingParams(max_tokens=100_000 - 600, ignore_eos=True),
        priority=prio,
        tenant=f"t{i % 20}",
        arrival_time=now,
    )


def _step(s: Scheduler) -> float:
    t0 = time.perf_counter()
    out = s.schedule()
    dt = time.perf_counter() - t0
    sampled = {
        rid: 1
        for rid, n in out.num_scheduled_tokens.items()
        if s.requests[rid].num_computed_tokens + n == s.requests[rid].num_tokens
    }
    s.update_from_output(out, ExecutorOutput(sampled_token_ids=sampled))
    return dt


def run_sched_bench(
    policy: str = "hybrid", running: int = 256, waiting: int = 10_000, steps: int = 200
) -> dict:
    rng = random.Random(0)
    clock = ManualClock()
    kv = KVCacheManager(CacheConfig(block_size=16, num_blocks=40_000))
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=running, max_num_batched_tokens=16384, max_model_len=100_000),
        kv,
        create_policy(PolicyConfig(name=policy)),
        clock,
    )
    for i in range(running):
        sched.add_request(_req(i, Priority(i % 2), rng, clock.now()))
    while len(sched.running) < running or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in sched.running.values()
    ):
        _step(sched)
    for i in range(waiting):
        sched.add_request(_req(running + i, Priority(2 + i % 2), rng, clock.now()))
    times = []
    for _ in range(steps):
        clock.advance(0.02)
        times.append(_step(sched))
    times.sort()
    return {
        "policy": policy,
        "running": len(sched.running),
        "waiting": sched.num_waiting,
        "median_ms": 1e3 * statistics.median(times),
        "p99_ms": 1e3 * times[int(0.99 * (len(times) - 1))],
    }


def format_result(rows: list[dict]) -> str:
    lines = [
        "schedule() per step, 256 running (decode) + 10,000 waiting (target < 1 ms)",
        f"{'policy':<10}{'running':>9}{'waiting':>9}{'median ms':>11}{'p99 ms':>9}",
    ]
    for r in rows:
        lines.append(
            f"{r['policy']:<10}{r['running']:>9}{r['waiting']:>9}{r['median_ms']:>11.3f}"
            f"{r['p99_ms']:>9.3f}"
        )
    return "\n".join(lines)
