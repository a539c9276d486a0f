"""Whole-engine properties with the KV-simulating fake executor:

* preemption never changes results: 500 random requests give identical tokens whatever the
  policy, the memory size and the preemption mode;
* randomized stress with arrivals, aborts and tiny memory never breaks an invariant, never loses
  or double-finishes a request, and gives every block back when the engine drains.
"""

import random
from dataclasses import dataclass

import pytest

from tierserve.clock import ManualClock
from tierserve.config import CacheConfig, PartitionConfig, PolicyConfig, SchedulerConfig
from tierserve.core.preemption import PreemptionCosts
from tierserve.engine import EngineCore
from tierserve.executor.fake import FakeExecutor
from tierserve.priority import Priority
from tierserve.request import Request, RequestStatus
from tierserve.sampling_params import SamplingParams

EOS = 7
CHEAP_SWAP = PreemptionCosts(1e3, 1e9, 1e3)


@dataclass(frozen=True)
class Spec:
    rid: str
    tokens: tuple[int, ...]
    priority: Priority
    max_tokens: int
    arrival_step: int
    tenant: str


def make_specs(n: int, seed: int, max_prompt: int = 120, max_out: int = 30) -> list[Spec]:
    rng = random.Random(seed)
    prefixes = [tuple(rng.randrange(1000) for _ in range(rng.randint(8, 40))) for _ in range(6)]
    specs = []
    for i in range(n):
        body = tuple(rng.randrange(1000) for _ in range(rng.randint(1, max_prompt - 40)))
        tokens = (rng.choice(prefixes) + body) if rng.random() < 0.5 else body
        specs.append(
            Spec(
                rid=f"s{seed}-{i}",
                tokens=tokens,
                priority=Priority(rng.randrange(4)),
                max_tokens=rng.randint(1, max_out),
                arrival_step=rng.randint(0, n // 4),
                tenant=f"t{rng.randrange(3)}",
            )
        )
    return specs


def to_request(s: Spec, now: float) -> Request:
    return Request(
        s.rid,
        list(s.tokens),
        SamplingParams(max_tokens=s.max_tokens, temperature=0.0),
        priority=s.priority,
        tenant=s.tenant,
        arrival_time=now,
        eos_token_id=EOS,
        cache_salt=None,
    )


def build(policy: str, num_blocks: int, mode: str, cpu: int = 64, seqs: int = 32, budget=256):
    clock = ManualClock()
    costs = CHEAP_SWAP if mode in ("swap", "auto") else None
    ex = FakeExecutor(num_blocks, 4, cpu, costs=costs)
    eng = EngineCore.build(
        ex,
        clock,
        CacheConfig(4, num_blocks, cpu, partitions=PartitionConfig(window_s=0.05)),
        SchedulerConfig(
            max_num_seqs=seqs,
            max_num_batched_tokens=budget,
            preemption_mode=mode,
            check_invariants=True,
            max_model_len=1024,
        ),
        PolicyConfig(name=policy),
    )
    return eng, clock


def run_specs(specs, policy, num_blocks, mode):
    eng, clock = build(policy, num_blocks, mode)
    return drive_specs(eng, clock, specs)[0], eng


def drive_specs(eng, clock, specs) -> tuple[dict, int]:
    """Run `specs` (each arriving at its step) to the end; every request must finish and every
    block come back. Returns each request's (tokens, finish reason), and the steps taken."""
    by_step: dict[int, list[Spec]] = {}
    for s in specs:
        by_step.setdefault(s.arrival_step, []).append(s)
    reqs = {}
    step = 0
    while step <= max(by_step) or eng.has_unfinished():
        for s in by_step.get(step, []):
            reqs[s.rid] = to_request(s, clock.now())
            eng.add_request(reqs[s.rid])
        eng.step()
        clock.advance(0.01)
        step += 1
        assert step < 100_000
    assert all(r.status == RequestStatus.FINISHED for r in reqs.values())
    kv = eng.scheduler.kv
    assert kv.pool.num_free == kv.pool.num_blocks and kv.swap.num_used == 0
    assert kv.ledger.used == [0, 0, 0, 0]
    return {rid: (tuple(r.output_token_ids), r.finish_reason) for rid, r in reqs.items()}, step


def test_outputs_identical_across_policies_memory_and_preemption_modes():
    specs = make_specs(500, seed=11)
    reference, _ = run_specs(specs, "fcfs", 4096, "recompute")
    assert sum(len(t) for t, _ in reference.values()) > 2000
    preempted = 0
    for policy, blocks, mode in [
        ("hybrid", 80, "recompute"),
        ("hybrid", 80, "swap"),
        ("strict", 80, "auto"),
        ("drr", 100, "recompute"),
        ("wfq", 80, "swap"),
        ("fcfs", 80, "auto"),
        ("hybrid", 4096, "auto"),
    ]:
        got, eng = run_specs(specs, policy, blocks, mode)
        assert got == reference, f"{policy}/{blocks}/{mode} changed outputs"
        p = eng.scheduler.preemptions
        preempted += p.swap + p.recompute
    assert preempted > 50  # the small pools really did preempt, in both modes


def stress(eng, clock, rng, specs) -> int:
    """Random arrivals (0-3 a step), aborts (8% of steps) and clock jumps until every request
    has ended: each exactly once, finished or aborted, and every block and swap slot back.
    Returns the steps taken."""
    live: dict[str, Request] = {}
    ended: dict[str, RequestStatus] = {}
    pending = list(specs)
    steps = 0
    while pending or eng.has_unfinished():
        for _ in range(rng.randint(0, 3)):
            if pending:
                r = to_request(pending.pop(), clock.now())
                eng.add_request(r)
                live[r.request_id] = r
        if live and rng.random() < 0.08:
            rid = rng.choice(sorted(live))
            r = eng.abort_request(rid)
            if r is not None:
                assert r.status == RequestStatus.ABORTED
        for r in eng.step():
            if r.is_finished:
                assert r.request_id not in ended, "finished twice"
                ended[r.request_id] = r.status
        for rid in [rid for rid, r in live.items() if r.is_finished]:
            ended.setdefault(rid, live[rid].status)
            del live[rid]
        clock.advance(rng.choice([0.001, 0.01, 0.2]))
        steps += 1
        assert steps < 50_000
    assert len(ended) == len(specs)  # every request ended exactly once
    assert set(ended.values()) <= {RequestStatus.FINISHED, RequestStatus.ABORTED}
    kv = eng.scheduler.kv
    assert kv.pool.num_free == kv.pool.num_blocks
    assert kv.swap.num_used == 0 and kv.ledger.used == [0, 0, 0, 0]
    return steps


@pytest.mark.parametrize(
    ("seed", "speculate"), [(s, False) for s in range(6)] + [(1, True), (4, True), (5, True)]
)
def test_random_stress_keeps_invariants_and_loses_nothing(seed, speculate):
    """With `speculate`, drafts (right and wrong: tests/test_spec_core.py's oracle) and their
    rollbacks are in the mix too."""
    rng = random.Random(seed)
    policy = ["fcfs", "strict", "drr", "wfq", "hybrid", "hybrid"][seed]
    mode = ["recompute", "swap", "auto"][seed % 3]
    eng, clock = build(
        policy, num_blocks=rng.choice([40, 60]), mode=mode, cpu=24, seqs=8, budget=64
    )
    if speculate:
        from tests.test_spec_core import oracle
        from tierserve.core.speculation import SpecConfig, Speculation

        cfg = SpecConfig(classes=(0, 1, 2, 3), prior_acceptance=0.9)
        eng.scheduler.speculation = Speculation(cfg, oracle(random.Random(seed), 0.3))
    specs = make_specs(300, seed=100 + seed, max_prompt=80, max_out=20)
    steps = stress(eng, clock, rng, specs)
    assert steps > 300
    if speculate:
        c = eng.scheduler.speculation.counts
        assert sum(c.accepted) > 0 and sum(c.drafted) > sum(c.accepted)


def _schedule_trace(specs, policy, num_blocks=60, long_prefill=48):
    """Every step's scheduled token counts and preemptions, in request-id terms."""
    clock = ManualClock()
    eng = EngineCore.build(
        FakeExecutor(num_blocks, 4, 32, costs=CHEAP_SWAP),
        clock,
        CacheConfig(4, num_blocks, 32),  # default partitions: a P0 floor and a P1 reserve
        SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=96,
            preemption_mode="auto",
            check_invariants=True,
            max_model_len=1024,
            long_prefill_threshold=long_prefill,
            long_prefill_max_tokens=16,
            p0_express="exclusive",
        ),
        PolicyConfig(name=policy),
    )
    by_step: dict[int, list[Spec]] = {}
    for s in specs:
        by_step.setdefault(s.arrival_step, []).append(s)
    trace, step = [], 0
    while step <= max(by_step) or eng.has_unfinished():
        for s in by_step.get(step, []):
            eng.add_request(to_request(s, clock.now()))
        out = eng.scheduler.schedule
        sched = []

        def spy(out=out, sched=sched):
            o = out()
            sched.append((dict(o.num_scheduled_tokens), sorted(o.preempted_req_ids)))
            return o

        eng.scheduler.schedule = spy
        eng.step()
        eng.scheduler.schedule = out
        trace.append(sched[0])
        clock.advance(0.01)
        step += 1
        assert step < 100_000
    return trace


@pytest.mark.parametrize("seed", range(3))
def test_fcfs_ignores_priority_completely(seed):
    """Issue 14 item 10: under fcfs ("priority ignored") relabelling every request's class
    changes nothing: not the order, not the prefill cap, not memory partitions, not express
    steps, not swap-in order."""
    specs = make_specs(60, seed=100 + seed, max_prompt=110, max_out=20)
    rng = random.Random(seed)
    relabelled = [
        Spec(s.rid, s.tokens, Priority(rng.randrange(4)), s.max_tokens, s.arrival_step, s.tenant)
        for s in specs
    ]
    assert [s.priority for s in specs] != [s.priority for s in relabelled]
    assert _schedule_trace(specs, "fcfs") == _schedule_trace(relabelled, "fcfs")
    # The same relabelling does change what a class-aware policy does.
    assert _schedule_trace(specs, "hybrid") != _schedule_trace(relabelled, "hybrid")
