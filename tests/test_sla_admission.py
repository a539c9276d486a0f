"""SLA-feasibility admission (admission/sla.py): the decision and its Retry-After under a manual
clock, and the issue's properties: a client that obeys Retry-After gets in, P0 is never refused
because of lower classes, an admitted request is never ended while its prediction holds, and the
simulator's and the server's views of the engine give identical decisions."""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fake_engine import tiny_tokenizer
from tierserve.admission import AdmissionController
from tierserve.admission.sla import policy_for_sla_admission, retry_after_seconds
from tierserve.admission.ttft import Load, predict_ttft
from tierserve.clock import ManualClock
from tierserve.config import (
    AdmissionConfig,
    CacheConfig,
    ConfigError,
    PolicyConfig,
    PriorityConfig,
    SchedulerConfig,
)
from tierserve.core.preemption import PreemptionCosts
from tierserve.engine.async_engine import AsyncEngine
from tierserve.engine.core import EngineCore
from tierserve.engine.load import CoreQueueView, LateRequestCheck, measure_load
from tierserve.executor.fake import FakeExecutor
from tierserve.policies import create_policy
from tierserve.priority import Priority
from tierserve.request import EngineRequest, Request
from tierserve.sampling_params import SamplingParams

P0, P1, P2, P3 = Priority
STRICT = create_policy(PolicyConfig(name="hybrid", tenant_fairness=False)).service_order()


class LoadQueue:
    """A QueueView whose load the test sets (queue limits never bite)."""

    def __init__(self, load: Load) -> None:
        self.current = load

    def queue_depth(self, p):
        return 0

    def queued_tokens(self, p):
        return 0

    def can_shed(self, below):
        return False

    def dequeued(self, p):
        return (0, 0)

    def load(self):
        return self.current


def gate(load: Load, margin: float = 1.0, **kw):
    clock = ManualClock()
    q = LoadQueue(load)
    cfg = AdmissionConfig(sla_admission=True, sla_margin=margin, **kw)
    return AdmissionController(cfg, q, clock), q, clock


def busy(p1_waiting: int, rate: float = 1000.0, **kw) -> Load:
    return Load(waiting_tokens=(0, p1_waiting, 0, 0), prefill_rate=rate, order=STRICT, **kw)


def test_p1_predicted_late_is_refused_with_retry_after_from_the_drain_and_a_burst_spreads():
    ac, _q, _c = gate(busy(6000))
    d = ac.decide(P1, "t", 600, 500)  # (6000 + 500) / 1000 = 6.5 s > 5 s
    assert (d.admitted, d.status, d.error_type, d.code) == (
        False,
        503,
        "resource_exhausted",
        "sla_unreachable",
    )
    assert d.retry_after_s == pytest.approx(1.5)  # when the queue has drained to 5 s
    assert "5 s cannot be met" in d.reason and "6.50 s" in d.reason
    # The next refused client is told to come after the first one, who will be back first.
    assert ac.decide(P1, "t", 600, 500).retry_after_s == pytest.approx(2.0)
    assert ac.decide(P1, "t", 600, 500).retry_after_s == pytest.approx(2.5)
    assert ac.rejections[("sla_unreachable", P1)] == 3
    admitted = gate(busy(4000))[0].decide(P1, "t", 600, 500)
    assert admitted.admitted and admitted.predicted_ttft_s == pytest.approx(4.5)


def test_the_margin_is_a_factor_of_the_sla_and_p0_is_judged_on_its_sla_itself():
    assert not gate(busy(4000), margin=0.8)[0].decide(P1, "t", 600, 500).admitted  # 4.5 > 4
    assert gate(busy(4000), margin=1.0)[0].decide(P1, "t", 600, 500).admitted
    p0 = Load(waiting_tokens=(350, 0, 0, 0), prefill_rate=1000.0, order=STRICT)
    assert gate(p0, margin=0.5)[0].decide(P0, "t", 100, 100).admitted  # 0.45 s <= 0.5 s SLA
    with pytest.raises(ConfigError, match="sla_margin"):
        AdmissionConfig(sla_margin=0)


def test_opted_in_tenant_is_demoted_to_best_effort_instead_of_refused():
    ac, _q, _c = gate(busy(9000))
    d = ac.decide(P1, "t", 600, 500, demote_ok=True)
    assert d.admitted and d.priority == P3 and d.demoted_from == P1
    assert d.predicted_ttft_s is None  # best effort promises nothing
    assert ac.rejections[("sla_demoted", P1)] == 1
    late_p0 = Load(waiting_tokens=(9000, 0, 0, 0), prefill_rate=1000.0, order=STRICT)
    d0 = gate(late_p0)[0].decide(P0, "t", 600, 500, demote_ok=True)
    assert not d0.admitted and d0.code == "sla_unreachable"  # realtime is never demoted


def test_p3_always_queues_and_nothing_is_refused_before_a_rate_is_known():
    ac, _q, _c = gate(busy(10**7))
    assert ac.decide(P3, "t", 600, 500).admitted
    unknown = busy(10**7, rate=None)
    d = gate(unknown)[0].decide(P1, "t", 600, 500)
    assert d.admitted and d.predicted_ttft_s is None


def test_a_request_too_long_for_its_sla_on_an_idle_engine_is_judged_against_that_time():
    idle = Load(prefill_rate=1000.0, order=STRICT)
    d = gate(idle)[0].decide(P0, "t", 2000, 2000)  # 2 s alone: refusing would refuse forever
    assert d.admitted and d.predicted_ttft_s == pytest.approx(2.0)
    queued = replace(idle, waiting_tokens=(1000, 0, 0, 0))
    d = gate(queued)[0].decide(P0, "t", 2000, 2000)
    assert not d.admitted and d.retry_after_s == pytest.approx(1.0)


# -- properties ----------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    backlog=st.integers(5001, 40_000),
    prompts=st.lists(st.integers(16, 2000), min_size=1, max_size=12),
    rate=st.sampled_from([500.0, 1000.0, 3000.0]),
)
def test_clients_that_obey_retry_after_are_admitted_when_nothing_new_arrives(
    backlog, prompts, rate
):
    """A burst of refused P1 clients, each retrying after the (whole-second) Retry-After it was
    told, into a queue that drains at the predicted rate with no other arrivals: every retry is
    admitted."""
    backlog = int(backlog * rate / 1000)  # 5 to 40 s of work
    ac, q, clock = gate(busy(backlog, rate))
    retries = []
    for i, p in enumerate(prompts):
        d = ac.decide(P1, "t", p, p)
        if not d.admitted:
            retries.append((retry_after_seconds(d.retry_after_s), i, p))
    assert retries  # at least the first is refused: 5 s of work is already waiting
    queue, last = float(backlog), 0.0
    for t, _i, p in sorted(retries):
        clock.set(float(t))
        queue = max(0.0, queue - rate * (t - last))  # FIFO fluid drain
        last = t
        q.current = busy(round(queue), rate)
        d = ac.decide(P1, "t", p, p)
        assert d.admitted, f"retry at {t} s refused: {d.reason}"
        queue += p


@settings(max_examples=200, deadline=None)
@given(
    waiting=st.tuples(*(st.integers(0, 20_000) for _ in range(4))),
    running=st.tuples(*(st.integers(0, 5000) for _ in range(4))),
    policy=st.sampled_from(["hybrid", "fcfs", "drr", "wfq", "strict"]),
    prompt=st.integers(1, 2000),
)
def test_p0_is_never_refused_because_lower_classes_wait(waiting, running, policy, prompt):
    order = create_policy(PolicyConfig(name=policy)).service_order()
    load = Load(waiting, running_prefill=running, prefill_rate=2000.0, step_s=0.1, order=order)
    alone = Load((waiting[0], 0, 0, 0), running_prefill=(running[0], 0, 0, 0), **_rate_of(load))
    d = gate(load)[0].decide(P0, "t", prompt, prompt)
    assert d.admitted == gate(alone)[0].decide(P0, "t", prompt, prompt).admitted
    if predict_ttft(alone, P0, prompt) <= 0.5:  # its own class fits its SLA: admitted
        assert d.admitted


def _rate_of(load: Load) -> dict:
    return {"prefill_rate": load.prefill_rate, "step_s": load.step_s, "order": load.order}


class FluidExecutor(FakeExecutor):
    """Computes `rate` tokens per second, exactly: a step of n tokens takes n / rate on the
    manual clock. With one output token per request, the engine serves work exactly at the
    rate the predictor is told: the prediction holds."""

    def __init__(self, clock: ManualClock, rate: float) -> None:
        costs = PreemptionCosts(
            kv_bytes_per_block=1.0, swap_bytes_per_s=1.0, prefill_tokens_per_s=rate
        )
        super().__init__(4096, 16, costs=costs)
        self.clock, self.rate = clock, rate

    def execute(self, out):
        self.clock.advance(out.total_num_scheduled_tokens / self.rate)
        return super().execute(out)


def fluid_engine(rate: float, budget: int, clock: ManualClock, policy: str = "hybrid"):
    return EngineCore.build(
        FluidExecutor(clock, rate),
        clock,
        CacheConfig(16, 4096),
        SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=budget, max_model_len=4096),
        policy_for_sla_admission(PolicyConfig(name=policy)),  # as SLA admission runs it
    )


def request(rid: str, prio: Priority, n: int, tenant: str, now: float) -> Request:
    salt = zlib.crc32(rid.encode())  # a prompt of its own: no prefix-cache hits
    return Request(
        rid,
        [1 + (salt + i) % 900 for i in range(n)],
        SamplingParams(max_tokens=1, ignore_eos=True),
        priority=prio,
        tenant=tenant,
        arrival_time=now,
        end_if_late=True,
    )


@settings(max_examples=40, deadline=None)
@given(
    backlog=st.lists(
        st.tuples(st.integers(16, 900), st.sampled_from(["a", "b"]), st.sampled_from([1, 2])),
        min_size=1,
        max_size=60,
    ),
    later=st.lists(
        st.tuples(st.integers(16, 900), st.sampled_from([(1, "a"), (3, "b")])),
        max_size=10,
    ),
    prompt=st.integers(16, 900),
    rate=st.sampled_from([4000.0, 8000.0]),
    budget=st.sampled_from([64, 256]),
)
def test_an_admitted_request_is_never_ended_while_its_prediction_holds(
    backlog, later, prompt, rate, budget
):
    """The real scheduler on an engine that computes exactly `rate` tokens per second (so the
    prediction holds: no work comes ahead of the request, the rate is what was measured); all
    requests opted in to being ended early. The admitted P1 request is never ended by the
    re-check, and its first token comes when predicted (within the service quantum: fair
    queueing serves whole requests, so one request of each lane it shares with may come
    first; the slack between the admission limit, 0.8 x SLA, and the end, at the SLA, is meant
    to cover that, so requests here are short for the rate, as in the seed table)."""
    clock = ManualClock()
    core = fluid_engine(rate, budget, clock)
    for i, (n, tenant, prio) in enumerate(backlog):
        core.add_request(request(f"b{i}", Priority(prio), n, tenant, 0.0))
    core.step()  # the queue is in the engine, one step measured
    adm = AdmissionController(AdmissionConfig(sla_admission=True), CoreQueueView(core), clock)
    now = clock.now()
    d = adm.decide(P1, "a", prompt + 1, prompt)
    if not d.admitted:
        return
    mine = request("mine", P1, prompt, "a", now)
    core.add_request(mine)
    # Later arrivals that go behind it: its own tenant's in its class, and best effort (a P2
    # arrival would take P2's fair share: new work ahead, the prediction would not hold).
    for j, (n, (prio, tenant)) in enumerate(later):
        core.add_request(request(f"l{j}", Priority(prio), n, tenant, now))
    check = LateRequestCheck(PriorityConfig(), margin=1.0, every_s=0.0)
    while mine.first_token_time is None:
        ended = [r.request_id for r, _late, _msg in check.poll(core)]
        assert "mine" not in ended, f"ended at {clock.now():.2f} s, predicted {d.predicted_ttft_s}"
        for rid in ended:
            core.fail_request(rid, "late")
        core.step()
    # Fair queueing serves whole requests: besides a step, one request of each lane it shares
    # with (the other class, the other tenant) may come first.
    quantum = 2 * max(n for n, *_ in backlog) / rate + budget / rate
    assert mine.first_token_time - now <= d.predicted_ttft_s + quantum + 1e-9


@settings(max_examples=40, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(
            st.sampled_from(list(Priority)), st.integers(16, 1500), st.sampled_from(["a", "b", "c"])
        ),
        min_size=1,
        max_size=40,
    ),
    policy=st.sampled_from(["hybrid", "fcfs", "wfq"]),
    steps_every=st.integers(1, 6),
)
def test_the_simulator_and_the_server_decide_identically(reqs, policy, steps_every):
    """The same engine read two ways: straight (the simulator's CoreQueueView) and through the
    engine thread's published snapshot (the server's view, with the submission in between):
    every decision is the same, predicted TTFT included."""
    clock = ManualClock()
    core = fluid_engine(2000.0, 256, clock, policy)
    cfg = AdmissionConfig(sla_admission=True, sla_margin=0.8)
    sim = AdmissionController(cfg, CoreQueueView(core), clock)
    engine = AsyncEngine(core, tiny_tokenizer())
    server = AdmissionController(cfg, engine.view, clock)

    async def run():
        for i, (prio, n, tenant) in enumerate(reqs):
            a = sim.decide(prio, tenant, n + 1, n)
            b = server.decide(prio, tenant, n + 1, n)
            # (The server's queue depth leaves out requests a free seat takes at once.)
            assert replace(a, queue_depth=0) == replace(b, queue_depth=0)
            if a.admitted:
                req = request(f"r{i}", a.priority, n, tenant, clock.now())
                engine.submit(EngineRequest(**_args(req)))  # the event loop's side
                assert server.queue.load().waiting_tokens == measure_load_after(core, req)
                engine._drain_commands()  # the engine thread takes it in...
                engine._publish()  # ...and publishes
            if i % steps_every == 0:
                core.step()
                engine._publish()

    asyncio.run(run())


def _args(req: Request) -> dict:
    return {f.name: getattr(req, f.name) for f in dataclasses.fields(EngineRequest)}


def measure_load_after(core: EngineCore, req: Request) -> tuple[int, ...]:
    """Waiting tokens once `req` (submitted, not yet taken in) is in the engine."""
    w = list(measure_load(core).waiting_tokens)
    w[req.priority] += req.num_tokens
    return tuple(w)
