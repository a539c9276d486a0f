"""Issue 21 item 3: SLA admission under an open-loop overload. `serve --sla-admission on`, 20 P1
and 1 P0 requests a second for 30 s used to admit P1 requests that then ran 2-4x later than
predicted, let 12 of 18 P0 miss 0.5 s, and then lock every P1 out of the idle engine ("first
token predicted in inf s"). The predictor's rates must follow the load ahead, recover once the
engine is idle, and never predict infinity for an empty engine.

The scenario runs in the simulator on the CPU engine's step times (`cpu-local` profile,
SmolLM2-135M; the server's defaults: 64 seats, 512-token steps, exclusive express steps) with
the same admission, predictor, scheduler and re-check code as the server; then the meter and
the predictor are checked alone, and an open-loop overload goes through the HTTP server."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from types import SimpleNamespace

import httpx
import pytest

from tests.fake_engine import EOS, SlowFakeExecutor, tiny_tokenizer, words
from tests.server_utils import running_server
from tierserve.admission.engine_rate import EngineShape
from tierserve.admission.load_meter import LoadMeter
from tierserve.admission.sla import policy_for_sla_admission
from tierserve.admission.ttft import Load, predict_ttft
from tierserve.clock import WallClock
from tierserve.config import (
    AdmissionConfig,
    CacheConfig,
    PolicyConfig,
    PriorityConfig,
    SchedulerConfig,
)
from tierserve.core.preemption import PreemptionCosts
from tierserve.core.step_time import StepCoefficients
from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import BuiltEngine
from tierserve.engine.core import EngineCore
from tierserve.policies import create_policy
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams
from tierserve.sim.runner import SimConfig, run_simulation
from tierserve.sim.scenarios import with_sla_admission
from tierserve.sim.workload import ClassSpec, LengthDist, Workload, WorkloadConfig

P0, P1, P2, P3 = Priority
BURST_S, LATE_S = 30.0, 5.0

# The CPU load generator's lengths (`bench serve --lengths cpu`) for P0 and P1.
CPU_LENGTHS = {
    P0: ClassSpec(LengthDist(60, 0.5, 16, 256), LengthDist(16, 0.5, 4, 64)),
    P1: ClassSpec(LengthDist(120, 0.6, 16, 512), LengthDist(32, 0.6, 4, 128)),
    P2: ClassSpec(LengthDist(80, 0.5, 16, 256), LengthDist(4, 0.6, 1, 16)),
    P3: ClassSpec(LengthDist(150, 0.5, 32, 512), LengthDist(96, 0.4, 16, 256)),
}


class BurstThenHi(Workload):
    """The issue's open loop (20 P1 + 1 P0 a second) for `BURST_S`, then nothing until a lone
    P1 "Hi" `LATE_S` after the burst ends."""

    def make(self, now: float) -> Request:
        if now < BURST_S:
            return super().make(now)
        return Request(
            "hi",
            [1000, 1001, 1002],
            SamplingParams(max_tokens=8, ignore_eos=True),
            priority=P1,
            arrival_time=now,
        )

    def gap(self) -> float:
        g = super().gap()
        last = getattr(self, "_t", 0.0)
        nxt = last + g
        if last < BURST_S <= nxt:  # the burst is over: the lone request comes LATE_S later
            nxt = BURST_S + LATE_S
        elif last >= BURST_S:
            nxt = math.inf
        self._t = nxt
        return nxt - last


SCENARIO = with_sla_admission(
    SimConfig(
        hardware="cpu-local",
        model="smollm2-135m",
        tp=1,
        max_num_seqs=64,
        max_num_batched_tokens=512,
        p0_express="exclusive",
        swap_gib_per_device=0,
        num_kv_blocks=4000,
        max_retries=0,
        workload=WorkloadConfig(
            mix=(1, 20, 0, 0),
            classes=CPU_LENGTHS,
            arrival="poisson",
            rate=21.0,
            duration_s=BURST_S + LATE_S + 1.0,
            warmup_s=0.01,
            vocab_size=49152,
        ),
    )
)


def on_time(records, prio: Priority, sla: float) -> tuple[float, int, int]:
    first = [r for r in records if r.priority == prio and r.first_token is not None]
    ok = sum(1 for r in first if r.first_token - r.arrival <= sla)
    sent = sum(1 for r in records if r.priority == prio)
    return ok / len(first), len(first), sent


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_open_loop_overload_admits_only_what_it_serves_on_time_and_recovers(seed):
    cfg = replace(SCENARIO, workload=replace(SCENARIO.workload, seed=seed))
    r = run_simulation(cfg, keep_records=True, workload=BurstThenHi(cfg.workload))
    burst = [x for x in r["records"] if x.request_id != "hi"]
    p1, p1_admitted, p1_sent = on_time(burst, P1, 5.0)
    p0, p0_admitted, p0_sent = on_time(burst, P0, 0.5)
    assert p1_sent > 500 and p1_admitted > 100  # overloaded, and still serving
    assert p1 >= 0.95, f"admitted P1 on time: {p1:.1%}"
    assert p0 >= 0.99, f"admitted P0 on time: {p0:.1%}"
    assert p0_admitted == p0_sent  # realtime traffic alone never exceeds its SLA here
    # The predictor's error on admitted requests (it used to be 2-4x the prediction).
    errors = sorted(
        abs(x.first_token - x.arrival - x.predicted_ttft)
        for x in burst
        if x.priority == P1 and x.first_token is not None and x.predicted_ttft is not None
    )
    assert errors[int(0.9 * len(errors))] < 2.0
    hi = next(x for x in r["records"] if x.request_id == "hi")
    assert hi.arrival == pytest.approx(BURST_S + LATE_S)
    assert hi.outcome == "completed", "a lone P1 after the burst was refused"
    assert hi.first_token - hi.arrival < 1.0


# -- the meter and the predictor alone ----------------------------------------------------------


def test_the_measured_rate_fades_to_the_models_once_no_backlog_is_left():
    m = LoadMeter(seed_prefill_rate=2000.0, tau_s=5.0, recover_s=1.0)
    for i in range(100):  # an overload: 50 tokens/s get through while a queue waits
        m.on_step(0.5 * i, 0.5 * i + 0.5, 25, backlog=True)
    assert m.prefill_rate == pytest.approx(50.0, rel=0.05)
    assert m.prefill_rate_at(50.0, nominal=900.0) == m.prefill_rate  # still backlogged
    m.on_step(50.0, 50.5, 25, backlog=False)  # the queue drained at 50.0
    keep = math.exp(-0.5 / 1.0)
    assert m.prefill_rate_at(50.5, 900.0) == pytest.approx(keep * 50.0 + (1 - keep) * 900.0, 0.01)
    assert m.prefill_rate_at(55.5, 900.0) == pytest.approx(900.0, rel=0.01)
    assert m.prefill_rate_at(55.5, None) == m.prefill_rate  # no model: the measurement


COEF = StepCoefficients((0.03, 0.0014, 0.0009, 1.5e-5, 3.6e-7, 5e-5), calibrated=True)


def shape(**kw) -> EngineShape:
    base = dict(
        coef=COEF, bound_s=0.2, token_budget=512, max_num_seqs=64, decodes=0, decode_context=0
    )
    return EngineShape(**(base | kw))


def test_the_model_rate_falls_with_the_decodes_the_requests_ahead_will_add():
    busy = shape(decodes=40, decode_context=40 * 200, waiting_requests=(0, 20, 0, 0))
    busy = replace(busy, waiting_context=20 * 120, waiting_output=20 * 40)
    alone, ahead = busy.rate(0), busy.rate(20)
    assert alone is not None and ahead is not None and ahead < alone
    short = replace(busy, waiting_output=20 * 1)  # one-token outputs leave at once
    assert short.rate(20) == pytest.approx(busy.rate(1), rel=0.2)
    assert shape().rate(0) > alone  # an idle engine prefills fastest
    assert not replace(busy, coef=StepCoefficients()).rate(0)  # uncalibrated: no opinion


def test_a_full_engine_waits_for_seats_at_the_measured_rate_bounded_by_the_outputs_left():
    full = shape(decodes=64, decode_context=64 * 200, remaining_output=64 * 20, seat_rate=2.0)
    assert full.seat_wait(0) == pytest.approx(1 / 2.0)
    assert full.seat_wait(9) == pytest.approx(10 / 2.0)
    bounded = full.decodes / (2 * 20 * full.step_seconds(64))  # what 20 tokens left allow
    assert 2.0 < bounded < 1000.0
    fast = replace(full, seat_rate=1000.0)
    assert fast.seat_wait(9) == pytest.approx(10 / bounded)
    assert shape(decodes=10).seat_wait(20) == 0.0  # free seats


def test_an_empty_engine_never_predicts_an_infinite_wait():
    order = create_policy(PolicyConfig()).service_order()
    # After a burst: P0 measured arriving faster than the engine served, nothing left waiting.
    stale = Load(arrival_rate=(2000.0, 0, 0, 0), prefill_rate=1000.0, order=order)
    assert math.isfinite(predict_ttft(stale, P1, 10))
    stale = replace(stale, engine=shape())
    assert predict_ttft(stale, P1, 10) < 0.5


# -- through the server ------------------------------------------------------------------------

SERVER_SLA = PriorityConfig(ttft_sla_s=(0.5, 1.0, 60.0, None))


class TokenTimedExecutor(SlowFakeExecutor):
    """A fake executor whose steps take wall time like a small CPU model's: 5 ms a step, 0.2 ms
    a scheduled token, 1 ms a running request."""

    def execute(self, out):
        time.sleep(
            0.005 + 0.0002 * out.total_num_scheduled_tokens + 0.001 * len(out.num_scheduled_tokens)
        )
        return super().execute(out)


def overload_built() -> BuiltEngine:
    costs = PreemptionCosts(1.0, 1.0, prefill_tokens_per_s=4000.0)
    ex = TokenTimedExecutor(4096, 4, costs=costs)
    policy = policy_for_sla_admission(PolicyConfig())
    core = EngineCore.build(
        ex,
        WallClock(),
        CacheConfig(4, 4096),
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=4096),
        policy,
        SERVER_SLA,
    )
    args = EngineArgs(
        num_kv_blocks=4096,
        block_size=4,
        max_num_seqs=16,
        policy=policy,
        priorities=SERVER_SLA,
        admission=AdmissionConfig(sla_admission=True),
    )
    return BuiltEngine(
        core, tiny_tokenizer(), SimpleNamespace(eos_token_ids=(EOS,)), "fake", ex, args
    )


def test_open_loop_overload_through_the_server():
    """60 P1 and 4 P0 requests a second for 4 s at an engine that serves a fraction of them (the
    event loop sends on a fixed schedule, open loop), then a lone P1 2 s after."""
    built = overload_built()
    with running_server(built) as (url, _state):

        async def one(ac, i, prio, prompt, delay):
            await asyncio.sleep(delay)
            body = {"prompt": words(prompt, 3 * i), "max_tokens": 24, "priority": prio}
            sent = time.perf_counter()
            async with ac.stream(
                "POST", f"{url}/v1/completions", json={**body, "stream": True}
            ) as r:
                first = None
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data: {"):
                        first = time.perf_counter() - sent
                predicted = r.headers.get("x-tierserve-predicted-ttft-ms")
                return prio, r.status_code, first, predicted and int(predicted) / 1000

        async def scenario():
            async with httpx.AsyncClient(timeout=60) as ac:
                sends = [one(ac, i, 1, 40, i / 60) for i in range(240)]
                sends += [one(ac, 1000 + i, 0, 20, i / 4 + 0.1) for i in range(16)]
                burst = await asyncio.gather(*sends)
                lone = await one(ac, 5000, 1, 4, 2.0)
                return burst, lone

        burst, lone = asyncio.run(scenario())
    p1 = [(first, pred) for prio, code, first, pred in burst if prio == 1 and code == 200]
    refused = sum(1 for prio, code, *_ in burst if prio == 1 and code == 503)
    assert refused > 0 and len(p1) > 20  # overloaded, and still serving
    assert sum(1 for first, _ in p1 if first <= 1.0) >= 0.9 * len(p1)
    errors = sorted(abs(first - pred) for first, pred in p1 if pred is not None)
    assert errors[len(errors) // 2] < 0.3  # the median admitted request came when predicted
    p0 = [(code, first) for prio, code, first, _ in burst if prio == 0]
    assert all(code == 200 for code, _ in p0)
    assert sum(1 for _, first in p0 if first <= 0.5) >= 0.9 * len(p0)
    assert lone[1] == 200, "a lone P1 after the burst was refused"
