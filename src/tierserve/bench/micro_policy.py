"""Micro-benchmark of the policies: add / pop / remove cost per operation with a large queue.

``tierserve bench-policy`` prints microseconds per operation for each policy.
"""

from __future__ import annotations

import gc
import random
import time

from tierserve.config import PolicyConfig
from tierserve.policies import POLICIES, SchedulerState, create_policy
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams


def _make(n: int, rng: random.Random, tenants: int) -> list[Request]:
    out = []
    for i in range(n):
        out.append(
            Request(
                f"q{i}",
                [1] * rng.randint(16, 2048),
                SamplingParams(max_tokens=rng.randint(1, 512)),
                priority=Priority(rng.randrange(4)),
                tenant=f"t{rng.randrange(tenants)}",
                arrival_time=i * 1e-4,
                arrival_seq=i,
            )
        )
    return out


def run_policy_bench(queued: int = 100_000, ops: int = 20_000, tenants: int = 50) -> list[tuple]:
    rows = []
    for name in POLICIES.names():
        rng = random.Random(0)
        reqs = _make(queued + ops, rng, tenants)
        # Keep the 120k fixture requests out of the cyclic GC's scans: otherwise whichever
        # policy runs first is charged for collecting them.
        gc.collect()
        gc.freeze()
        p = create_policy(PolicyConfig(name=name))
        state = SchedulerState(now=1.0, idle_seats=8)
        for r in reqs[:queued]:
            p.add(r)
        extra = reqs[queued:]
        t0 = time.perf_counter()
        for r in extra:
            p.add(r)
        t_add = (time.perf_counter() - t0) / ops
        victims = rng.sample(reqs[:queued], ops)
        t0 = time.perf_counter()
        for r in victims:
            p.remove(r)
        t_remove = (time.perf_counter() - t0) / ops
        t0 = time.perf_counter()
        for _ in range(ops):
            p.pop_next(state)
        t_pop = (time.perf_counter() - t0) / ops
        rows.append((name, len(p) + ops, t_add * 1e6, t_pop * 1e6, t_remove * 1e6))
        del p, reqs, extra, victims
        gc.unfreeze()
    return rows


def format_rows(rows: list[tuple], queued: int) -> str:
    lines = [
        f"policies, about {queued} queued requests (us per operation; target < 20)",
        f"{'policy':<10}{'queued':>10}{'add':>10}{'pop':>10}{'remove':>10}",
    ]
    for name, n, a, p, r in rows:
        lines.append(f"{name:<10}{n:>10}{a:>10.2f}{p:>10.2f}{r:>10.2f}")
    return "\n".join(lines)
