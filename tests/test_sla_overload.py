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
from tierserve.sim.promise import LONE, on_time, overload

P0, P1, P2, P3 = Priority
BURST_S, LATE_S = 30.0, 5.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_open_loop_overload_admits_only_what_it_serves_on_time_and_recovers(seed):
    r = overload(seed, BURST_S, LATE_S)
    burst = [x for x in r["records"] if x.request_id != LONE]
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
    hi = next(x for x in r["records"] if x.request_id == LONE)
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

SERVER_SLA = PriorityConfig(ttft_sla_s=(0.5, 2.0, 60.0, None))


class TokenTimedExecutor(SlowFakeExecutor):
    """A fake executor whose steps take wall time like a small CPU model's: 10 ms a step, 1 ms
    a scheduled token, 2 ms a running request (about 900 prompt tokens a second at best)."""

    def execute(self, out):
        n, seqs = out.total_num_scheduled_tokens, len(out.num_scheduled_tokens)
        time.sleep(0.010 + 0.001 * n + 0.002 * seqs)
        return super().execute(out)


def overload_built() -> BuiltEngine:
    costs = PreemptionCosts(1.0, 1.0, prefill_tokens_per_s=900.0)
    ex = TokenTimedExecutor(4096, 4, costs=costs)
    policy = policy_for_sla_admission(PolicyConfig())
    core = EngineCore.build(
        ex,
        WallClock(),
        CacheConfig(4, 4096),
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=128, max_model_len=4096),
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
    """40 P1 (100 prompt and 24 output tokens) and 2 P0 requests a second for 5 s, sent on a
    fixed schedule whatever the answers (open loop), at an engine that serves a fraction of
    them; then a lone P1 3 s after. P1's SLA is 2 s here, so that the event loop's own latency
    on a busy machine is small beside it. (Before issue 21: 12 of 22 admitted P1 on time.)"""
    built = overload_built()
    with running_server(built) as (url, _state):

        async def one(ac, i, prio, prompt, delay):
            await asyncio.sleep(delay)
            body = {"prompt": words(prompt, 3 * i), "max_tokens": 24, "priority": prio}
            sent = time.perf_counter()
            body["stream"] = True
            async with ac.stream("POST", f"{url}/v1/completions", json=body) as r:
                first = None
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data: {"):
                        first = time.perf_counter() - sent
                predicted = r.headers.get("x-tierserve-predicted-ttft-ms")
                return prio, r.status_code, first, predicted and int(predicted) / 1000

        async def scenario():
            async with httpx.AsyncClient(timeout=60) as ac:
                sends = [one(ac, i, 1, 100, i / 40) for i in range(200)]
                sends += [one(ac, 1000 + i, 0, 20, i / 2 + 0.1) for i in range(10)]
                burst = await asyncio.gather(*sends)
                lone = await one(ac, 5000, 1, 4, 3.0)
                return burst, lone

        burst, lone = asyncio.run(scenario())
    p1 = [(first, pred) for prio, code, first, pred in burst if prio == 1 and code == 200]
    refused = sum(1 for prio, code, *_ in burst if prio == 1 and code == 503)
    assert refused > 0 and len(p1) >= 10  # overloaded, and still serving
    # (>= 95% in the simulator, tests above; a loaded 2-core machine adds its own latency here)
    assert sum(1 for first, _ in p1 if first <= 2.0) >= 0.8 * len(p1)
    errors = sorted(abs(first - pred) for first, pred in p1 if pred is not None)
    assert errors[len(errors) // 2] < 0.5  # the median admitted request came when predicted
    p0 = [(code, first) for prio, code, first, _ in burst if prio == 0]
    assert all(code == 200 for code, _ in p0)
    assert sum(1 for _, first in p0 if first <= 0.5) >= 0.8 * len(p0)
    assert lone[1] == 200, "a lone P1 after the burst was refused"
