"""Issue 21's probes of "P0 never waits behind the others", on the real scheduler with the CPU
engine's step times (`cpu-local` profile, SmolLM2-135M, the server's CPU defaults: 64 seats,
512-token steps, exclusive express steps). Deterministic and fast: the tests assert on them
and `benchmarks/simulation/p0_isolation_sim.py` prints them; `benchmarks/served/p0_isolation.py`
runs the same
probes against a served engine.

* ``probe_behind``: realtime probes arriving at random while one long request prefills
  (item 2);
* ``bench_throughput``: `bench serve`'s closed-loop shape (158 prompt + 64 output tokens);
* ``overload``: 20 P1 + 1 P0 requests a second, open loop, SLA admission on, then a lone P1
  some seconds after the burst (item 3);
* ``prefix_churn``: the P0 prefix hit rate under a background flood that churns the cache
  (item 1).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from tierserve.clock import ManualClock
from tierserve.config import CacheConfig, PolicyConfig, SchedulerConfig
from tierserve.core.step_time import MIN_OBSERVATIONS
from tierserve.engine.core import EngineCore
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams
from tierserve.sim.engine.cost_clock import CostClockExecutor
from tierserve.sim.engine.runner import SimConfig, run_simulation
from tierserve.sim.scenarios import with_sla_admission
from tierserve.workloads.synthetic import (
    DEFAULT_CLASSES,
    ClassSpec,
    LengthDist,
    ProbedFlood,
    Workload,
    WorkloadConfig,
)

P0, P1, P2, P3 = Priority
DEFAULT_FRACTION = SchedulerConfig().step_time_fraction

CPU = SimConfig(
    hardware="cpu-local",
    model="smollm2-135m",
    tp=1,
    max_num_seqs=64,
    max_num_batched_tokens=512,
    p0_express="exclusive",
    swap_gib_per_device=0,
    num_kv_blocks=1456,  # the CPU default: 1 GiB
)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(n)]


def probe_behind(
    kind: str, prompt: int, fraction: float | None = DEFAULT_FRACTION, seed: int = 0
) -> tuple[list[float], list[float]]:
    """One long request prefills ("background": P3; "plain": P1; "scoring": P1 with echo +
    logprobs and max_tokens 0) while realtime probes (64 prompt tokens) arrive at random, gaps
    of 0.05-0.6 s, and are added at the next step boundary (the server's engine thread takes
    commands between steps). Returns the probes' TTFTs, sorted, and every step's time once
    the step-time model is calibrated."""
    clock = ManualClock()
    ex = CostClockExecutor(clock, 1456, 16)
    sched = SchedulerConfig(
        max_num_seqs=64,
        max_num_batched_tokens=512,
        max_model_len=8192,
        p0_express="exclusive",
        step_time_fraction=fraction,
        check_invariants=True,
    )
    eng = EngineCore.build(ex, clock, CacheConfig(16, 1456), sched, PolicyConfig())
    rng = random.Random(seed)
    n = 0

    def request(tokens: int, prio: Priority, params: SamplingParams, at: float) -> Request:
        nonlocal n
        n += 1
        return Request(f"r{n}", _tokens(rng, tokens), params, priority=prio, arrival_time=at)

    for _ in range(MIN_OBSERVATIONS + 3):  # a few short requests first: the model calibrates
        eng.add_request(request(100, P1, SamplingParams(max_tokens=4, ignore_eos=True), 0.0))
    while eng.has_unfinished():
        eng.step()
    first_step = len(ex.step_seconds)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    if kind == "scoring":
        params = SamplingParams(max_tokens=0, prompt_logprobs=0)
    big = request(prompt, P3 if kind == "background" else P1, params, clock.now())
    eng.add_request(big)
    due = clock.now() + rng.uniform(0.05, 0.6)
    probes = []
    while not big.is_finished:
        while due <= clock.now():
            p = request(64, P0, SamplingParams(max_tokens=2, ignore_eos=True), due)
            eng.add_request(p)
            probes.append(p)
            due += rng.uniform(0.05, 0.6)
        eng.step()
    while eng.has_unfinished():
        eng.step()
    ttft = sorted(p.first_token_time - p.arrival_time for p in probes)
    return ttft, ex.step_seconds[first_step:]


BENCH = ClassSpec(LengthDist(158, 0.01, 158, 158), LengthDist(64, 0.01, 64, 64))


def bench_throughput(clients: int, fraction: float | None = DEFAULT_FRACTION) -> float:
    """Output tokens per second of `bench serve`'s throughput shape, closed loop."""
    cfg = replace(
        CPU,
        step_time_fraction=fraction,
        workload=WorkloadConfig(
            mix=(0, 1, 0, 0),
            classes=dict.fromkeys(Priority, BENCH),
            concurrency=clients,
            duration_s=120.0,
            warmup_s=20.0,
            vocab_size=49152,
        ),
    )
    r = run_simulation(cfg, keep_records=True)
    done = [x for x in r["records"] if x.finish is not None and 20 <= x.arrival < 120]
    return sum(x.output_tokens for x in done) / 100.0


# The CPU load generator's lengths (`bench serve --lengths cpu`).
CPU_LENGTHS = {
    P0: ClassSpec(LengthDist(60, 0.5, 16, 256), LengthDist(16, 0.5, 4, 64)),
    P1: ClassSpec(LengthDist(120, 0.6, 16, 512), LengthDist(32, 0.6, 4, 128)),
    P2: ClassSpec(LengthDist(80, 0.5, 16, 256), LengthDist(4, 0.6, 1, 16)),
    P3: ClassSpec(LengthDist(150, 0.5, 32, 512), LengthDist(96, 0.4, 16, 256)),
}
LONE = "lone"


class BurstThenLone(Workload):
    """An open loop for `burst_s` seconds, then nothing until a lone P1 "Hi" `late_s` later."""

    def __init__(self, cfg: WorkloadConfig, burst_s: float, late_s: float) -> None:
        super().__init__(cfg)
        self.burst_s, self.late_s, self._t = burst_s, late_s, 0.0

    def make(self, now: float) -> Request:
        if now < self.burst_s:
            return super().make(now)
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        return Request(LONE, [1000, 1001, 1002], params, priority=P1, arrival_time=now)

    def gap(self) -> float:
        last = self._t
        nxt = last + super().gap()
        if last < self.burst_s <= nxt:  # the burst is over: the lone request comes later
            nxt = self.burst_s + self.late_s
        elif last >= self.burst_s:
            nxt = math.inf
        self._t = nxt
        return nxt - last


def overload(seed: int = 0, burst_s: float = 30.0, late_s: float = 5.0) -> dict:
    """The issue's `serve --sla-admission on` probe: 20 P1 + 1 P0 a second, open loop, for
    `burst_s`, then a lone P1 `late_s` after. Returns the run's summary with its records."""
    cfg = with_sla_admission(
        replace(
            CPU,
            num_kv_blocks=4000,
            max_retries=0,
            workload=WorkloadConfig(
                mix=(1, 20, 0, 0),
                classes=CPU_LENGTHS,
                arrival="poisson",
                rate=21.0,
                duration_s=burst_s + late_s + 1.0,
                warmup_s=0.01,
                seed=seed,
                vocab_size=49152,
            ),
        )
    )
    return run_simulation(
        cfg, keep_records=True, workload=BurstThenLone(cfg.workload, burst_s, late_s)
    )


def on_time(records, prio: Priority, sla: float) -> tuple[float, int, int]:
    """(share of admitted requests of `prio` whose first token came within `sla`, admitted,
    sent)."""
    first = [r for r in records if r.priority == prio and r.first_token is not None]
    ok = sum(1 for r in first if r.first_token - r.arrival <= sla)
    sent = sum(1 for r in records if r.priority == prio)
    return (ok / len(first) if first else 0.0), len(first), sent


# 32 background streams of ~800-token unique prompts refill the whole 1,456-block cache in
# ~25 s; a realtime probe with a 512-token system prompt every 40 s.
FLOOD = dict(DEFAULT_CLASSES)
FLOOD[P3] = ClassSpec(LengthDist(800, 0.3, 200, 4000), LengthDist(16, 0.3, 4, 32))


def prefix_churn(retention: tuple[float, ...], every_s: float = 40.0) -> tuple[float, int]:
    """(P0 prefix hit rate, background requests completed) over 400 simulated seconds."""
    cfg = replace(
        CPU,
        max_num_seqs=32,
        prefix_retention=retention,
        workload=WorkloadConfig(
            mix=(0, 0, 0, 1),
            classes=FLOOD,
            concurrency=32,
            duration_s=400.0,
            warmup_s=10.0,
            seed=1,
            vocab_size=49152,
        ),
    )
    r = run_simulation(cfg, keep_records=True, workload=ProbedFlood(cfg.workload, every_s))
    done = sum(1 for x in r["records"] if x.priority == P3 and x.outcome == "completed")
    return r["prefix_hit_rate"]["P0"], done
